//! One client process: lock -> read-modify-write steps -> unlock, over and over, against
//! one backend, reporting every step to the fenced register.
//!
//! Each step reads the counter, checks the lease (`is_held()` and `remaining_validity()`,
//! reported to the register), and starts only if at least `step + margin` is left; the
//! write then arrives `step` later. That window between the check and the write is where
//! Kleppmann's pause, delayed packet or clock jump lands. A separate task watches the
//! guard and reports `Lost` with its margin before the earliest moment the server could
//! expire the lease (the guard's validity deadline plus the drift allowance, since the
//! deadline is counted from when the request was *sent*).
//!
//! What a section holds depends on the [`Primitive`]: the lock (`Locker::acquire`), one
//! permit of a semaphore (`Locker::acquire_permit`), or leadership (`Election::campaign`,
//! then `is_leader()` and `term()` in place of `is_held()` and the token, and `resign()`
//! in place of `release()`).
//!
//! Commands on stdin, one per line: `stop` (finish or abandon the current section, release,
//! exit), `jump-back MS` and `jump-forward MS` (move the locker's clock). End of input
//! means `stop`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockcore::{
    Backoff, Clock, ClockControl, Election, Leadership, LockBackend, LockGuard, LockOptions,
    Locker, LostReason,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex, oneshot, watch};
use tokio::time::{Instant, sleep};

use crate::backends::Workload;
use crate::primitive::Primitive;
use crate::protocol::{Outcome, Reply, Request, SectionId};

/// What one client process is told to do.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The backend URL (through this client's fault proxies).
    pub url: String,
    /// The fenced register.
    pub register: SocketAddr,
    /// This client's number (1-based).
    pub client: u32,
    /// The lock, semaphore or election all clients of the run contend for.
    pub lock: String,
    /// What a section holds.
    pub primitive: Primitive,
    /// The N a permit client asks for (`Primitive::Permits` only).
    pub permits: u32,
    /// TTL, steps and timing.
    pub workload: Workload,
    /// The attempt timeout (`LockOptions::with_attempt_timeout`); `None`: the default.
    pub attempt_timeout: Option<Duration>,
}

/// Upper bound of the acquire loop's backoff.
const BACKOFF_CAP: Duration = Duration::from_millis(200);

/// A line-based connection to the register.
#[derive(Debug)]
struct Conn {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("register {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        Ok(Conn {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    async fn call(&mut self, request: &Request) -> Result<Reply, String> {
        let line = format!("{request}\n");
        self.write
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("register: {e}"))?;
        let reply = self
            .lines
            .next_line()
            .await
            .map_err(|e| format!("register: {e}"))?
            .ok_or("register closed the connection")?;
        reply.parse()
    }
}

/// What a client holds during a section.
#[derive(Debug)]
enum Held {
    /// The lock or a permit.
    Guard(LockGuard),
    /// Leadership of the election.
    Leader(Leadership),
}

impl Held {
    fn guard(&self) -> &LockGuard {
        match self {
            Held::Guard(guard) => guard,
            Held::Leader(leadership) => leadership.guard(),
        }
    }

    /// The fencing token, or the term.
    fn token(&self) -> Option<u64> {
        match self {
            Held::Guard(guard) => guard.fence_token().map(|t| t.get()),
            Held::Leader(leadership) => leadership.term().map(|t| t.get()),
        }
    }

    /// `is_held()`, or `is_leader()`.
    fn is_held(&self) -> bool {
        match self {
            Held::Guard(guard) => guard.is_held(),
            Held::Leader(leadership) => leadership.is_leader(),
        }
    }

    /// `release()`, or `resign()`.
    async fn release(self) -> lockcore::Result<()> {
        match self {
            Held::Guard(guard) => guard.release().await,
            Held::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// Everything a section needs.
struct Ctx {
    config: ClientConfig,
    locker: Locker,
    election: Option<Election>,
    conn: Conn,
    lost_conn: Arc<Mutex<Conn>>,
    stop: watch::Receiver<bool>,
}

/// Runs the client until `stop` or end of input.
///
/// # Errors
/// When the backend cannot be reached within 30 s or the register fails.
pub async fn run(config: ClientConfig) -> Result<(), String> {
    let backend = connect(&config.url).await?;
    let (clock, control) = Clock::adjustable();
    let w = config.workload;
    let mut options =
        LockOptions::new(w.ttl).with_backoff(Backoff::new(Duration::from_millis(20), BACKOFF_CAP));
    if let Some(limit) = config.attempt_timeout {
        options = options.with_attempt_timeout(limit);
    }
    let locker = Locker::new(backend).with_options(options).with_clock(clock);
    let stop = commands(control);
    let election = match config.primitive {
        Primitive::Leader => Some(locker.election(&config.lock).map_err(|e| e.to_string())?),
        Primitive::Lock | Primitive::Permits => None,
    };
    let mut ctx = Ctx {
        election,
        conn: Conn::connect(config.register).await?,
        lost_conn: Arc::new(Mutex::new(Conn::connect(config.register).await?)),
        config,
        locker,
        stop,
    };
    println!("ready");
    let mut section = 0;
    while !*ctx.stop.borrow() {
        section += 1;
        run_section(&mut ctx, section).await?;
    }
    Ok(())
}

async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match open(url).await {
            Ok(backend) => return Ok(backend),
            Err(e) if Instant::now() > deadline => return Err(format!("connect: {e}")),
            Err(_) => sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The backend for `url`. GCS runs against the test server with refreshes faster than real
/// GCS's one mutation per second allows, as the conformance suite does.
async fn open(url: &str) -> lockcore::Result<Arc<dyn LockBackend>> {
    if url.starts_with("gs://") {
        let config = backend_gcs::GcsConfig::from_url(url)?
            .with_min_refresh_interval(Duration::from_millis(100));
        return Ok(Arc::new(config.build().await?));
    }
    anylock::connect(url).await
}

/// Reads stdin commands; the returned watch turns `true` on `stop` or end of input.
fn commands(control: ClockControl) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let ms = |w: &str| w.parse().map(Duration::from_millis);
            match words.as_slice() {
                ["stop"] => break,
                ["jump-back", v] if ms(v).is_ok() => control.jump_back(ms(v).unwrap_or_default()),
                ["jump-forward", v] if ms(v).is_ok() => {
                    control.jump_forward(ms(v).unwrap_or_default());
                }
                _ => eprintln!("client: unknown command {line:?}"),
            }
        }
        let _ = tx.send(true);
    });
    rx
}

async fn run_section(ctx: &mut Ctx, n: u64) -> Result<(), String> {
    let id = SectionId {
        client: ctx.config.client,
        section: n,
    };
    let mut stop = ctx.stop.clone();
    let acquired = tokio::select! {
        acquired = acquire(ctx) => acquired,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let guard = match acquired {
        Ok(held) => Arc::new(held),
        Err(e) => {
            eprintln!("client {}: acquire: {e}", id.client);
            sleep(Duration::from_millis(100)).await;
            return Ok(());
        }
    };
    let (stop_watch, stopped) = oneshot::channel();
    let drift = ctx.locker.options().drift();
    let watcher = tokio::spawn(watch_lost(
        Arc::clone(&guard),
        id,
        Arc::clone(&ctx.lost_conn),
        drift,
        stopped,
    ));
    let outcome = steps(ctx, &guard, id).await?;
    ctx.conn.call(&Request::End { id, outcome }).await?;
    let _ = stop_watch.send(());
    watcher.await.map_err(|e| format!("watcher: {e}"))??;
    let guard = Arc::into_inner(guard).ok_or("the guard is still shared")?;
    if let Err(e) = guard.release().await {
        eprintln!("client {}: section {n}: release: {e}", id.client);
    }
    Ok(())
}

/// Takes what the client's primitive holds.
async fn acquire(ctx: &Ctx) -> lockcore::Result<Held> {
    let name = &ctx.config.lock;
    match (&ctx.election, ctx.config.primitive) {
        (Some(election), _) => election.campaign(None).await.map(Held::Leader),
        (None, Primitive::Permits) => (ctx.locker.acquire_permit(name, ctx.config.permits))
            .await
            .map(Held::Guard),
        (None, _) => ctx.locker.acquire(name).await.map(Held::Guard),
    }
}

async fn steps(ctx: &mut Ctx, guard: &Held, id: SectionId) -> Result<Outcome, String> {
    let token = guard.token();
    if let Reply::Reject { .. } = ctx.conn.call(&Request::Begin { id, token }).await? {
        return Ok(Outcome::Rejected);
    }
    let w = ctx.config.workload;
    for _ in 0..w.steps {
        if *ctx.stop.borrow() {
            return Ok(Outcome::Stopped);
        }
        let read = match ctx.conn.call(&Request::Read { id, token }).await? {
            Reply::Value(v) => v,
            Reply::Reject { .. } => return Ok(Outcome::Rejected),
            Reply::Ok => return Err("READ answered OK".into()),
        };
        let (held, remaining) = (guard.is_held(), guard.guard().remaining_validity());
        let remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
        let check = Request::Check {
            id,
            held,
            remaining_ms,
        };
        ctx.conn.call(&check).await?;
        if !held || remaining < w.step + w.margin {
            return Ok(Outcome::Invalid);
        }
        // The write is on its way: a pause, a slow network or a clock jump stretches this.
        sleep(w.step).await;
        let write = Request::Write {
            id,
            token,
            read,
            new: read + 1,
        };
        if let Reply::Reject { .. } = ctx.conn.call(&write).await? {
            return Ok(Outcome::Rejected);
        }
    }
    Ok(Outcome::Done)
}

/// Tracks the guard's validity deadline and reports `Lost` with its margin.
async fn watch_lost(
    held: Arc<Held>,
    id: SectionId,
    conn: Arc<Mutex<Conn>>,
    drift: Duration,
    mut stopped: oneshot::Receiver<()>,
) -> Result<(), String> {
    let guard = held.guard();
    let mut deadline = Instant::now() + guard.remaining_validity();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => return Ok(()),
            reason = guard.lost() => {
                let now = Instant::now();
                let earliest_expiry = deadline + drift;
                let margin = signed_ms(earliest_expiry, now);
                let request = Request::Lost { id, margin_ms: margin, reason: slug(&reason).into() };
                conn.lock().await.call(&request).await?;
                return Ok(());
            }
            _ = tick.tick() => {
                if guard.is_held() {
                    deadline = deadline.max(Instant::now() + guard.remaining_validity());
                }
            }
        }
    }
}

/// `a - b` in signed milliseconds.
fn signed_ms(a: Instant, b: Instant) -> i64 {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    if a >= b { ms(a - b) } else { -ms(b - a) }
}

fn slug(reason: &LostReason) -> &'static str {
    match reason {
        LostReason::NotOwner(_) => "not-owner",
        LostReason::ValidityExpired => "validity-expired",
        LostReason::TooManyFailures { .. } => "too-many-failures",
        LostReason::RefreshFailed(_) => "refresh-failed",
        LostReason::RefresherStopped => "refresher-stopped",
        _ => "other",
    }
}
