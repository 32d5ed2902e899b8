//! Keeping the backend's secrets from the locked command and from other users.
//!
//! The locked command runs as the same user as `anylock`, and a process may read a lot of
//! another process of its user: `/proc/PID/environ` (the environment `anylock` was started
//! with, `ANYLOCK_BACKEND` and its password included, whatever `anylock` does to its own
//! variables later), `/proc/PID/mem`, `/proc/PID/fd/*`, and ptrace. [`hide_this_process`]
//! closes those to every process without `CAP_SYS_PTRACE`. The supervisor, started by exec,
//! is readable again, but holds no secret: its environment has `ANYLOCK_BACKEND` redacted
//! (`watch.rs`), its arguments are the plan, and it opens no file (its sockets are tokio's
//! signal pipe).
//!
//! Every user may read every process's command line (`/proc/PID/cmdline`, `ps`), so a URL
//! with a secret is refused as an argument ([`refuse_on_command_line`]).
//!
//! Descriptors: everything `anylock` opens (std, tokio, the database drivers, SQLite) is
//! close-on-exec, except the embedded backend's liveness file, which the command inherits by
//! design (backend-local's `liveness.rs`) and which holds nothing.

use lockcore::Error;

/// Makes this process's environment, memory and descriptors unreadable by other processes
/// of the same user, and ptrace refused (`PR_SET_DUMPABLE` 0, which also disables core
/// dumps). Called first thing, before anything reads a secret.
///
/// What it changes for `anylock`'s own reads of `/proc`: its files under `/proc/self` are
/// owned by root from now on. A process may still read its own `stat`, `fd/` and `exe`, and
/// `timens_offsets` (mode 0644, read by the embedded backend), and any process's `stat` (the
/// group scan in `group.rs`); only its own `environ` (mode 0400) becomes unreadable, and
/// nothing reads it (the environment comes from libc).
pub(crate) fn hide_this_process() {
    if let Err(err) = nix::sys::prctl::set_dumpable(false) {
        note!(
            "anylock: warning: cannot hide this process from the command (prctl \
             PR_SET_DUMPABLE: {err}); the command may read ANYLOCK_BACKEND's password from \
             /proc"
        );
    }
}

/// Refuses `url`, given on the command line as `what`, when it holds a password or a
/// secret parameter ([`anylock::holds_secret`]): every user of the machine can read a
/// command line for as long as the process runs.
pub(crate) fn refuse_on_command_line(what: &str, url: &str) -> Result<(), Error> {
    if !anylock::holds_secret(url) {
        return Ok(());
    }
    Err(Error::invalid_input(format!(
        "{what} {}: the URL holds a password or a secret parameter, and a command \
         line is readable by every user of this machine (ps, /proc/PID/cmdline); set it in \
         ANYLOCK_BACKEND or in the config file (`backend = \"...\"`, chmod 600) instead",
        anylock::redact(url)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_urls_with_a_secret_are_refused() {
        for url in [
            "redis://:hunter2@h:1/0",
            "postgres://u:hunter2@db/x",
            "postgres://db/x?password=hunter2",
            "etcd://h:2379/p?pasword=hunter2",
        ] {
            let err = refuse_on_command_line("--backend", url).expect_err(url);
            assert_eq!(err.kind(), lockcore::ErrorKind::InvalidInput);
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let mtls = "etcds://h/p?ca=/ca.pem&cert=/c.pem&key=/k.pem";
        for url in [
            "redis://h:1/0",
            "postgres://u@db/x",
            "local:",
            "gs://b/p",
            mtls,
        ] {
            refuse_on_command_line("--backend", url).expect(url);
        }
    }
}
