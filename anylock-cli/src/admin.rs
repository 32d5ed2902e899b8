//! `status`, `break`, `guarantees` and `check`.

use std::io::{BufRead, IsTerminal};
use std::time::{Duration, Instant};

use anylock::{BackendUrl, Config};
use lockcore::{Error, ErrorKind, HeldLock, HolderInfo, LockName, LockOptions, Locker, WaitMode};

use crate::run::{ago, timestamp};

pub(crate) fn describe(name: &str, holder: &HolderInfo) -> String {
    let mut text = format!(
        "{} is held by {}",
        lockcore::display_safe(name),
        holder.owner()
    );
    if let Some(since) = holder.acquired_at() {
        text.push_str(&format!(
            "\n  since:       {} ({} ago)",
            timestamp(since),
            ago(since)
        ));
    }
    if let Some(left) = holder.expires_in() {
        let left = Duration::from_millis(left.as_millis() as u64);
        text.push_str(&format!(
            "\n  expires in:  {} unless refreshed",
            humantime::format_duration(left)
        ));
    }
    if let Some(token) = holder.token() {
        text.push_str(&format!("\n  fence token: {token}"));
    }
    if let Some(note) = holder.note() {
        text.push_str(&format!("\n  note:        {note}"));
    }
    text
}

/// `anylock status NAME`: whether the lock is held.
pub(crate) async fn status(name: &str, json: bool, config: &Config) -> Result<bool, Error> {
    let name = LockName::new(name)?;
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let holder = Locker::new(backend).inspect(&name).await?;
    match (&holder, json) {
        (_, true) => out!(
            "{}",
            crate::terminal::json(&status_json(&name, holder.as_ref()))
        ),
        (Some(holder), false) => out!("{}", describe(name.as_str(), holder)),
        (None, false) => out!("{name} is free"),
    }
    Ok(holder.is_some())
}

/// `anylock status NAME --permits`: the live permits of the semaphore NAME, earliest
/// grant first; `Ok(true)` when at least one is held.
pub(crate) async fn permits_status(name: &str, json: bool, config: &Config) -> Result<bool, Error> {
    let name = LockName::new(name)?;
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let holders = Locker::new(backend).inspect_permits(&name).await?;
    if json {
        let permits: Vec<serde_json::Value> = (holders.iter())
            .map(|h| to_json(HeldLock::new(name.clone(), h.clone())))
            .collect();
        let value =
            serde_json::json!({ "name": name, "held": !holders.is_empty(), "permits": permits });
        out!("{}", crate::terminal::json(&value));
    } else if holders.is_empty() {
        out!("semaphore {name}: no permit is held");
    } else {
        let count = holders.len();
        let plural = if count == 1 { "" } else { "s" };
        out!("semaphore {name}: {count} permit{plural} held");
        for holder in &holders {
            out!(
                "{}",
                describe(name.as_str(), holder).replacen(" is held by ", ": a permit held by ", 1)
            );
        }
    }
    Ok(!holders.is_empty())
}

/// `status --json`: one object; fields that are unknown are left out (lockcore's
/// `Serialize` shapes, so `list --json` and the library agree).
fn status_json(name: &LockName, holder: Option<&HolderInfo>) -> serde_json::Value {
    let value = match holder {
        Some(holder) => serde_json::to_value(HeldLock::new(name.clone(), holder.clone())),
        None => Ok(serde_json::json!({ "name": name, "held": false })),
    };
    value.unwrap_or_else(|e| serde_json::json!({ "name": name, "error": e.to_string() }))
}

/// `anylock list [PREFIX]`: the held locks, a line each (or one JSON array).
pub(crate) async fn list(prefix: &str, json: bool, config: &Config) -> Result<(), Error> {
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let held = Locker::new(backend).list(prefix).await?;
    if json {
        out!(
            "{}",
            crate::terminal::json(&serde_json::Value::from_iter(held.iter().map(to_json)))
        );
        return Ok(());
    }
    if held.is_empty() {
        let under = if prefix.is_empty() {
            String::new()
        } else {
            format!(" under {prefix:?}")
        };
        note!("anylock: no lock is held{under}");
        return Ok(());
    }
    let rows: Vec<[String; 5]> = held.iter().map(list_row).collect();
    let header = ["NAME", "OWNER", "EXPIRES IN", "TOKEN", "NOTE"].map(str::to_owned);
    let mut widths = [0; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (width, cell) in widths.iter().zip(row) {
            line.push_str(&format!("{cell:<width$}  "));
        }
        line.push_str(&row[4]);
        out!("{}", line.trim_end());
    }
    Ok(())
}

/// One lock's cells for `list`: unknown values are `-`.
fn list_row(held: &lockcore::HeldLock) -> [String; 5] {
    let holder = held.holder();
    let dash = || "-".to_owned();
    [
        lockcore::display_safe(held.name().as_str()).into_owned(),
        holder.owner().to_string(),
        holder.expires_in().map_or_else(dash, |left| {
            humantime::format_duration(Duration::from_secs(left.as_secs())).to_string()
        }),
        holder.token().map_or_else(dash, |t| t.to_string()),
        holder.note().map_or_else(String::new, |n| n.to_string()),
    ]
}

/// `anylock break NAME [--yes]`.
pub(crate) async fn break_lock(name: &str, yes: bool, config: &Config) -> Result<(), Error> {
    let name = LockName::new(name)?;
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let locker = Locker::new(backend);
    let Some(holder) = locker.inspect(&name).await? else {
        out!("{name} is free; nothing to break");
        return Ok(());
    };
    if !yes
        && !confirm(&format!(
            "{}\nBreak it? [y/N] ",
            describe(name.as_str(), &holder)
        ))?
    {
        out!("left {name} alone");
        return Ok(());
    }
    match locker.break_lock(&name).await? {
        Some(removed) => out!("broke {name}: removed the lease of {}", removed.owner()),
        None => out!("{name} was released meanwhile; nothing to break"),
    }
    Ok(())
}

fn confirm(prompt: &str) -> Result<bool, Error> {
    if !std::io::stdin().is_terminal() {
        return Err(Error::invalid_input(
            "refusing to break a lock without confirmation: stdin is not a terminal; pass --yes",
        ));
    }
    crate::terminal::prompt(prompt);
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Error::invalid_input("cannot read the answer").with_source(e))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES"))
}

/// `anylock guarantees`.
pub(crate) fn guarantees(json: bool) {
    let rows = anylock::compiled_guarantees();
    if json {
        out!("{}", crate::terminal::json(&guarantees_json(&rows)));
        return;
    }
    {
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), "{}", anylock::guarantees_markdown(&rows));
    }
    out!();
    for (name, g) in rows {
        out!("{name}: {}", g.notes);
    }
}

/// `anylock check [URL]`: line by line as each step passes, or (`json`) one object at
/// the end.
pub(crate) async fn check(url: Option<String>, json: bool, config: &Config) -> Result<(), Error> {
    let url = match url {
        Some(url) => {
            crate::secrets::refuse_on_command_line("check", &url)?;
            BackendUrl::new(url)
        }
        None => crate::select::backend_url(config)?,
    };
    // Its lines carry what servers report (who we are, why a node is not connected).
    let say = |line: String| {
        if !json {
            out!("{}", crate::terminal::clean(&line));
        }
    };
    let mut report = serde_json::Map::new();
    say(format!("backend:      {url}"));
    report.insert("backend".into(), url.redacted().into());
    let started = Instant::now();
    let backend = crate::select::connect(&url).await?;
    let connect = started.elapsed();
    say(format!("connect:      ok in {connect:?}"));
    report.insert("connect_ms".into(), millis(connect).into());
    let tag = |e: Error| e.in_backend(backend.backend_name());
    let security = backend.connection_security().await.map_err(tag)?;
    say_security(&*backend, &security, &say);
    report.insert(
        "security".into(),
        security.iter().map(security_json).collect(),
    );
    let name = format!("anylock-check-{:016x}", rand::random::<u64>());
    let locker = Locker::new(backend.clone());
    let mut samples = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        locker.inspect(&name).await?;
        samples.push(t.elapsed());
    }
    samples.sort();
    say(format!(
        "round trip:   {:?} (median of 5 inspect calls)",
        samples[2]
    ));
    report.insert("round_trip_ms".into(), millis(samples[2]).into());
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitMode::TryOnce);
    let t = Instant::now();
    let guard = locker.with_options(options).acquire(name.as_str()).await?;
    guard.release().await?;
    let probe = t.elapsed();
    say(format!(
        "permissions:  ok (probe lock {name} acquired and released in {probe:?})"
    ));
    report.insert("probe_lock_ms".into(), millis(probe).into());
    let skew = measure_skew(&*backend).await?;
    say(format!("clock skew:   {}", describe_skew(&*backend, skew)));
    if let Some((skew_ms, within)) = skew {
        report.insert("clock_skew_ms".into(), skew_ms.into());
        report.insert("clock_skew_uncertainty_ms".into(), millis(within).into());
    }
    let g = backend.guarantees();
    say(format!(
        "guarantees:   {}, fencing {:?}, waiters {:?}",
        g.exclusion, g.fencing, g.waiting
    ));
    say_limits_and_clock(&url, &say, &mut report);
    if json {
        out!(
            "{}",
            crate::terminal::json(&serde_json::Value::Object(report))
        );
    }
    Ok(())
}

/// The bounds on the backend's replies, and the clock leases are measured on.
fn say_limits_and_clock(
    url: &BackendUrl,
    say: &impl Fn(String),
    report: &mut serde_json::Map<String, serde_json::Value>,
) {
    let limits = anylock::reply_limits(url).unwrap_or_default();
    let shown: Vec<String> = limits
        .iter()
        .map(|(what, most)| match what.strip_suffix(" (count)") {
            Some(what) => format!("{what} {}", grouped(*most)),
            None => format!("{what} {} bytes", grouped(*most)),
        })
        .collect();
    say(format!(
        "reply limits: {}",
        match shown.is_empty() {
            true => "none needed (no server)".to_owned(),
            false => shown.join("; "),
        }
    ));
    let limits = limits
        .iter()
        .map(|(what, most)| ((*what).to_owned(), (*most).into()));
    report.insert(
        "reply_limits".into(),
        serde_json::Value::Object(limits.collect()),
    );
    let clock = lockcore::Clock::system().suspend_source();
    say(format!("lease clock:  {clock}"));
    report.insert("lease_clock".into(), clock.into());
}

/// `n` with thousands grouped, for people: `1,048,576`.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One connection's report as JSON: no secret is in any field.
fn security_json(report: &lockcore::ConnectionSecurity) -> serde_json::Value {
    let mut object = serde_json::json!({
        "endpoint": report.endpoint,
        "identity": report.identity,
        "summary": report.to_string(),
    });
    match &report.transport {
        lockcore::Transport::Local => object["transport"] = "local".into(),
        lockcore::Transport::Plaintext => object["transport"] = "plaintext".into(),
        lockcore::Transport::NotConnected(why) => {
            object["transport"] = "not_connected".into();
            object["error"] = why.as_str().into();
        }
        lockcore::Transport::Tls(tls) => {
            object["transport"] = "tls".into();
            object["tls_version"] = tls.version.clone().into();
            object["cipher"] = tls.cipher.clone().into();
            object["verification"] = match tls.verification {
                lockcore::Verification::Full => "full",
                lockcore::Verification::ChainOnly => "chain_only",
                _ => "none",
            }
            .into();
            object["client_certificate"] = tls.client_certificate.into();
            object["roots"] = tls.roots.clone().into();
        }
        _ => object["transport"] = "unknown".into(),
    }
    object
}

/// One `security:` line per connection: TLS version and what was verified, and who we
/// authenticated as; a warning when credentials travel in plaintext.
fn say_security(
    backend: &dyn lockcore::LockBackend,
    reports: &[lockcore::ConnectionSecurity],
    say: &impl Fn(String),
) {
    if reports.is_empty() {
        say(format!(
            "security:     not reported by the {} backend",
            backend.backend_name()
        ));
    }
    for report in reports {
        say(format!("security:     {report}"));
        // Redis reports `user "default" (no password)` for a connection that sends none.
        let sends_secret = report
            .identity
            .as_deref()
            .is_some_and(|who| !who.contains("(no password)"));
        if report.transport == lockcore::Transport::Plaintext && sends_secret {
            say(format!(
                "WARNING:      credentials for {} travel unencrypted; use the backend's TLS \
                 scheme (docs/tls-and-auth.md)",
                report.endpoint
            ));
        }
    }
}

/// The server clock minus ours in milliseconds (positive: the server is ahead), and the
/// uncertainty (half the round trip); `None` when the backend has no clock to report.
async fn measure_skew(
    backend: &dyn lockcore::LockBackend,
) -> Result<Option<(f64, Duration)>, Error> {
    let before = std::time::SystemTime::now();
    let t = Instant::now();
    let tagged = backend.server_time().await;
    let Some(server) = tagged.map_err(|e| e.in_backend(backend.backend_name()))? else {
        return Ok(None);
    };
    let rtt = t.elapsed();
    let midpoint = before + rtt / 2;
    let skew_ms = match server.duration_since(midpoint) {
        Ok(ahead) => millis(ahead),
        Err(behind) => -millis(behind.duration()),
    };
    Ok(Some((skew_ms, rtt / 2)))
}

/// `server clock +12ms ± 1ms relative to this machine`.
fn describe_skew(backend: &dyn lockcore::LockBackend, skew: Option<(f64, Duration)>) -> String {
    match skew {
        None => format!("not exposed by the {} backend", backend.backend_name()),
        Some((ms, within)) => {
            let sign = if ms < 0.0 { '-' } else { '+' };
            let skew = Duration::from_secs_f64(ms.abs() / 1000.0);
            format!("server clock {sign}{skew:?} ± {within:?} relative to this machine")
        }
    }
}

/// Maps a missing-operation error to a helpful message.
pub(crate) fn explain(err: Error) -> Error {
    if err.kind() != ErrorKind::Unsupported {
        return err;
    }
    let mut explained = Error::new(
        ErrorKind::Unsupported,
        format!("{}; use the backend's own tools", err.message()),
    );
    if let Some(backend) = err.backend() {
        explained = explained.with_backend(backend.to_owned());
    }
    if let Some(lock) = err.lock() {
        explained = explained.with_lock(lock);
    }
    explained
}

/// `guarantees --json`: one object per backend, values as the table words them.
fn guarantees_json(rows: &[(&str, lockcore::Guarantees)]) -> serde_json::Value {
    rows.iter()
        .map(|(name, g)| {
            let mut object = to_json(g);
            object["backend"] = (*name).into();
            object
        })
        .collect()
}

/// `value` as JSON; lockcore's `Serialize` impls cannot fail (string keys, no maps of
/// non-string keys), so a failure is shown in place rather than panicking.
fn to_json(value: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}
