//! `list`: the held locks under a prefix, one `objects.list` request per 1000 objects.

use std::time::SystemTime;

use lockcore::{HeldLock, LockName, Result};

use super::GcsBackend;
use crate::config::MAX_OBJECT_NAME_LEN;
use crate::error::protocol;
use crate::object::LockObject;

impl GcsBackend {
    /// Pages through `objects.list` under the configured prefix + `prefix` (GCS matches
    /// prefixes byte for byte: no pattern language to escape) and keeps the objects
    /// `inspect` would report, judged stale or not on each page's `Date`.
    pub(super) async fn try_list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let base = self.config().prefix();
        let under = format!("{base}{prefix}");
        if under.len() > MAX_OBJECT_NAME_LEN {
            return Ok(Vec::new()); // no object name is that long
        }
        let mut held = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self.client.list(&under, token.as_deref()).await?;
            held.extend(
                page.items
                    .iter()
                    .filter_map(|item| held_lock(item, base, prefix, page.date)),
            );
            match page.next_page_token {
                None => break,
                Some(next) if token.as_deref() == Some(next.as_str()) => {
                    return Err(protocol("GCS answered the same list page token twice"));
                }
                next => token = next,
            }
        }
        held.sort_by(|a, b| a.name().as_str().cmp(b.name().as_str()));
        held.dedup_by(|a, b| a.name() == b.name());
        Ok(held)
    }
}

/// The held lock a list item stands for, as `inspect` would report it at server time
/// `date`; `None` for a stale grant, and for an item that is not a lock object under
/// `base + prefix` (a name that is no lock name, a resource without a valid generation or
/// `updated`): one odd object never spoils the listing.
fn held_lock(
    item: &serde_json::Value,
    base: &str,
    prefix: &str,
    date: SystemTime,
) -> Option<HeldLock> {
    let object = item.get("name")?.as_str()?;
    let name = object.strip_prefix(base)?;
    if !name.starts_with(prefix) {
        return None;
    }
    let name = LockName::new(name).ok()?;
    let obj = LockObject::from_json(item).ok()?;
    (!obj.is_stale(date)).then(|| HeldLock::new(name, obj.holder(Some(date))))
}
