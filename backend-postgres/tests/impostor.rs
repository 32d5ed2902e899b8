//! A server that is not the one the URL means (an impostor on the network path, or a
//! listener on a port the real server left) gets neither the password nor the client's
//! memory in the default configuration. The fake servers here speak just enough of the
//! PostgreSQL protocol on 127.0.0.1: they answer the client's `SSLRequest`, read its
//! startup message, and then ask for a password or send one huge message.

use backend_postgres::{PostgresBackend, PostgresConfig};
use lockcore::ErrorKind;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The password every test URL carries; no fake server may see it, or its md5.
const SECRET: &str = "impostor-wants-this-9f3e";

/// `SSLRequest`'s code (PostgreSQL protocol, "Message Formats").
const SSL_REQUEST: u32 = 80_877_103;

/// What a fake server does once the client's startup message arrived.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// `AuthenticationCleartextPassword`.
    AskCleartext,
    /// `AuthenticationMD5Password` with a fixed salt.
    AskMd5,
    /// A header claiming a huge message, this many bytes of it, then the connection
    /// closed: to a client in plaintext an `Authentication` message of 0xFFFF_FFF0
    /// bytes, to one that asked for TLS (answer `S`) a `ServerHello` of 16 MiB.
    Flood(usize),
}

/// What a fake server saw.
#[derive(Debug, Default)]
struct Seen {
    /// An `SSLRequest` arrived.
    ssl_requested: bool,
    /// A startup message arrived (the client went on after the answer to `SSLRequest`).
    startup: bool,
    /// Everything the client sent after the server's request for a password.
    after_request: Vec<u8>,
}

impl Seen {
    /// A `PasswordMessage` (`p`) arrived: the password in clear, or its md5.
    fn password_sent(&self) -> bool {
        self.after_request.first() == Some(&b'p')
    }
}

/// A fake PostgreSQL server on 127.0.0.1: answers `SSLRequest` with `tls` (`N` declines)
/// and then does `then`, for every connection.
struct Fake {
    port: u16,
    seen: Arc<Mutex<Seen>>,
}

impl Fake {
    async fn start(tls: u8, then: Then) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let shared = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, tls, then, Arc::clone(&shared)));
            }
        });
        Self { port, seen }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn url(&self, params: &str) -> String {
        format!(
            "postgres://app:{SECRET}@127.0.0.1:{}/db?timeout_ms=3000{params}",
            self.port
        )
    }
}

/// One client message without a type byte (`SSLRequest`, startup): its code, or `None`
/// when the client closed the connection.
async fn untyped(stream: &mut TcpStream) -> Option<u32> {
    let len = stream.read_u32().await.ok()?;
    let mut body = vec![0; usize::try_from(len).ok()?.checked_sub(4)?];
    stream.read_exact(&mut body).await.ok()?;
    body.get(..4)
        .map(|code| u32::from_be_bytes(code.try_into().expect("4 bytes")))
}

async fn serve(mut stream: TcpStream, tls: u8, then: Then, seen: Arc<Mutex<Seen>>) {
    let record =
        |f: &dyn Fn(&mut Seen)| f(&mut seen.lock().unwrap_or_else(PoisonError::into_inner));
    let mut code = untyped(&mut stream).await;
    if code == Some(SSL_REQUEST) {
        record(&|s| s.ssl_requested = true);
        if stream.write_all(&[tls]).await.is_err() {
            return;
        }
        if tls != b'N' {
            if let Then::Flood(bytes) = then {
                flood_tls(stream, bytes).await;
            }
            return;
        }
        code = untyped(&mut stream).await;
    }
    if code.is_none() {
        return;
    }
    record(&|s| s.startup = true);
    let request: &[u8] = match then {
        Then::AskCleartext => &[b'R', 0, 0, 0, 8, 0, 0, 0, 3],
        Then::AskMd5 => &[b'R', 0, 0, 0, 12, 0, 0, 0, 5, 1, 2, 3, 4],
        Then::Flood(bytes) => return flood(stream, bytes).await,
    };
    if stream.write_all(request).await.is_err() {
        return;
    }
    if let Some(reply) = typed(&mut stream).await {
        record(&|s| s.after_request.extend_from_slice(&reply));
    }
}

/// One client message with a type byte, whole; `None` when the client closed first.
async fn typed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let kind = stream.read_u8().await.ok()?;
    let len = stream.read_u32().await.ok()?;
    let mut message = vec![kind];
    message.extend_from_slice(&len.to_be_bytes());
    let mut body = vec![0; usize::try_from(len).ok()?.checked_sub(4)?];
    stream.read_exact(&mut body).await.ok()?;
    message.extend_from_slice(&body);
    Some(message)
}

/// Sends an `Authentication` header claiming 0xFFFF_FFF0 bytes, `bytes` zero bytes of it,
/// and closes.
async fn flood(mut stream: TcpStream, bytes: usize) {
    let mut header = vec![b'R'];
    header.extend_from_slice(&0xFFFF_FFF0_u32.to_be_bytes());
    if stream.write_all(&header).await.is_err() {
        return;
    }
    let chunk = vec![0u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        if stream.write_all(&chunk[..n]).await.is_err() {
            return;
        }
        left -= n;
    }
}

/// Sends TLS handshake records holding a `ServerHello` that claims 16 MiB - 1 bytes,
/// `bytes` of it in all, and closes.
async fn flood_tls(mut stream: TcpStream, bytes: usize) {
    let mut head = vec![0x02, 0xFF, 0xFF, 0xFF];
    let mut left = bytes;
    while left > 0 {
        let body = left.min(16_384 - head.len());
        let len = u16::try_from(head.len() + body).expect("a record");
        let mut record = vec![0x16, 0x03, 0x03];
        record.extend_from_slice(&len.to_be_bytes());
        record.append(&mut head);
        record.resize(5 + usize::from(len), 0);
        if stream.write_all(&record).await.is_err() {
            return;
        }
        left -= body;
    }
}

/// Connects with `url`; the connection must fail.
async fn refused(url: &str) -> lockcore::Error {
    let result = match PostgresConfig::from_url(url) {
        Ok(config) => PostgresBackend::connect(config).await,
        Err(err) => Err(err),
    };
    let err = result.expect_err("the fake server is no PostgreSQL");
    assert!(!format!("{err} {err:?}").contains(SECRET), "{err:?}");
    err
}

/// The reported hole: under libpq's default `sslmode=prefer`, a server that declines TLS
/// and asks for the password in clear (or as md5, which is as good as clear to whoever
/// holds it) was sent it. A URL with a password and no `sslmode` now requires TLS with a
/// verified certificate, so nothing but the `SSLRequest` reaches such a server, and the
/// refusal says how to opt out knowingly. `sslmode=disable` still sends it, as asked (the
/// control that shows this fake server sees a password when one is sent).
#[tokio::test]
async fn a_server_that_declines_tls_gets_no_password_by_default() {
    for then in [Then::AskCleartext, Then::AskMd5] {
        let fake = Fake::start(b'N', then).await;
        let err = refused(&fake.url("")).await;
        eprintln!("{then:?}: {err}");
        {
            let seen = fake.seen();
            assert!(seen.ssl_requested, "{then:?}: {seen:?}");
            assert!(!seen.startup, "{then:?}: went on without TLS: {seen:?}");
            assert!(!seen.password_sent(), "{then:?}: {seen:?}");
        }
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        let shown = err.to_string();
        for fragment in ["does not offer TLS", "sslmode=disable", "ca="] {
            assert!(shown.contains(fragment), "{fragment:?} missing: {shown}");
        }

        let fake = Fake::start(b'N', then).await;
        let _ = refused(&fake.url("&sslmode=disable")).await;
        let seen = fake.seen();
        assert!(seen.password_sent(), "{then:?}: disable sends it: {seen:?}");
    }
}

/// `prefer` and `allow` given explicitly with a password would send it to the same server
/// (`allow` never even tries TLS in sqlx 0.9): refused before connecting, saying what to
/// use instead.
#[tokio::test]
async fn a_password_with_a_mode_that_may_skip_tls_is_refused() {
    let fake = Fake::start(b'N', Then::AskCleartext).await;
    for mode in ["prefer", "allow"] {
        let err = refused(&fake.url(&format!("&sslmode={mode}"))).await;
        assert_eq!(err.kind(), ErrorKind::Config, "{mode}: {err}");
        let shown = err.to_string();
        for fragment in [
            format!("sslmode={mode}"),
            "sslmode=verify-full".into(),
            "sslmode=disable".into(),
        ] {
            assert!(shown.contains(&fragment), "{fragment:?} missing: {shown}");
        }
    }
    let seen = fake.seen();
    assert!(!seen.ssl_requested && !seen.startup, "connected: {seen:?}");
}

/// Set in the child processes of [`a_password_from_the_environment_is_protected_too`].
const CHILD: &str = "ANYLOCK_PG_IMPOSTOR_CHILD";

/// sqlx also takes the password from `PGPASSWORD` or the password file (`PGPASSFILE`,
/// `~/.pgpass`) when the URL has none: the default protects it the same way. The
/// environment is the child's own, so each case runs in a child process.
#[tokio::test]
async fn a_password_from_the_environment_is_protected_too() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("anylock-pgpass-{:016x}", rand::random::<u64>()));
    std::fs::create_dir(&dir).expect("temp dir");
    let passfile = dir.join("pgpass");
    std::fs::write(&passfile, format!("*:*:*:app:{SECRET}\n")).expect("write");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    for (var, value) in [
        ("PGPASSWORD", std::ffi::OsString::from(SECRET)),
        ("PGPASSFILE", passfile.clone().into_os_string()),
    ] {
        let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "environment_password_child", "--nocapture"])
            .env(CHILD, "1")
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE")
            .env_remove("PGSSLMODE")
            .env(var, value)
            .output()
            .expect("run the child test");
        let shown = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{var}: child failed:\n{shown}");
        assert!(
            shown.contains("1 passed"),
            "{var}: the child did not run:\n{shown}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs only inside [`a_password_from_the_environment_is_protected_too`]'s children.
#[tokio::test]
async fn environment_password_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let fake = Fake::start(b'N', Then::AskCleartext).await;
    let url = format!("postgres://app@127.0.0.1:{}/db?timeout_ms=3000", fake.port);
    let err = refused(&url).await;
    let seen = fake.seen();
    assert!(seen.ssl_requested && !seen.startup, "{seen:?}");
    assert!(err.to_string().contains("sslmode=disable"), "{err}");
}

/// Set (to the URL to connect with) in the child processes of the memory tests.
const FLOOD_URL: &str = "ANYLOCK_PG_FLOOD_URL";

/// How much each flooding server sends.
const FLOOD: usize = 256 << 20;

/// The peak resident memory of this process so far (`VmHWM`), in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .expect("a VmHWM line");
    line.trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("KiB")
}

/// How much a child process's peak memory grew (KiB) while it connected to a fake
/// server that answers `tls` to the `SSLRequest` and floods [`FLOOD`] bytes, with the
/// fake server's URL plus `params`; and what the child printed.
async fn growth(tls: u8, params: &str) -> (u64, String) {
    let fake = Fake::start(tls, Then::Flood(FLOOD)).await;
    let output = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "flood_child", "--nocapture", "--test-threads=1"])
        .env(
            FLOOD_URL,
            fake.url(params)
                .replace("timeout_ms=3000", "timeout_ms=20000"),
        )
        .env_remove(CHILD)
        .output()
        .await
        .expect("run the child test");
    let shown = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{shown}");
    let line = shown
        .lines()
        .find_map(|l| l.split_once("FLOOD ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("the child did not run:\n{shown}"));
    let kib = |key: &str| -> u64 {
        let value = line
            .split(' ')
            .find_map(|w| w.strip_prefix(key))
            .expect(key);
        value.parse().expect("KiB")
    };
    (kib("after_kib=") - kib("before_kib="), line.to_owned())
}

/// Guards against the reported exhaustion: a fake server sends a message header claiming
/// about 4 GiB and streams 256 MiB of it. With a password and no `sslmode` (verify-full)
/// none of it reaches sqlx's read buffer: an `N` is refused at once, and after an `S`
/// rustls refuses a handshake message over 64 KiB before the server is verified. Under
/// `sslmode=disable` sqlx buffers it all, as docs/postgres.md ("Reply limits") says and
/// `REPLY_LIMITS` leaves out: if that part starts to fail, sqlx bounds its reads now and
/// the docs and `REPLY_LIMITS` must say so.
#[tokio::test]
async fn a_flooding_server_cannot_fill_memory_before_verification() {
    for tls in [b'N', b'S'] {
        let (grew, shown) = growth(tls, "").await;
        eprintln!("default, answer {}: {shown}", char::from(tls));
        assert!(grew < 32 << 10, "grew {grew} KiB: {shown}");
        if tls == b'S' {
            // rustls's limit, the second of REPLY_LIMITS.
            assert!(shown.contains("HandshakePayloadTooLarge"), "{shown}");
        }
    }
    let (grew, shown) = growth(b'N', "&sslmode=disable").await;
    eprintln!("sslmode=disable: {shown}");
    assert!(
        grew > 128 << 10,
        "sqlx bounds its reads now? grew {grew} KiB: {shown}"
    );
}

/// Runs only inside [`a_flooding_server_cannot_fill_memory_before_verification`]'s
/// children: connects to `ANYLOCK_PG_FLOOD_URL` and prints its peak memory before and
/// after, in KiB.
#[tokio::test]
async fn flood_child() {
    let Some(url) = std::env::var_os(FLOOD_URL) else {
        return;
    };
    let before = peak_kib();
    let started = std::time::Instant::now();
    let err = refused(&url.to_string_lossy()).await;
    println!(
        "FLOOD before_kib={before} after_kib={} secs={:.2} error={err}",
        peak_kib(),
        started.elapsed().as_secs_f64()
    );
}
