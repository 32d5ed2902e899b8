//! Owner identities.
//!
//! An identity names the owner of a lease. It is what backends store and compare, and what
//! people see in `inspect`. Its canonical form is `host/pid/random[/task]`:
//!
//! - `random`: 64 random bits drawn once per process, so two processes never share an
//!   identity even when pids are reused or hosts share a name;
//! - `host` and `pid`: for people reading `inspect` output, not for correctness;
//! - `task`: an optional suffix. Seed 000 (Vault) shows that a process-unique identity is
//!   multi-process safe but *not* task safe: two tasks sharing an identity could both take
//!   the lock through same-identity instant retake. [`Locker`](crate::Locker) therefore gives
//!   every acquisition its own task suffix unless you choose an identity yourself.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::Error;

/// The longest task suffix accepted, in bytes.
pub const MAX_TASK_LEN: usize = 128;

/// The identity of a lease owner. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identity(Arc<str>);

static PROCESS: OnceLock<Identity> = OnceLock::new();
static NEXT_TASK: AtomicU64 = AtomicU64::new(1);

impl Identity {
    /// This process's identity: `host/pid/random`, the same for every call.
    pub fn process() -> Identity {
        PROCESS
            .get_or_init(|| {
                let host = hostname();
                let pid = std::process::id();
                let random: u64 = rand::random();
                Identity(Arc::from(format!("{host}/{pid}/{random:016x}")))
            })
            .clone()
    }

    /// This process's identity with a task suffix, for code that wants same-identity
    /// instant retake to work for one logical task (a worker, a job id).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when `task` is empty, longer
    /// than [`MAX_TASK_LEN`] bytes, or contains a control character.
    pub fn for_task(task: &str) -> Result<Identity, Error> {
        Self::process().with_task(task)
    }

    /// This process's identity with a suffix no other call in this process returns.
    pub fn unique() -> Identity {
        let n = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
        Identity(Arc::from(format!("{}/t{n}", Self::process().0)))
    }

    /// This identity with `task` appended.
    ///
    /// # Errors
    /// As for [`Identity::for_task`].
    pub fn with_task(&self, task: &str) -> Result<Identity, Error> {
        if task.is_empty() || task.len() > MAX_TASK_LEN {
            return Err(Error::invalid_input(format!(
                "identity task suffix must be 1 to {MAX_TASK_LEN} bytes, got {}",
                task.len()
            )));
        }
        if task.chars().any(char::is_control) {
            return Err(Error::invalid_input(
                "identity task suffix contains a control character",
            ));
        }
        Ok(Identity(Arc::from(format!("{}/{task}", self.0))))
    }

    /// Rebuilds an identity from its stored string form (as read back from a backend).
    pub fn from_stored(stored: impl Into<Arc<str>>) -> Identity {
        Identity(stored.into())
    }

    /// The canonical string backends store and compare.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `host/pid` part, for people.
    pub fn host_pid(&self) -> &str {
        let mut cut = self.0.match_indices('/').map(|(i, _)| i);
        match (cut.next(), cut.next()) {
            (Some(_), Some(second)) => &self.0[..second],
            _ => &self.0,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
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
    fn task_suffix_is_validated() {
        let id = Identity::for_task("worker-1").expect("valid");
        assert!(id.as_str().ends_with("/worker-1"));
        assert_eq!(id, Identity::for_task("worker-1").expect("valid"));
        assert!(Identity::for_task("").is_err());
        assert!(Identity::for_task("a\nb").is_err());
        assert!(Identity::for_task(&"x".repeat(MAX_TASK_LEN + 1)).is_err());
    }
}
