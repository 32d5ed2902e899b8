//! The live members of a process group, read from `/proc`.
//!
//! `killpg(group, 0)` also succeeds for zombies, which run nothing and which nobody may
//! ever reap (on machines whose init does not); this scan leaves them out.

use nix::unistd::Pid;

/// Live processes (not zombies) in process group `group`, except `except`.
pub(crate) fn members(group: Pid, except: Option<Pid>) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw)
        .filter(|&pid| Some(pid) != except)
        .filter(|&pid| live_member(pid, group))
        .collect()
}

/// Whether `pid` runs (is not a zombie) and belongs to `group`.
fn live_member(pid: Pid, group: Pid) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    parse_stat(&stat).is_some_and(|(state, pgrp)| pgrp == group.as_raw() && !is_dead(state))
}

/// `(state, process group)` from a `/proc/PID/stat` line. The command name (field 2, in
/// parentheses) may itself contain spaces and parentheses, so fields are counted from
/// the last `)`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

fn is_dead(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "42 (a) b (c) S 1 42 42 0 -1 4194560";
        assert_eq!(parse_stat(line), Some(('S', 42)));
        assert_eq!(parse_stat("42 (x) Z 1 7 7"), Some(('Z', 7)));
        assert_eq!(parse_stat("garbage"), None);
        assert!(is_dead('Z') && !is_dead('T'));
    }

    #[test]
    fn this_process_is_a_live_member_of_its_own_group() {
        let me = nix::unistd::getpid();
        let group = nix::unistd::getpgrp();
        assert!(members(group, None).contains(&me));
        assert!(!members(group, Some(me)).contains(&me));
    }
}
