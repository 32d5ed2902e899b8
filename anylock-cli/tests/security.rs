//! The security matrix of issue #19, end to end: every network backend with TLS and
//! authentication (`scripts/servers`' `secure` variants) × {right credentials, wrong
//! password, untrusted server certificate, missing client certificate, a TLS parameter on a
//! plaintext URL, a misspelled parameter, nothing listening}. Each case asserts the exit
//! code and words of `anylock run` at the highest verbosity, and that neither the password
//! nor the wrong one tried appears in any output stream or in the locked command's
//! environment (the command prints it).

mod support;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::BIN;

/// Exit codes (see `anylock --help`).
const OK: i32 = 0;
const USAGE: i32 = 2;
const FAILED: i32 = 125;

/// What `scripts/servers` exported for the secure servers.
struct Secure {
    dir: String,
    user: String,
    password: String,
    redis: u16,
    postgres: u16,
    etcd: u16,
}

impl Secure {
    /// `None` (skip, loudly) outside CI without the servers; a failure in CI.
    fn from_env() -> Option<Self> {
        let dir = test_kit::env::require("ANYLOCK_TEST_SECURE_DIR", "the secure servers")?;
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set with the rest"))
        };
        let port = |name: &str| var(name).parse().expect("a port");
        Some(Self {
            dir,
            user: var("ANYLOCK_TEST_SECURE_USER"),
            password: var("ANYLOCK_TEST_SECURE_PASSWORD"),
            redis: port("ANYLOCK_TEST_REDIS_TLS_PORT"),
            postgres: port("ANYLOCK_TEST_POSTGRES_TLS_PORT"),
            etcd: port("ANYLOCK_TEST_ETCD_TLS_PORT"),
        })
    }

    fn file(&self, name: &str) -> String {
        format!("{}/{name}", self.dir)
    }
}

/// A backend: its TLS URL from parts, and the plaintext scheme a TLS parameter is refused on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Redis,
    Postgres,
    Etcd,
}

const BACKENDS: [Backend; 3] = [Backend::Redis, Backend::Postgres, Backend::Etcd];

/// The pieces a case varies.
struct Parts<'a> {
    scheme_plain: bool,
    password: &'a str,
    ca: &'a str,
    client_cert: bool,
    port: Option<u16>,
    extra: &'a str,
}

/// Everything right: the trusted CA, the client certificate, the password.
fn right(s: &Secure) -> Parts<'_> {
    Parts {
        scheme_plain: false,
        password: &s.password,
        ca: "ca.pem",
        client_cert: true,
        port: None,
        extra: "",
    }
}

impl Backend {
    fn url(self, s: &Secure, p: &Parts<'_>) -> String {
        let (scheme, port, path, fixed) = match self {
            Self::Redis => (
                if p.scheme_plain { "redis" } else { "rediss" },
                s.redis,
                "/0",
                // The default prefix: the server's ACL allows only keys `{anylock:…`.
                String::new(),
            ),
            Self::Postgres => (
                "postgres",
                s.postgres,
                "/anylock_test",
                format!(
                    "sslmode={}&schema=sec_{:08x}",
                    if p.scheme_plain {
                        "disable"
                    } else {
                        "verify-full"
                    },
                    rand::random::<u32>()
                ),
            ),
            Self::Etcd => (
                if p.scheme_plain { "etcd" } else { "etcds" },
                s.etcd,
                "/anylock/",
                String::new(),
            ),
        };
        let port = p.port.unwrap_or(port);
        let mut query = vec![fixed, format!("ca={}", s.file(p.ca))];
        if p.client_cert {
            query.push(format!("cert={}", s.file("client.pem")));
            query.push(format!("key={}", s.file("client-key.pem")));
        }
        if !p.extra.is_empty() {
            query.push(p.extra.to_owned());
        }
        query.retain(|q| !q.is_empty());
        format!(
            "{scheme}://{}:{}@localhost:{port}{path}?{}",
            s.user,
            p.password,
            query.join("&")
        )
    }

    /// A misspelled TLS parameter each backend must refuse rather than ignore.
    fn typo(self) -> &'static str {
        match self {
            Self::Postgres => "sslmod=verify-full",
            Self::Redis | Self::Etcd => "cacert=/etc/ssl/certs/ca-certificates.crt",
        }
    }
}

/// One `anylock -vvv run` with `url` in `ANYLOCK_BACKEND`; the command prints its
/// environment. Nothing of the test's own environment that names a secret is passed on.
fn run(url: &str) -> (Output, Duration) {
    let started = Instant::now();
    let scratch = support::Scene::scratch();
    let out = clean(Command::new(BIN))
        .args(["-vvv", "run", "--wait", "30s", "sec-matrix", "--", "env"])
        .env("ANYLOCK_BACKEND", url)
        .env("XDG_CONFIG_HOME", &scratch)
        .current_dir(&scratch)
        .stdin(Stdio::null())
        .output()
        .expect("run anylock");
    let _ = std::fs::remove_dir_all(&scratch);
    (out, started.elapsed())
}

/// `cmd` without the harness's secret-bearing variables (the test's environment is not
/// what is under test).
fn clean(mut cmd: Command) -> Command {
    for (name, _) in std::env::vars() {
        if name.starts_with("ANYLOCK_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that no output stream holds `secret` or a 12-character piece of it.
fn assert_no_secret(what: &str, out: &Output, secret: &str) {
    let all = text(out);
    for piece in [secret, &secret[..12], &secret[secret.len() - 12..]] {
        assert!(
            !all.contains(piece),
            "{what}: the secret (or a piece of it) appears in anylock's output:\n{all}"
        );
    }
}

struct Case {
    name: &'static str,
    code: i32,
    /// Each must appear (case-insensitively) in stderr.
    words: &'static [&'static str],
}

/// Every case ends in milliseconds on loopback. Generous, yet below the PostgreSQL and
/// Redis request timeouts (10 s): a case that waits one out instead of failing fast fails.
const BOUND: Duration = Duration::from_secs(5);

#[test]
fn every_backend_across_the_security_matrix() {
    let Some(s) = Secure::from_env() else { return };
    let wrong = format!("wrong-{:032x}", rand::random::<u128>());
    let mut failures = Vec::new();
    for backend in BACKENDS {
        let right = right(&s);
        let typo = backend.typo();
        // The issue's own example: a misspelled password parameter carries the secret.
        let secret_typo = format!("pasword={}", s.password);
        let cases: Vec<(Case, Parts<'_>)> = vec![
            (
                Case {
                    name: "right credentials",
                    code: OK,
                    words: &[],
                },
                Parts { ..right },
            ),
            (
                Case {
                    name: "wrong password",
                    code: FAILED,
                    words: &["permission denied", "auth"],
                },
                Parts {
                    password: &wrong,
                    ..right
                },
            ),
            (
                Case {
                    name: "untrusted server certificate",
                    code: FAILED,
                    words: &["permission denied", "TLS", "certificate"],
                },
                Parts {
                    ca: "other-ca.pem",
                    ..right
                },
            ),
            (
                Case {
                    name: "missing client certificate",
                    code: FAILED,
                    words: &["permission denied", "certificate"],
                },
                Parts {
                    client_cert: false,
                    ..right
                },
            ),
            (
                Case {
                    name: "TLS parameter on a plaintext URL",
                    code: USAGE,
                    words: &["TLS"],
                },
                Parts {
                    scheme_plain: true,
                    ..right
                },
            ),
            (
                Case {
                    name: "misspelled parameter",
                    code: USAGE,
                    words: &["unknown", "parameter"],
                },
                Parts {
                    extra: typo,
                    ..right
                },
            ),
            (
                Case {
                    name: "the password in a misspelled parameter",
                    code: USAGE,
                    words: &["unknown", "parameter", "pasword"],
                },
                Parts {
                    extra: &secret_typo,
                    ..right
                },
            ),
            (
                Case {
                    name: "nothing listening",
                    code: FAILED,
                    words: &["unavailable"],
                },
                Parts {
                    port: Some(free_port()),
                    ..right
                },
            ),
        ];
        for (case, parts) in cases {
            let url = backend.url(&s, &parts);
            let (out, took) = run(&url);
            let label = format!("{backend:?} / {}", case.name);
            assert_no_secret(&label, &out, &s.password);
            assert_no_secret(&label, &out, &wrong);
            let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
            let code = out.status.code().unwrap_or(-1);
            // The CLI's one-line report; trace lines of background tasks may follow it.
            let last_line = stderr
                .lines()
                .rfind(|l| l.starts_with("anylock:"))
                .unwrap_or("(no error line)")
                .to_owned();
            let mut problems = Vec::new();
            if code != case.code {
                problems.push(format!("exit {code}, expected {}", case.code));
            }
            for word in case.words {
                if !last_line.contains(&word.to_lowercase()) {
                    problems.push(format!("the error does not say {word:?}"));
                }
            }
            if took > BOUND {
                problems.push(format!("took {took:?} (bound {BOUND:?})"));
            }
            if case.code == OK && !String::from_utf8_lossy(&out.stdout).contains("ANYLOCK_NAME=") {
                problems.push("the command did not run".to_owned());
            }
            eprintln!("{label}: exit {code} in {took:?}: {last_line}");
            if !problems.is_empty() {
                failures.push(format!(
                    "{label}: {}; last line: {last_line}",
                    problems.join(", ")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "security matrix failures:\n{}",
        failures.join("\n")
    );
}

/// The locked command sees `ANYLOCK_BACKEND` without the password (so it cannot leak it),
/// and `anylock check` reports TLS, what was verified and who we are.
#[test]
fn check_reports_tls_and_identity_and_the_command_never_sees_the_password() {
    let Some(s) = Secure::from_env() else { return };
    for backend in BACKENDS {
        let right = right(&s);
        let url = backend.url(&s, &right);
        let (out, _) = run(&url);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let seen = stdout
            .lines()
            .find(|l| l.starts_with("ANYLOCK_BACKEND="))
            .unwrap_or_else(|| panic!("{backend:?}: the command should see a redacted URL"));
        assert!(
            seen.contains("***") && !seen.contains(&s.password),
            "{backend:?}: {seen}"
        );

        let check = clean(Command::new(BIN))
            .arg("check")
            .env("ANYLOCK_BACKEND", &url)
            .stdin(Stdio::null())
            .output()
            .expect("anylock check");
        assert_no_secret("check", &check, &s.password);
        let report = String::from_utf8_lossy(&check.stdout);
        assert_eq!(
            check.status.code(),
            Some(OK),
            "{backend:?}: {}",
            text(&check)
        );
        let security: Vec<&str> = report
            .lines()
            .filter(|l| l.starts_with("security:"))
            .collect();
        assert!(
            !security.is_empty(),
            "{backend:?}: no security line:\n{report}"
        );
        for line in security {
            for word in [
                "TLSv1.",
                "verified",
                "client certificate presented",
                "anylock",
            ] {
                assert!(
                    line.contains(word),
                    "{backend:?}: {word:?} missing from: {line}"
                );
            }
            assert!(!line.contains("NOT"), "{backend:?}: {line}");
        }

        let json = clean(Command::new(BIN))
            .args(["check", "--json"])
            .env("ANYLOCK_BACKEND", &url)
            .stdin(Stdio::null())
            .output()
            .expect("anylock check --json");
        assert_no_secret("check --json", &json, &s.password);
        assert_eq!(json.status.code(), Some(OK), "{backend:?}: {}", text(&json));
        let report: serde_json::Value =
            serde_json::from_slice(&json.stdout).expect("check --json prints one object");
        let connections = report["security"].as_array().expect("a security array");
        assert!(!connections.is_empty(), "{report}");
        for c in connections {
            assert_eq!(c["transport"], "tls", "{c}");
            assert_eq!(c["verification"], "full", "{c}");
            assert_eq!(c["client_certificate"], true, "{c}");
            assert!(
                c["tls_version"]
                    .as_str()
                    .is_some_and(|v| v.starts_with("TLSv1.")),
                "{c}"
            );
        }
        assert!(report["round_trip_ms"].as_f64().is_some(), "{report}");
    }
}

/// `check` on a plaintext server with a password says so, loudly.
#[test]
fn check_warns_when_credentials_travel_in_plaintext() {
    let Some(url) = test_kit::env::require("ANYLOCK_TEST_POSTGRES_URL", "PostgreSQL") else {
        return;
    };
    // The harness's PostgreSQL trusts loopback: any password is accepted, none is checked.
    let url = url.replacen("postgres@", "postgres:plain-secret-123456@", 1);
    assert!(
        url.contains("sslmode=disable"),
        "the harness's URL says no TLS: {url}"
    );
    let check = clean(Command::new(BIN))
        .arg("check")
        .env("ANYLOCK_BACKEND", &url)
        .stdin(Stdio::null())
        .output()
        .expect("anylock check");
    assert_no_secret("check", &check, "plain-secret-123456");
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(report.contains("PLAINTEXT"), "{}", text(&check));
    assert!(report.contains("WARNING"), "{}", text(&check));
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A Redlock node or etcd member that is down is reported as not connected, never as
/// verified or authenticated because the URL asked for it.
#[test]
fn check_does_not_vouch_for_a_server_it_cannot_reach() {
    let Some(s) = Secure::from_env() else { return };
    let down = free_port();
    let redlock = format!(
        "redis://127.0.0.1:27101/0,redis://127.0.0.1:27102/0,redis://127.0.0.1:27103/0,\
         redis://:pw-123456789012@127.0.0.1:{down}/0"
    );
    let etcd = Backend::Etcd.url(&s, &right(&s)).replacen(
        &format!("localhost:{}", s.etcd),
        &format!("localhost:{},localhost:{down}", s.etcd),
        1,
    );
    for url in [redlock, etcd] {
        let check = clean(Command::new(BIN))
            .arg("check")
            .env("ANYLOCK_BACKEND", &url)
            .stdin(Stdio::null())
            .output()
            .expect("anylock check");
        assert_no_secret("check", &check, &s.password);
        let report = String::from_utf8_lossy(&check.stdout);
        let line = report
            .lines()
            .find(|l| l.starts_with("security:") && l.contains(&format!(":{down}")))
            .unwrap_or_else(|| panic!("no line for the down server:\n{}", text(&check)));
        assert!(line.contains("NOT CONNECTED"), "{line}");
        assert!(
            !line.contains("verified") && !line.contains("authenticated"),
            "{line}"
        );
    }
}
