//! `anylock elect` (run a command only while leader) and `anylock leader` (who leads, once
//! or as it changes): lockcore's [`Election`](lockcore::Election) over the lock NAME.

use anylock::Config;
use lockcore::{Error, Leader, LockName, Locker};

use crate::run::{ago, timestamp};

/// `anylock leader NAME`: prints the leader (or that there is none); `Ok(true)` when
/// someone leads. With `watch`, prints a line (or a JSON object) per change until killed.
pub(crate) async fn leader(
    name: &str,
    json: bool,
    watch: bool,
    config: &Config,
) -> Result<bool, Error> {
    let name = LockName::new(name)?;
    let backend = crate::select::connect(&crate::select::backend_url(config)?).await?;
    let election = Locker::new(backend).election(name.as_str())?;
    if !watch {
        let leader = election.leader().await?;
        show(&name, leader.as_ref(), json);
        return Ok(leader.is_some());
    }
    let mut observer = election.observe();
    loop {
        match observer.next().await {
            Ok(leader) => show(&name, leader.as_ref(), json),
            // A blip of the backend: say so and keep watching (the observer resumes).
            Err(err) if err.is_temporary() => {
                note!("anylock: {err}; still watching");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err),
        }
    }
}

fn show(name: &LockName, leader: Option<&Leader>, json: bool) {
    if json {
        out!("{}", crate::terminal::json(&leader_json(name, leader)));
    } else {
        out!("{}", describe(name, leader));
    }
}

/// "NAME is led by OWNER (term T) since S; value V" or "NAME has no leader".
fn describe(name: &LockName, leader: Option<&Leader>) -> String {
    let shown = lockcore::display_safe(name.as_str());
    let Some(leader) = leader else {
        return format!("{shown} has no leader");
    };
    let mut text = format!("{shown} is led by {}", leader.owner());
    if let Some(term) = leader.term() {
        text.push_str(&format!(" (term {term})"));
    }
    if let Some(since) = leader.since() {
        text.push_str(&format!(" since {} ({} ago)", timestamp(since), ago(since)));
    }
    if let Some(value) = leader.value() {
        text.push_str(&format!("; value: {value}"));
    }
    text
}

/// `leader --json`: name, leader (bool), owner, term, since (RFC 3339), expires_in_ms,
/// value; unknown fields left out.
fn leader_json(name: &LockName, leader: Option<&Leader>) -> serde_json::Value {
    let mut object = serde_json::json!({ "name": name.as_str(), "leader": leader.is_some() });
    let Some(leader) = leader else {
        return object;
    };
    object["owner"] = leader.owner().to_string().into();
    if let Some(term) = leader.term() {
        object["term"] = term.get().into();
    }
    if let Some(since) = leader.since() {
        object["since"] = timestamp(since).into();
    }
    if let Some(left) = leader.expires_in() {
        object["expires_in_ms"] = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).into();
    }
    if let Some(value) = leader.value() {
        object["value"] = value.as_str().into();
    }
    object
}
