//! The config file, end to end: a FIFO (given with `--config` or found at the default
//! path) is refused at once with exit code 2 instead of hanging `anylock`, and a password
//! in a file that group or others can read is refused with the `chmod 600` fix.

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Output, Stdio};
use std::time::Duration;

use support::{Scene, code, wait_child};

fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(made.success());
}

/// `anylock args` (no ANYLOCK_BACKEND), failing the test if it runs 10 s.
fn run_bounded(scene: &Scene, args: &[&str]) -> Output {
    let mut child = scene
        .command(args)
        .env_remove("ANYLOCK_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn anylock");
    wait_child(&mut child, Duration::from_secs(10));
    child.wait_with_output().expect("output")
}

#[test]
fn a_fifo_as_the_config_file_is_refused_at_once() {
    let scene = Scene::local();
    let fifo = scene.path("given.toml");
    mkfifo(&fifo);
    let default = scene.path("anylock/config.toml"); // XDG_CONFIG_HOME is the scene's dir
    std::fs::create_dir_all(default.parent().expect("dir")).expect("mkdir");
    mkfifo(&default);
    for args in [
        &["--config", &fifo.to_string_lossy(), "status", "job"][..],
        &["status", "job"][..],
    ] {
        let out = run_bounded(&scene, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_password_in_a_config_file_others_can_read_is_refused() {
    let scene = Scene::local();
    let secret = "config-secret-81f3a9";
    let path = scene.path("config.toml");
    let text = format!("backend = \"redis://:{secret}@127.0.0.1:1/0\"\n");
    std::fs::write(&path, text).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let args = ["--config", &path.to_string_lossy(), "status", "job"];
    let out = run_bounded(&scene, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(
        stderr.contains(&format!("chmod 600 {}", path.display())),
        "{stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = run_bounded(&scene, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        code(&out),
        125,
        "owner-only: used (nothing listens): {stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
}
