//! Text that another holder planted in the store, or that a server sent in an error reply,
//! reaches no terminal raw: a window-title escape (`\x1b]0;pwned\x07`) and a clear-screen
//! (`\x1b[2J`) in an owner or an error text come out of every path anylock prints (the
//! "lock lost … taken over by OWNER" line, the held error, tracing's `-vv` log lines,
//! `status`, `break`, a connect error) with no ESC or BEL byte left.

mod support;

use std::io::{Read as _, Write as _};
use std::process::{Command, Output};
use std::time::Duration;

use support::{Scene, code, wait_child, wait_until};

/// What a hostile holder writes as its owner: retitle the window, clear the screen.
const PLANTED: &str = "evil\x1b]0;pwned\x07\x1b[2J";

/// Fails when `out` holds an ESC or BEL byte; `must_show` must appear (the planted text
/// did reach the output, cleaned), so the check cannot pass by printing nothing.
fn assert_clean(what: &str, out: &Output, must_show: &str) {
    let all = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let text = String::from_utf8_lossy(&all);
    assert!(
        !all.contains(&0x1b) && !all.contains(&0x07),
        "{what}: a terminal escape reached the output:\n{text:?}"
    );
    assert!(
        text.contains(must_show),
        "{what}: {must_show:?} is missing from the output:\n{text}"
    );
}

/// The value of the URL parameter `key` in `url`.
fn param<'a>(url: &'a str, key: &str) -> &'a str {
    let start = url.find(&format!("{key}=")).expect("parameter") + key.len() + 1;
    let rest = &url[start..];
    &rest[..rest.find('&').unwrap_or(rest.len())]
}

/// Overwrites the holder of `name` with [`PLANTED`], as another program with write access
/// to the store could, for a minute.
fn plant(scene: &Scene, name: &str) {
    let status = if scene.backend.starts_with("redis") {
        let url = std::env::var("ANYLOCK_TEST_REDIS_URL").expect("redis url");
        let key = format!("{{{}:{name}}}:lock", param(&scene.backend, "prefix"));
        // The backend's value layout: token, acquired (unix ms), nonce, owner.
        let value = format!("999:1700000000000:abcdef:{PLANTED}");
        Command::new("redis-cli")
            .args(["-u", &url, "SET", &key, &value, "PX", "60000"])
            .output()
    } else {
        let url = std::env::var("ANYLOCK_TEST_POSTGRES_URL").expect("postgres url");
        let sql = format!(
            "UPDATE {}.leases SET owner = E'evil\\033]0;pwned\\007\\033[2J', \
             expires_at = now() + interval '1 minute' WHERE name = '{name}'",
            param(&scene.backend, "schema")
        );
        Command::new("psql")
            .args([url.as_str(), "-v", "ON_ERROR_STOP=1", "-c", &sql])
            .output()
    };
    let out = status.expect("run the store's client");
    assert!(
        out.status.success(),
        "planting failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A holder's lease is taken over by a planted owner while `run -vv` holds it: the loss
/// line and the log lines show the owner cleaned; so do `status`, a `run -n` refused as
/// held, and `break`.
fn a_planted_owner_reaches_no_terminal_raw(scene: &Scene) {
    let mut holder = scene.spawn(&["-vv", "run", "job", "--ttl", "3s", "--", "sleep", "30"]);
    wait_until(Duration::from_secs(10), "the lock to be held", || {
        code(&scene.output(&["status", "job"])) == 0
    });
    plant(scene, "job");
    let status = wait_child(&mut holder, Duration::from_secs(15));
    let out = holder.wait_with_output().expect("output");
    assert_eq!(
        status.code(),
        Some(122),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_clean("the loss line and -vv logs of run", &out, "pwned");

    let out = scene.output(&["-vv", "status", "job"]);
    assert_eq!(code(&out), 0);
    assert_clean("status", &out, "pwned");
    let out = scene.output(&["-vv", "run", "job", "-n", "--", "true"]);
    assert_eq!(code(&out), 123);
    assert_clean("run -n, held", &out, "pwned");
    let out = scene.output(&["-vv", "break", "job", "--yes"]);
    assert_eq!(code(&out), 0);
    assert_clean("break", &out, "pwned");
}

mod postgres {
    #[test]
    fn a_planted_owner_reaches_no_terminal_raw() {
        if let Some(scene) = super::Scene::postgres() {
            super::a_planted_owner_reaches_no_terminal_raw(&scene);
        }
    }
}

mod redis {
    #[test]
    fn a_planted_owner_reaches_no_terminal_raw() {
        if let Some(scene) = super::Scene::redis() {
            super::a_planted_owner_reaches_no_terminal_raw(&scene);
        }
    }
}

/// PostgreSQL's error reply repeats the role name it was given: a role named with escapes
/// makes the server's own text carry them.
#[test]
fn a_postgres_error_text_reaches_no_terminal_raw() {
    let Some(scene) = Scene::postgres() else {
        return;
    };
    let url = std::env::var("ANYLOCK_TEST_POSTGRES_URL").expect("postgres url");
    let evil = url.replacen("postgres@", "ev%1B%5D0%3Bpwned%07%1B%5B2Jil@", 1);
    let out = scene
        .command(&["-vvv", "status", "job"])
        .env("ANYLOCK_BACKEND", &evil)
        .output()
        .expect("run anylock");
    assert_eq!(code(&out), 125, "{}", String::from_utf8_lossy(&out.stderr));
    assert_clean("a PostgreSQL error reply", &out, "pwned");
}

/// A Redis-speaking server whose every reply is an error with escapes in its text.
#[test]
fn a_redis_error_text_reaches_no_terminal_raw() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0; 4096];
                while let Ok(n @ 1..) = stream.read(&mut buf) {
                    // One error per command: a pipeline of several gets as many replies.
                    let commands = commands_in(&buf[..n]);
                    let reply = format!("-ERR {PLANTED} says the server\r\n").repeat(commands);
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let scene = Scene::local();
    let out = scene
        .command(&["-vvv", "status", "job"])
        .env("ANYLOCK_BACKEND", format!("redis://127.0.0.1:{port}/0"))
        .output()
        .expect("run anylock");
    assert_ne!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_clean("a Redis error reply", &out, "pwned");
}

/// How many RESP commands (arrays: a `*` at the start of a line) `bytes` holds, at least 1.
fn commands_in(bytes: &[u8]) -> usize {
    let starts = bytes.windows(3).filter(|w| w == b"\r\n*").count();
    (starts + usize::from(bytes.first() == Some(&b'*'))).max(1)
}

/// On a terminal, the waiting line is rewritten in place with anylock's own control
/// (`\r\x1b[2K`), which still reaches the terminal, while the planted holder it names
/// does not. `script` gives `anylock` a terminal.
#[test]
fn the_live_waiting_line_keeps_its_own_control_and_cleans_the_holder() {
    let Some(scene) = Scene::redis() else {
        return;
    };
    let url = std::env::var("ANYLOCK_TEST_REDIS_URL").expect("redis url");
    let key = format!("{{{}:job}}:lock", param(&scene.backend, "prefix"));
    let value = format!("999:1700000000000:abcdef:{PLANTED}");
    let planted = Command::new("redis-cli")
        .args(["-u", &url, "SET", &key, &value, "PX", "2500"])
        .output()
        .expect("redis-cli");
    assert!(planted.status.success());
    let line = format!("{} run job -w 20 -- true", support::BIN);
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("ANYLOCK_BACKEND", &scene.backend)
        .env_remove("ANYLOCK_CONFIG")
        .env("XDG_CONFIG_HOME", &scene.dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script");
    let all = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{all:?}");
    assert!(
        all.contains("\r\x1b[2Kwaiting for job, held by evil\u{fffd}]0;pwned"),
        "the live line: {all:?}"
    );
    let planted_escapes = ["\x1b]", "\x07", "\x1b[2J"];
    for escape in planted_escapes {
        assert!(
            !all.contains(escape),
            "{escape:?} reached the terminal: {all:?}"
        );
    }
}

/// `check` prints who the server says we are (`ACL WHOAMI`): a server answering with
/// escapes gets them printed cleaned on stdout too. A Redis-speaking server that answers
/// just enough for `check` to get that far: PING, CONFIG GET, ACL WHOAMI.
#[test]
fn check_prints_the_identity_a_server_reports_cleaned() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || serve_whoami(stream));
        }
    });
    let scene = Scene::local();
    let out = scene
        .command(&["check"])
        .env("ANYLOCK_BACKEND", format!("redis://127.0.0.1:{port}/0"))
        .output()
        .expect("run anylock");
    assert_clean("check's security line", &out, "pwned");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("security:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Answers each RESP command read from `stream` by its name.
fn serve_whoami(mut stream: std::net::TcpStream) {
    let mut pending = Vec::new();
    let mut buf = [0; 65536];
    while let Ok(n @ 1..) = stream.read(&mut buf) {
        pending.extend_from_slice(&buf[..n]);
        let mut replies = String::new();
        while let Some((name, used)) = next_command(&pending) {
            pending.drain(..used);
            replies.push_str(&match name.to_ascii_uppercase().as_str() {
                "PING" => "+PONG\r\n".to_owned(),
                "CONFIG" => "*4\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n$16\r\nmaxmemory-policy\r\n\
                             $10\r\nnoeviction\r\n"
                    .to_owned(),
                "ACL" => format!("+{PLANTED}\r\n"),
                _ => "-ERR unsupported here\r\n".to_owned(),
            });
        }
        if stream.write_all(replies.as_bytes()).is_err() {
            return;
        }
    }
}

/// The name of the first complete RESP command in `bytes` and how many bytes it takes.
fn next_command(bytes: &[u8]) -> Option<(String, usize)> {
    let line = |at: usize| -> Option<(&[u8], usize)> {
        let end = at + bytes.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        Some((&bytes[at..end], end + 2))
    };
    let number = |text: &[u8]| std::str::from_utf8(text).ok()?.parse::<usize>().ok();
    let (head, mut at) = line(0)?;
    let count = number(head.strip_prefix(b"*")?)?;
    let mut name = None;
    for _ in 0..count {
        let (len, start) = line(at)?;
        let len = number(len.strip_prefix(b"$")?)?;
        let arg = bytes.get(start..start + len)?;
        name.get_or_insert_with(|| String::from_utf8_lossy(arg).into_owned());
        at = start + len + 2;
    }
    (at <= bytes.len()).then(|| (name.unwrap_or_default(), at))
}
