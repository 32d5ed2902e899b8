//! Random and garbage replies (RESP values of every type, nested, with huge or negative
//! lengths, raw bytes; the connection kept or closed after them) to each call the backend
//! makes, on a scripted fake server (`fake/mod.rs`): every operation ends in time with a
//! result or a typed error, and nothing panics, in the calling task or in the `redis`
//! crate's connection task (counted by a panic hook: a panic there would only kill the
//! connection).

mod fake;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig};
use fake::{Answer, Command, Fake, bulk};
use lockcore::{AcquireRequest, Identity, Lease, LockBackend, LockName, Permits, Ttl};
use proptest::collection::vec;
use proptest::prelude::*;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic in the process (then prints it as usual).
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// The operation under test and the command whose reply is garbage.
#[derive(Debug, Clone, Copy)]
enum Op {
    Connect(&'static str),
    Acquire,
    Refresh,
    Release,
    Inspect,
    /// `SCAN` itself answered with garbage.
    ListScan,
    /// `SCAN` honest (one key), the read of the candidates answered with garbage.
    ListRead,
    Break,
    Time,
    Security,
    AcquirePermit,
    InspectPermits,
    Subscribe,
}

impl Op {
    /// The command answered with garbage.
    fn target(self) -> &'static str {
        match self {
            Self::Connect(command) => command,
            Self::ListScan => "SCAN",
            Self::Time => "TIME",
            Self::Security => "ACL WHOAMI",
            Self::Subscribe => "SUBSCRIBE",
            _ => "EVALSHA",
        }
    }
}

fn ops() -> impl Strategy<Value = Op> {
    proptest::sample::select(vec![
        Op::Connect("PING"),
        Op::Connect("SCRIPT LOAD"),
        Op::Connect("CONFIG GET"),
        Op::Acquire,
        Op::Refresh,
        Op::Release,
        Op::Inspect,
        Op::ListScan,
        Op::ListRead,
        Op::Break,
        Op::Time,
        Op::Security,
        Op::AcquirePermit,
        Op::InspectPermits,
        Op::Subscribe,
    ])
}

fn line(kind: char) -> impl Strategy<Value = Vec<u8>> {
    "[ -~]{0,24}".prop_map(move |text| format!("{kind}{text}\r\n").into_bytes())
}

/// A header with any length, huge and negative ones included, and nothing after it.
fn header() -> impl Strategy<Value = Vec<u8>> {
    let kinds = proptest::sample::select(vec!['$', '*', '%', '~', '=', '!', '>', '|']);
    let lengths = prop_oneof![any::<i64>(), -3i64..4, Just(8_589_934_592), Just(1 << 20)];
    (kinds, lengths).prop_map(|(kind, n)| format!("{kind}{n}\r\n").into_bytes())
}

fn leaf() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        line('+'),
        line('-'),
        line('('),
        any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
        vec(any::<u8>(), 0..48).prop_map(|bytes| bulk(&bytes)),
        "[0-9a-f]{40}".prop_map(|sha| bulk(sha.as_bytes())),
        Just(b"$-1\r\n".to_vec()),
        Just(b"*-1\r\n".to_vec()),
        Just(b"_\r\n".to_vec()),
        Just(b"#t\r\n".to_vec()),
        Just(b",1.5\r\n".to_vec()),
        Just(b"=7\r\ntxt:abc\r\n".to_vec()),
        Just(b"!3\r\nERR\r\n".to_vec()),
        header(),
        vec(any::<u8>(), 0..32),
    ]
}

fn aggregate(kind: char, items: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = format!("{kind}{}\r\n", items.len()).into_bytes();
    items.into_iter().for_each(|item| out.extend(item));
    out
}

/// One RESP value (or garbage), nested up to three levels.
fn reply() -> impl Strategy<Value = Vec<u8>> {
    leaf().prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(|items| aggregate('*', items)),
            vec(inner.clone(), 0..4).prop_map(|items| aggregate('~', items)),
            vec(inner.clone(), 1..4).prop_map(|items| aggregate('>', items)),
            vec((inner.clone(), inner), 0..3).prop_map(|pairs| {
                let mut out = format!("%{}\r\n", pairs.len()).into_bytes();
                for (k, v) in pairs {
                    out.extend(k);
                    out.extend(v);
                }
                out
            }),
        ]
    })
}

/// What the fake server answers: garbage to `op`'s command, honest answers elsewhere
/// (`SCAN` finds one key of the `prefix` for [`Op::ListRead`]).
fn script(op: Op, garbage: Vec<u8>, close: bool) -> impl Fn(&Command) -> Answer {
    move |command| {
        let name = command.name();
        if name == op.target() {
            return match close {
                true => Answer::BytesThenClose(garbage.clone()),
                false => Answer::Bytes(garbage.clone()),
            };
        }
        match name.as_str() {
            "SCAN" => {
                let key = bulk(b"{fz:held}:lock");
                Answer::Bytes([&b"*2\r\n$1\r\n0\r\n*1\r\n"[..], &key].concat())
            }
            "SUBSCRIBE" => Answer::Bytes(
                [
                    &b"*3\r\n$9\r\nsubscribe\r\n"[..],
                    &bulk(&command.args[1]),
                    b":1\r\n",
                ]
                .concat(),
            ),
            _ => Answer::Honest,
        }
    }
}

async fn run(op: Op, fake: &Fake) -> Result<(), lockcore::Error> {
    let config = RedisConfig::from_url(&fake.url())
        .expect("valid URL")
        .with_prefix("fz")
        .with_timeout(Duration::from_millis(300))
        .with_connect_timeout(Duration::from_millis(300));
    let backend = RedisBackend::connect(config).await?;
    let name = LockName::new("held").expect("name");
    let ttl = Ttl::new(Duration::from_secs(30)).expect("TTL");
    let request = AcquireRequest::new(name.clone(), Identity::unique(), ttl);
    let lease = Lease::new(name.clone(), Identity::unique(), ttl, "1:1:ab:someone");
    match op {
        Op::Connect(_) => Ok(()),
        Op::Acquire => backend.acquire(&request).await.map(drop),
        Op::Refresh => backend.refresh(&lease).await.map(drop),
        Op::Release => backend.release(&lease).await,
        Op::Inspect => backend.inspect(&name).await.map(drop),
        Op::ListScan | Op::ListRead => backend.list("").await.map(drop),
        Op::Break => backend.break_lock(&name).await.map(drop),
        Op::Time => backend.server_time().await.map(drop),
        Op::Security => backend.connection_security().await.map(drop),
        Op::AcquirePermit => {
            let permits = Permits::new(3).expect("count");
            let request = request.with_permits(permits);
            backend.acquire_permit(&request).await.map(drop)
        }
        Op::InspectPermits => backend.inspect_permits(&name).await.map(drop),
        Op::Subscribe => backend.subscribe(&name).await.map(drop),
    }
}

fn config() -> ProptestConfig {
    let mut config = test_kit::prop::config();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 128;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn prop_garbage_replies_give_typed_errors_and_never_panic(
        op in ops(),
        garbage in prop_oneof![reply(), vec(reply(), 2..4).prop_map(|r| r.concat())],
        close in any::<bool>(),
    ) {
        count_panics();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let outcome = runtime.block_on(async {
            let fake = Fake::start(script(op, garbage.clone(), close)).await;
            let outcome = tokio::time::timeout(Duration::from_secs(10), run(op, &fake)).await;
            // Let the connection tasks read what is left, where a panic would show.
            tokio::time::sleep(Duration::from_millis(5)).await;
            outcome
        });
        drop(runtime);
        let outcome = outcome.map_err(|_| TestCaseError::fail(format!("{op:?} hung")))?;
        if let Err(err) = outcome {
            prop_assert!(!err.message().is_empty());
        }
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), 0, "{:?}: a panic", op);
    }
}
