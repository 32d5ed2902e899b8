//! The permission rules on real paths this process makes (as root, or as any user: the
//! files are its own), one rule per case.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::*;

struct Temp(PathBuf);

impl Temp {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("anylock-rules-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).expect("mkdir");
        Self(dir)
    }

    fn with_mode(&self, name: &str, dir: bool, mode: u32) -> PathBuf {
        let path = self.0.join(name);
        if dir {
            std::fs::create_dir(&path).expect("mkdir");
        } else {
            std::fs::write(&path, b"").expect("write");
        }
        std::fs::set_permissions(&path, Permissions::from_mode(mode)).expect("chmod");
        path
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn judged(trust: &Trust, path: &Path, role: Role) -> Result<(), Refusal> {
    trust.judge(&fs::symlink_metadata(path).expect("lstat"), role)
}

/// Guards against a private store accepting what another user could change: group- or
/// world-writable files and directories (a sticky bit saves only a directory above the
/// store's), links, and a file where a directory belongs.
#[test]
fn a_private_store_takes_only_what_nobody_else_can_write() {
    let temp = Temp::new();
    let trust = Trust::new(&temp.0, None).expect("private");
    let file = |mode| temp.with_mode(&format!("f{mode:o}"), false, mode);
    let dir = |mode| temp.with_mode(&format!("d{mode:o}"), true, mode);
    let private = file(0o600);
    assert_eq!(judged(&trust, &private, Role::Database), Ok(()));
    assert_eq!(
        judged(&trust, &file(0o644), Role::Database),
        Ok(()),
        "readable is ours to tighten"
    );
    for mode in [0o620, 0o602, 0o666] {
        assert_eq!(
            judged(&trust, &file(mode), Role::Database),
            Err(Refusal::WritableByOthers { mode })
        );
    }
    let sticky = dir(0o1777);
    assert_eq!(
        judged(&trust, &sticky, Role::Directory),
        Err(Refusal::WritableByOthers { mode: 0o1777 })
    );
    // A store in /tmp: the advice is a directory of one's own, never a chmod of /tmp.
    let advice = Refusal::WritableByOthers { mode: 0o1777 }.to_string();
    assert!(
        !advice.contains("chmod") && advice.contains("a directory only you can write"),
        "{advice}"
    );
    let advice = Refusal::WritableByOthers { mode: 0o775 }.to_string();
    assert!(advice.contains("chmod go-w"), "{advice}");
    assert_eq!(
        judged(&trust, &sticky, Role::Ancestor),
        Ok(()),
        "sticky, like /tmp"
    );
    assert_eq!(
        judged(&trust, &dir(0o777), Role::Ancestor),
        Err(Refusal::WritableByOthers { mode: 0o777 })
    );
    assert_eq!(
        judged(&trust, &dir(0o775), Role::Holders),
        Err(Refusal::WritableByOthers { mode: 0o775 })
    );
    assert_eq!(
        judged(&trust, &private, Role::Holders),
        Err(Refusal::WrongType { directory: true })
    );
    assert_eq!(
        judged(&trust, &dir(0o700), Role::Liveness),
        Err(Refusal::WrongType { directory: false })
    );
    let link = temp.0.join("link");
    std::os::unix::fs::symlink(&private, &link).expect("symlink");
    assert_eq!(judged(&trust, &link, Role::Database), Err(Refusal::Symlink));
}

/// Guards against a group store that is not the group's, is world-writable, or has a
/// directory without the setgid bit (members' files would not be the group's).
#[test]
fn a_group_store_is_the_groups_and_never_world_writable() {
    let temp = Temp::new();
    let me = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let trust = Trust {
        me,
        group: Some(("ours".into(), gid)),
    };
    let other_group = Trust {
        me,
        group: Some(("theirs".into(), gid.wrapping_add(4242))),
    };
    let db = temp.with_mode("db", false, 0o660);
    assert_eq!(judged(&trust, &db, Role::Database), Ok(()));
    assert!(matches!(
        judged(&other_group, &db, Role::Database),
        Err(Refusal::WrongGroup { .. })
    ));
    let wide = temp.with_mode("wide", false, 0o666);
    assert_eq!(
        judged(&trust, &wide, Role::Database),
        Err(Refusal::WritableByOthers { mode: 0o666 })
    );
    let dir = temp.with_mode("dir", true, 0o2770);
    assert_eq!(judged(&trust, &dir, Role::Directory), Ok(()));
    let plain = temp.with_mode("plain", true, 0o770);
    assert_eq!(
        judged(&trust, &plain, Role::Holders),
        Err(Refusal::NotSetgid)
    );
    assert_eq!(
        judged(&trust, &plain, Role::Ancestor),
        Ok(()),
        "the group may write above"
    );
}

/// Entries anylock makes are private whatever the umask, and an existing store file of
/// ours that an older version left readable to everyone is tightened.
#[test]
fn made_entries_are_private_and_old_ones_are_tightened() {
    let temp = Temp::new();
    let trust = Trust::new(&temp.0, None).expect("private");
    let dir = temp.0.join("a/b");
    trust.make_dirs(&dir).expect("make");
    for made in [temp.0.join("a"), dir.clone()] {
        let mode = fs::metadata(&made).expect("stat").mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", made.display());
    }
    let db = dir.join("db");
    trust.make_database(&db).expect("make");
    assert_eq!(fs::metadata(&db).expect("stat").mode() & 0o777, 0o600);
    fs::set_permissions(&db, Permissions::from_mode(0o644)).expect("chmod");
    trust.check(&db, Role::Database).expect("fit");
    assert_eq!(
        fs::metadata(&db).expect("stat").mode() & 0o777,
        0o600,
        "tightened"
    );
}
