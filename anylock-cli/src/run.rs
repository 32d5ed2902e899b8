//! `anylock run`: acquire, run the command while the lease is refreshed, stop it if the
//! lock is lost, release at the end.

use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

use anylock::Config;
use lockcore::{
    Error, ErrorKind, HolderInfo, LockBackend, LockGuard, LockOptions, Locker, WaitMode,
};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::child::{self, Child};
use crate::cli::RunArgs;
use crate::exit;

/// Default lease TTL for commands.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// Runs `anylock run`; returns the process exit code.
pub(crate) async fn run(args: RunArgs, config: &Config) -> u8 {
    match run_inner(args, config).await {
        Ok(code) => code,
        Err(err) => {
            exit::report(&err);
            exit::code_for(&err)
        }
    }
}

async fn run_inner(args: RunArgs, config: &Config) -> Result<u8, Error> {
    let options = options(&args, config)?;
    let backend = crate::select::connect(&config.backend_url()).await?;
    let locker = Locker::new(backend).with_options(options);
    let guard = acquire_with_status(&locker, &args.name).await?;
    tracing::info!(lock = %args.name, token = ?guard.fence_token(), "acquired");
    Ok(supervise(guard, &args).await)
}

fn duration(text: &str, what: &str) -> Result<Duration, Error> {
    humantime::parse_duration(text).map_err(|e| {
        Error::new(
            ErrorKind::Config,
            format!("invalid {what} {text:?} in the config: {e}"),
        )
    })
}

pub(crate) fn options(args: &RunArgs, config: &Config) -> Result<LockOptions, Error> {
    let ttl = match (args.ttl, &config.ttl) {
        (Some(ttl), _) => ttl,
        (None, Some(text)) => duration(text, "ttl")?,
        (None, None) => DEFAULT_TTL,
    };
    let wait = match (args.no_wait, args.wait, config.wait.as_deref()) {
        (true, _, _) => WaitMode::TryOnce,
        (false, Some(wait), _) => WaitMode::Timeout(wait),
        (false, None, Some("forever") | None) => WaitMode::Forever,
        (false, None, Some(text)) => WaitMode::Timeout(duration(text, "wait")?),
    };
    let options = LockOptions::new(ttl).with_wait(wait);
    options.validate()?;
    Ok(options)
}

/// Acquires, showing who holds the lock meanwhile: a live line on a terminal, one log line
/// otherwise.
async fn acquire_with_status(locker: &Locker, name: &str) -> Result<LockGuard, Error> {
    let tty = std::io::stderr().is_terminal();
    let acquire = locker.acquire(name);
    tokio::pin!(acquire);
    let start = tokio::time::Instant::now() + Duration::from_millis(300);
    let mut ticker = tokio::time::interval_at(start, Duration::from_secs(1));
    let mut shown = false;
    loop {
        tokio::select! {
            result = &mut acquire => {
                if tty && shown {
                    eprint!("\r\x1b[2K");
                }
                return result;
            }
            _ = ticker.tick() => {
                // Bounded: while this awaits, the acquire is not polled.
                let inspect = tokio::time::timeout(Duration::from_millis(900), locker.inspect(name));
                let Ok(Ok(Some(holder))) = inspect.await else { continue };
                let line = describe_wait(name, &holder);
                if tty {
                    eprint!("\r\x1b[2K{line}");
                } else if !shown {
                    eprintln!("anylock: {line} (backend: {})", locker.backend().backend_name());
                }
                shown = true;
            }
        }
    }
}

/// "waiting for NAME, held by host/pid since T, expires in S".
pub(crate) fn describe_wait(name: &str, holder: &HolderInfo) -> String {
    let mut line = format!("waiting for {name}, held by {}", holder.owner().host_pid());
    if let Some(since) = holder.acquired_at() {
        line.push_str(&format!(" since {}", timestamp(since)));
    }
    if let Some(left) = holder.expires_in() {
        let secs = Duration::from_secs(left.as_secs());
        line.push_str(&format!(
            ", expires in {}",
            humantime::format_duration(secs)
        ));
    }
    line
}

/// What ended one round of supervision.
enum Event {
    Exited(std::io::Result<std::process::ExitStatus>),
    Lost(lockcore::LostReason),
    Signal(Signal),
}

async fn supervise(guard: LockGuard, args: &RunArgs) -> u8 {
    let mut env = vec![("ANYLOCK_NAME", args.name.clone())];
    if let Some(token) = guard.fence_token() {
        env.push(("ANYLOCK_FENCE_TOKEN", token.to_string()));
    }
    let mut child = match Child::spawn(&args.command, &env) {
        Ok(child) => child,
        Err(err) => {
            let program = args
                .command
                .first()
                .map(|p| p.to_string_lossy())
                .unwrap_or_default();
            eprintln!("anylock: cannot run {program}: {err}");
            release(guard, &args.name).await;
            return child::spawn_error_code(&err);
        }
    };
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        child.stop(args.grace).await;
        return exit::FAILED;
    };
    loop {
        let event = tokio::select! {
            status = child.wait() => Event::Exited(status),
            reason = guard.lost() => Event::Lost(reason),
            _ = int.recv() => Event::Signal(Signal::SIGINT),
            _ = term.recv() => Event::Signal(Signal::SIGTERM),
            _ = hup.recv() => Event::Signal(Signal::SIGHUP),
        };
        match event {
            Event::Signal(sig) => {
                tracing::info!(?sig, "forwarding to the command's process group");
                child.signal_group(sig);
            }
            Event::Lost(reason) => return stop_on_loss(child, guard, args, &reason).await,
            Event::Exited(status) => return finish(guard, &args.name, status).await,
        }
    }
}

async fn stop_on_loss(
    mut child: Child,
    guard: LockGuard,
    args: &RunArgs,
    reason: &lockcore::LostReason,
) -> u8 {
    eprintln!(
        "anylock: lock {} lost ({reason}); stopping the command (SIGTERM, SIGKILL after {})",
        args.name,
        humantime::format_duration(args.grace)
    );
    child.stop(args.grace).await;
    drop(guard);
    exit::LOST
}

async fn finish(
    guard: LockGuard,
    name: &str,
    status: std::io::Result<std::process::ExitStatus>,
) -> u8 {
    let code = match status {
        Ok(status) => child::exit_code(status),
        Err(err) => {
            eprintln!("anylock: lost track of the command: {err}");
            exit::FAILED
        }
    };
    if release(guard, name).await {
        code
    } else {
        exit::LOST
    }
}

/// Releases; `false` when the lease had been lost before the release (the command's work
/// may have overlapped another holder's).
async fn release(guard: LockGuard, name: &str) -> bool {
    match guard.release().await {
        Ok(()) => true,
        Err(err) if err.kind() == ErrorKind::Lost => {
            eprintln!(
                "anylock: the command finished, but lock {name} was lost before release; \
                 its work may have overlapped another holder's"
            );
            false
        }
        Err(err) => {
            eprintln!("anylock: warning: release failed ({err}); the lease expires by its TTL");
            true
        }
    }
}

/// `t` in RFC 3339, for people. humantime panics (inside `Display`) on times before 1970
/// or after 9999, which a foreign value decoded by a backend can hold.
pub(crate) fn timestamp(t: SystemTime) -> String {
    const END_OF_9999: Duration = Duration::from_secs(253_402_300_800);
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) if since < END_OF_9999 => humantime::format_rfc3339_seconds(t).to_string(),
        Ok(_) => "<after 9999-12-31>".to_owned(),
        Err(_) => "<before 1970-01-01>".to_owned(),
    }
}

/// Seconds since `t`, for people.
pub(crate) fn ago(t: SystemTime) -> String {
    let secs = SystemTime::now()
        .duration_since(t)
        .map_or(0, |d| d.as_secs());
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}
