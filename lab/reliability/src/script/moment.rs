//! The moments a fault script waits for, seen in a group's register history: a holder's
//! grant, or its lease check right before a write.

use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, timeout};

use crate::backends::Workload;
use crate::group::Group;
use crate::history::{Event, Op};

/// Waits for the next event of `group` matching `wanted`, for at most 20 TTL.
async fn wait_for(
    group: &Group,
    w: Workload,
    what: &str,
    wanted: impl Fn(&Event) -> bool,
) -> Result<Event, String> {
    let mut events = group.register.subscribe();
    let limit = w.ttl * 20;
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, events.recv()).await {
            Ok(Ok(event)) if wanted(&event) => return Ok(event),
            Ok(Ok(_) | Err(RecvError::Lagged(_))) => {}
            Ok(Err(RecvError::Closed)) | Err(_) => {
                return Err(format!(
                    "{}: no {what} within {limit:?}: the fault was never applied",
                    group.mode.as_str()
                ));
            }
        }
    }
}

/// A holder that just checked its lease and is about to write (one of `clients`, if any).
pub(super) async fn trigger(group: &Group, w: Workload, clients: &[u32]) -> Result<Event, String> {
    let needed = u64::try_from((w.step + w.margin).as_millis()).unwrap_or(u64::MAX);
    wait_for(group, w, "lease check before a write", |e| {
        let ok = matches!(e.op, Op::Check { held: true, remaining_ms } if remaining_ms >= needed);
        ok && (clients.is_empty() || clients.contains(&e.id.client))
    })
    .await
}

/// A client that was just granted the lock.
pub(super) async fn begun(group: &Group, w: Workload) -> Result<Event, String> {
    wait_for(group, w, "grant", |e| {
        matches!(e.op, Op::Begin { accepted: true, .. })
    })
    .await
}
