//! Owner identities.
//!
//! An identity names the owner of a lease. It is what backends store and compare, and what
//! people see in `inspect`. Its canonical form is `host/pid/random[/task]`:
//!
//! - `random`: 64 random bits drawn once per process (and again in a child after `fork()`,
//!   detected by its new pid, for identities drawn after the fork: an `Identity` value
//!   made before the fork, such as a `Locker`'s fixed one, is a plain copy in the child,
//!   and a forked child must not share a lock with its parent through it), so two
//!   processes never share an
//!   identity even when pids are reused or hosts share a name;
//! - `host` and `pid`: for people reading `inspect` output, not for correctness;
//! - `task`: an optional suffix. Lai's GCS locking post (on Vault) shows that a
//!   process-unique identity is multi-process safe but *not* task safe: two tasks sharing an
//!   identity could both take the lock through same-identity instant retake.
//!   [`Locker`](crate::Locker) therefore gives every acquisition its own task suffix unless
//!   you choose an identity yourself.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::invalid::Invalid;

/// The prefix of the suffixes [`Identity::unique`] generates; task suffixes may not start
/// with it, so an identity built with [`Identity::with_task`] never equals a generated one
/// ([`Identity::from_stored`] rebuilds any stored string and is not checked).
pub const AUTO_PREFIX: &str = "~auto-";

/// The longest task suffix accepted, in bytes.
pub const MAX_TASK_LEN: usize = 128;

/// The prefix of every identity [`Identity::named`] builds. Process identities start with a
/// host name, which never contains `~`, so a named identity never equals one of them.
pub const NAMED_PREFIX: &str = "~owner/";

/// The longest owner id [`Identity::named`] accepts, in bytes.
pub const MAX_NAMED_LEN: usize = 128;

/// The identity of a lease owner. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identity(Arc<str>);

/// The process identity and the pid it was drawn for.
static PROCESS: Mutex<Option<(u32, Identity)>> = Mutex::new(None);
static NEXT_TASK: AtomicU64 = AtomicU64::new(1);

impl Identity {
    /// This process's identity: `host/pid/random`, the same for every call.
    pub fn process() -> Identity {
        cached_process(&PROCESS, std::process::id())
    }

    /// This process's identity with a task suffix, for code that wants same-identity
    /// instant retake to work for one logical task (a worker, a job id).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when `task` is empty, longer
    /// than [`MAX_TASK_LEN`] bytes, starts with [`AUTO_PREFIX`], or contains a control
    /// character.
    pub fn for_task(task: &str) -> Result<Identity, Invalid> {
        Self::process().with_task(task)
    }

    /// This process's identity with a suffix no other call in this process returns, and
    /// that no task suffix can spell: it starts with [`AUTO_PREFIX`], which
    /// [`with_task`](Self::with_task) refuses.
    pub fn unique() -> Identity {
        let n = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
        Identity(Arc::from(format!("{}/{AUTO_PREFIX}{n}", Self::process().0)))
    }

    /// This identity with `task` appended.
    ///
    /// # Errors
    /// As for [`Identity::for_task`].
    pub fn with_task(&self, task: &str) -> Result<Identity, Invalid> {
        if task.is_empty() || task.len() > MAX_TASK_LEN {
            return Err(Invalid::new(format!(
                "identity task suffix must be 1 to {MAX_TASK_LEN} bytes, got {}",
                task.len()
            )));
        }
        if task.starts_with(AUTO_PREFIX) {
            return Err(Invalid::new(format!(
                "identity task suffix must not start with {AUTO_PREFIX:?}: that prefix marks \
                 the suffixes Identity::unique generates"
            )));
        }
        if task.chars().any(char::is_control) {
            return Err(Invalid::new(
                "identity task suffix contains a control character",
            ));
        }
        Ok(Identity(Arc::from(format!("{}/{task}", self.0))))
    }

    /// An identity chosen by the user, the same in every process on every machine that
    /// names the same `id`: `~owner/ID`. For a lock held across processes (one CI step
    /// acquires, a later step on another runner verifies or releases).
    ///
    /// Same-owner retake makes every holder of the same id the same owner: two jobs that
    /// pick the same id both get the lock. Choose an id unique to one job run (a CI run id
    /// and attempt).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when `id` is empty,
    /// longer than [`MAX_NAMED_LEN`] bytes, starts with [`AUTO_PREFIX`], or contains
    /// whitespace or a control character.
    pub fn named(id: &str) -> Result<Identity, Invalid> {
        if id.is_empty() || id.len() > MAX_NAMED_LEN {
            return Err(Invalid::new(format!(
                "owner id must be 1 to {MAX_NAMED_LEN} bytes, got {}",
                id.len()
            )));
        }
        if id.starts_with(AUTO_PREFIX) {
            return Err(Invalid::new(format!(
                "owner id must not start with {AUTO_PREFIX:?}: that prefix marks generated \
                 identities"
            )));
        }
        if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(Invalid::new(
                "owner id contains whitespace or a control character; use letters, digits \
                 and punctuation such as `-`, `_`, `.`, `:`",
            ));
        }
        Ok(Identity(Arc::from(format!("{NAMED_PREFIX}{id}"))))
    }

    /// The id given to [`Identity::named`], when this identity was built by it.
    pub fn named_id(&self) -> Option<&str> {
        self.0.strip_prefix(NAMED_PREFIX)
    }

    /// Rebuilds an identity from its stored string form (as read back from a backend).
    pub fn from_stored(stored: impl Into<Arc<str>>) -> Identity {
        Identity(stored.into())
    }

    /// The canonical string backends store and compare.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `host/pid` part, for people; a [named](Identity::named) identity whole.
    ///
    /// Raw, as stored: print it through [`display_safe`](crate::display_safe).
    pub fn host_pid(&self) -> &str {
        if self.named_id().is_some() {
            return &self.0;
        }
        let mut cut = self.0.match_indices('/').map(|(i, _)| i);
        match (cut.next(), cut.next()) {
            (Some(_), Some(second)) => &self.0[..second],
            _ => &self.0,
        }
    }
}

/// For people: characters [unsafe to show](crate::is_unsafe_to_show) (an owner read back
/// from a server may hold terminal escapes) become U+FFFD. Backends store and compare
/// [`as_str`](Identity::as_str), never this.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::display_safe(&self.0))
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// The identity cached for `pid`, drawn anew when the pid differs: a child made by
/// `fork()` inherits the parent's memory, and must not inherit its identity too, or
/// same-identity retake would hand one lock to both processes.
fn cached_process(cache: &Mutex<Option<(u32, Identity)>>, pid: u32) -> Identity {
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, identity)) = cache.as_ref().filter(|(cached, _)| *cached == pid) {
        return identity.clone();
    }
    let random: u64 = rand::random();
    let identity = Identity(Arc::from(format!("{}/{pid}/{random:016x}", hostname())));
    *cache = Some((pid, identity.clone()));
    identity
}

fn hostname() -> String {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(64)
        .collect();
    if clean.is_empty() {
        "unknown-host".to_owned()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_identity_is_stable_and_readable() {
        let a = Identity::process();
        assert_eq!(a, Identity::process());
        let parts: Vec<&str> = a.as_str().split('/').collect();
        assert_eq!(parts.len(), 3, "{a}");
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2].len(), 16);
        assert_eq!(a.host_pid(), format!("{}/{}", parts[0], parts[1]));
    }

    #[test]
    fn unique_identities_differ_but_share_the_process_part() {
        let a = Identity::unique();
        let b = Identity::unique();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with(Identity::process().as_str()));
        assert_eq!(a.host_pid(), Identity::process().host_pid());
    }

    #[test]
    fn a_task_suffix_can_never_equal_an_auto_generated_identity() {
        for _ in 0..5 {
            let auto = Identity::unique();
            let suffix = auto.as_str().rsplit('/').next().expect("has a suffix");
            if let Ok(chosen) = Identity::for_task(suffix) {
                assert_ne!(chosen, auto, "for_task({suffix:?}) collided");
            }
        }
    }

    #[test]
    fn a_forked_child_draws_a_new_process_identity() {
        let cache = Mutex::new(None);
        let parent = cached_process(&cache, 100);
        assert_eq!(
            parent,
            cached_process(&cache, 100),
            "stable within a process"
        );
        let child = cached_process(&cache, 101);
        assert_ne!(child, parent, "a new pid (after fork) gets a new identity");
        let random = |id: &Identity| id.as_str().rsplit('/').next().map(str::to_owned);
        assert_ne!(
            random(&child),
            random(&parent),
            "the random part is drawn again"
        );
    }

    #[test]
    fn a_named_identity_is_the_same_in_every_process_and_never_a_process_one() {
        let a = Identity::named("ci-run-42:1").expect("valid");
        assert_eq!(a.as_str(), "~owner/ci-run-42:1");
        assert_eq!(a, Identity::named("ci-run-42:1").expect("valid"));
        assert_eq!(a, Identity::from_stored("~owner/ci-run-42:1"));
        assert_eq!(a.named_id(), Some("ci-run-42:1"));
        assert_eq!(a.host_pid(), "~owner/ci-run-42:1");
        assert!(!a.as_str().contains(&std::process::id().to_string()));
        assert_eq!(Identity::process().named_id(), None);
        assert_ne!(Identity::named("x").expect("valid"), Identity::unique());
        assert!(!Identity::process().as_str().starts_with('~'));
    }

    #[test]
    fn a_named_identity_is_validated() {
        assert!(Identity::named("a/b@c.d+e").is_ok());
        assert!(Identity::named(&"x".repeat(MAX_NAMED_LEN)).is_ok());
        for bad in ["", "a b", "a\tb", "a\nb", "\u{7f}", "\u{a0}x"] {
            let err = Identity::named(bad).expect_err(bad);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(Identity::named(&"x".repeat(MAX_NAMED_LEN + 1)).is_err());
        assert!(Identity::named(&format!("{AUTO_PREFIX}1")).is_err());
    }

    #[test]
    fn task_suffix_is_validated() {
        let id = Identity::for_task("worker-1").expect("valid");
        assert!(id.as_str().ends_with("/worker-1"));
        assert_eq!(id, Identity::for_task("worker-1").expect("valid"));
        assert!(Identity::for_task("").is_err());
        assert!(Identity::for_task("a\nb").is_err());
        assert!(Identity::for_task(&format!("{AUTO_PREFIX}1")).is_err());
        assert!(Identity::for_task(&"x".repeat(MAX_TASK_LEN + 1)).is_err());
    }
}
