//! `anylock run`: acquire, run the command while the lease is refreshed, stop it if the
//! lock is lost, release at the end.

use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

use crate::cli::RunArgs;
use crate::signals::Signals;
use crate::{exit, watch};
use anylock::Config;
use lockcore::{
    Error, ErrorKind, HolderInfo, LockBackend, LockGuard, LockOptions, Locker, WaitMode,
};

/// Default time between SIGTERM and SIGKILL when the lock is lost.
const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Runs `anylock run`; returns the process exit code.
pub(crate) async fn run(mut args: RunArgs, config: &Config, quiet: bool) -> u8 {
    args.resolve_shell();
    let conflict = args.waiting.conflict_exit_code;
    match run_inner(args, config, quiet).await {
        Ok(code) => code,
        Err(err) => failed(&err, conflict),
    }
}

/// The exit code for `err`, reported on stderr unless it is a conflict (held, timed out)
/// that `--conflict-exit-code` turns into an expected outcome.
pub(crate) fn failed(err: &Error, conflict: Option<u8>) -> u8 {
    match conflict {
        // A skipped run is the expected outcome: no error line. Only when someone was
        // seen holding the lock: a wait that ran out while every attempt failed (the lock
        // service is down) is an error, not a conflict.
        Some(code)
            if err.kind() == ErrorKind::Held
                || (err.kind() == ErrorKind::Timeout && err.holder().is_some()) =>
        {
            tracing::info!(%err, code, "not run: --conflict-exit-code");
            code
        }
        _ => {
            exit::report(err);
            exit::code_for(err)
        }
    }
}

async fn run_inner(args: RunArgs, config: &Config, quiet: bool) -> Result<u8, Error> {
    let options = options(&args, config)?;
    let grace = grace(&args, config)?;
    let hold_at_least = hold_at_least(&args, options.ttl())?;
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let locker = Locker::new(backend).with_options(options);
    let guard = acquire_with_status(&locker, &args.name, args.permits, quiet).await?;
    // Measured after the grant, on the guard's clock (it counts a suspend): the lease is
    // left until no earlier than grant + DUR.
    let clock = locker.clock();
    let hold_until = hold_at_least.map(|d| clock.now() + d);
    // Before the command starts: from here on a signal is forwarded, never fatal.
    let signals = Signals::install(&watch::SIGNALS).map_err(|e| {
        Error::new(ErrorKind::Unavailable, "cannot install signal handlers").with_source(e)
    })?;
    tracing::info!(lock = %args.name, token = ?guard.fence_token(), "acquired");
    Ok(watch::supervise(guard, &args, grace, hold_until, signals, clock).await)
}

/// `--hold-at-least`, which may not exceed the TTL (as ShedLock's lockAtLeastFor may not
/// exceed lockAtMostFor): the lease is then never left for longer than it was granted,
/// which every backend can honour (etcd renews a lease only for its granted TTL).
fn hold_at_least(args: &RunArgs, ttl: Duration) -> Result<Option<Duration>, Error> {
    match args.hold_at_least {
        Some(hold) if hold > ttl => Err(Error::invalid_input(format!(
            "--hold-at-least {} is longer than the lease TTL {}; pass a --ttl at least as long",
            humantime::format_duration(hold),
            humantime::format_duration(ttl)
        ))),
        Some(hold) if hold.is_zero() => Ok(None),
        hold => Ok(hold),
    }
}

/// `--ttl` (or `ANYLOCK_TTL`), else the config's `ttl`, else lockcore's default.
fn ttl(args: &RunArgs, config: &Config) -> Duration {
    args.ttl
        .or(config.ttl.map(lockcore::Ttl::get))
        .unwrap_or(lockcore::DEFAULT_TTL)
}

/// `--grace`, which must be shorter than the TTL: after a loss the command may only run
/// while the lease cannot yet have expired on the server. The default is cut at loss time
/// to what the lease has left instead.
fn grace(args: &RunArgs, config: &Config) -> Result<Duration, Error> {
    let ttl = ttl(args, config);
    match args.grace.or(config.grace) {
        None => Ok(DEFAULT_GRACE),
        Some(grace) if grace < ttl => Ok(grace),
        Some(grace) => Err(Error::invalid_input(format!(
            "--grace {} is not shorter than the lease TTL {}: the command could run on after \
             the server expired the lease; pass a shorter --grace or a longer --ttl",
            humantime::format_duration(grace),
            humantime::format_duration(ttl)
        ))),
    }
}

pub(crate) fn options(args: &RunArgs, config: &Config) -> Result<LockOptions, Error> {
    let ttl = ttl(args, config);
    grace(args, config)?;
    let wait = wait_mode(args.waiting.no_wait, args.waiting.wait, config)?;
    let mut options = LockOptions::new(ttl).with_wait(wait);
    if let Some(margin) = args.margin {
        options = options.with_margin(margin);
    }
    if let Some(note) = args.note.get() {
        options = options.with_note(note.clone());
    }
    options.validate()?;
    Ok(options)
}

/// `-n`, then `-w` (or `ANYLOCK_WAIT`), then the config's `wait`, else forever.
pub(crate) fn wait_mode(
    no_wait: bool,
    wait: Option<Duration>,
    config: &Config,
) -> Result<WaitMode, Error> {
    Ok(match (no_wait, wait, config.wait) {
        (true, _, _) => WaitMode::TryOnce,
        (false, Some(wait), _) => WaitMode::Timeout(wait),
        (false, None, configured) => configured.unwrap_or(WaitMode::Forever),
    })
}

/// Acquires the lock `name` (or, with `permits`, one permit of the semaphore `name`),
/// showing who holds it meanwhile: a live line on a terminal, one log line otherwise.
pub(crate) async fn acquire_with_status(
    locker: &Locker,
    name: &str,
    permits: Option<u32>,
    quiet: bool,
) -> Result<LockGuard, Error> {
    let acquire = async {
        match permits {
            Some(n) => locker.acquire_permit(name, n).await,
            None => locker.acquire(name).await,
        }
    };
    if quiet {
        return acquire.await;
    }
    let tty = std::io::stderr().is_terminal();
    tokio::pin!(acquire);
    let start = tokio::time::Instant::now() + Duration::from_millis(300);
    let mut ticker = tokio::time::interval_at(start, Duration::from_secs(1));
    let mut shown = false;
    loop {
        tokio::select! {
            result = &mut acquire => {
                if tty && shown {
                    crate::terminal::clear_line();
                }
                return result;
            }
            _ = ticker.tick() => {
                // Bounded: while this awaits, the acquire is not polled.
                let inspect = tokio::time::timeout(Duration::from_millis(900), holder_of(locker, name, permits));
                let Ok(Ok(Some(holder))) = inspect.await else { continue };
                let mut line = describe_wait(name, &holder);
                if let Some(n) = permits {
                    line = line.replacen(", held by", &format!(": all {n} permits held; first to end"), 1);
                }
                if tty {
                    crate::terminal::rewrite_line(&line);
                } else if !shown {
                    note!("anylock: {line} (backend: {})", locker.backend().backend_name());
                }
                shown = true;
            }
        }
    }
}

/// Who holds the lock `name`, or (with `permits`) the permit of the semaphore `name` that
/// expires first.
async fn holder_of(
    locker: &Locker,
    name: &str,
    permits: Option<u32>,
) -> Result<Option<HolderInfo>, Error> {
    if permits.is_none() {
        return locker.inspect(name).await;
    }
    let holders = locker.inspect_permits(name).await?;
    // The permit that ends first; one whose expiry is unknown last.
    Ok((holders.into_iter()).min_by_key(|h| h.expires_in().unwrap_or(Duration::MAX)))
}

/// "waiting for NAME, held by host/pid since T, expires in S".
pub(crate) fn describe_wait(name: &str, holder: &HolderInfo) -> String {
    let mut line = format!(
        "waiting for {}, held by {}",
        lockcore::display_safe(name),
        lockcore::display_safe(holder.owner().host_pid())
    );
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
    if let Some(note) = holder.note() {
        line.push_str(&format!(" ({note})"));
    }
    line
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
