//! `list` on one node: `SCAN` pages, each followed by one read-only script call reading
//! the candidates ([`Node::list`]), within bounds a hostile server cannot stretch: each
//! reply is bounded ([`crate::limits`]), and so is the listing as a whole.

use lockcore::{Error, ErrorKind, LockName, Result};

use crate::client::Node;
use crate::error::{Call, malformed};
use crate::keys::{self, Found, LockKeys};
use crate::limits::{MAX_LISTED, MAX_PAGES};
use crate::pipeline::Batch;
use crate::replies::decode_many;
use crate::scripts::READ_MANY;

/// How many keys one `SCAN` call of a listing asks the server to look at (a hint; the
/// server may return somewhat more or fewer matches per page).
pub(crate) const SCAN_COUNT: usize = 500;

impl Node {
    /// Every lock held on this node under the key prefix `prefix` whose name starts with
    /// `name_prefix`, in no particular order (names may repeat: `SCAN` may return a key
    /// twice). Pages through `SCAN cursor MATCH pattern COUNT` ([`SCAN_COUNT`]), each page
    /// followed by one read-only script call that reads the candidates' values, `PTTL`s and
    /// notes; keys gone by then, fence, note and foreign keys are left out.
    ///
    /// # Errors
    /// As each call's; [`Protocol`](ErrorKind::Protocol) when the server answers the
    /// cursor it was given (a real server never does: the listing would not end), after
    /// [`MAX_PAGES`] pages, or past [`MAX_LISTED`] locks.
    pub(crate) async fn list(
        &self,
        prefix: &str,
        name_prefix: &str,
    ) -> Result<Vec<(LockName, Found)>> {
        let pattern = keys::lock_pattern(prefix, name_prefix);
        let mut held = Vec::new();
        let mut cursor = 0u64;
        for _ in 0..MAX_PAGES {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, found): (u64, Vec<Vec<u8>>) = self.query(Call::List, &scan).await?;
            let names: Vec<LockName> = found
                .iter()
                .filter_map(|key| keys::name_of_lock_key(prefix, name_prefix, key))
                .collect();
            held.extend(self.read(prefix, names).await?);
            if held.len() > MAX_LISTED {
                return Err(self.too_long(format!(
                    "list found more than {MAX_LISTED} held locks; list fewer at a time \
                     with a longer name prefix"
                )));
            }
            match next {
                0 => return Ok(held),
                same if same == cursor => {
                    return Err(self.too_long(
                        "SCAN answered the cursor it was given, so the listing would never \
                         end; is this a Redis server?",
                    ));
                }
                _ => cursor = next,
            }
        }
        Err(self.too_long(format!(
            "SCAN did not finish within {MAX_PAGES} pages; is this a Redis server?"
        )))
    }

    /// Reads the candidates `names` with one script call: those held, with what holds them.
    async fn read(&self, prefix: &str, names: Vec<LockName>) -> Result<Vec<(LockName, Found)>> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = Batch::default();
        let invocation = batch.call(&READ_MANY);
        for name in &names {
            let keys = LockKeys::new(prefix, name);
            invocation.key(keys.lock()).key(keys.note());
        }
        let reply = self.run(Call::List, &batch).await?;
        let read =
            decode_many(reply, names.len()).ok_or_else(|| malformed(Call::List, self.label()))?;
        Ok(names
            .into_iter()
            .zip(read)
            .filter_map(|(name, found)| Some((name, found?)))
            .collect())
    }

    fn too_long(&self, why: impl std::fmt::Display) -> Error {
        Error::new(
            ErrorKind::Protocol,
            format!("list on {}: {why}", self.label()),
        )
    }
}
