//! The lease health state machine: pure transitions, no runtime, no clock.
//!
//! Rules (Lai, "A robust distributed locking algorithm based on Google Cloud Storage",
//! sections "Refresh failures" and "Detecting unexpected releases"):
//! - a successful refresh makes a live lease [`Health::Healthy`] again;
//! - a transient failure makes it [`Health::Degraded`] with the count of consecutive
//!   failures, and [`Health::Lost`] once the count reaches the limit;
//! - unexpected state (deleted, stolen, precondition failed) is `Lost` at once;
//! - a permanent refresh error (permission revoked, malformed reply) is `Lost` at once;
//! - the local validity deadline passing is `Lost`, whatever the backend says or doesn't;
//! - [`Health::Lost`] and [`Health::Released`] are terminal.
//!
//! The keeper (`keeper.rs`) and `held.rs` turn timers and backend replies into [`Event`]s.

use std::fmt;

use crate::error::{Error, ErrorKind};

/// The health of a held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The last refresh succeeded (or none was due yet).
    Healthy,
    /// The last `failures` refreshes failed transiently; the lease is still valid locally.
    Degraded {
        /// Consecutive transient failures so far.
        failures: u32,
    },
    /// The lease is gone or can no longer be trusted: stop the critical section.
    Lost(LostReason),
    /// The lease was released through the guard.
    Released,
}

impl Health {
    /// `true` for `Healthy` and `Degraded`: the lease is still believed to be ours.
    pub fn is_held(&self) -> bool {
        matches!(self, Self::Healthy | Self::Degraded { .. })
    }

    /// `true` for `Lost` and `Released`.
    pub fn is_terminal(&self) -> bool {
        !self.is_held()
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Healthy => f.write_str("healthy"),
            Self::Degraded { failures } => write!(f, "degraded ({failures} refresh failures)"),
            Self::Lost(reason) => write!(f, "lost: {reason}"),
            Self::Released => f.write_str("released"),
        }
    }
}

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The backend says the lock is no longer ours: deleted, taken over, owner changed.
    NotOwner(String),
    /// The local validity deadline passed before a refresh succeeded.
    ValidityExpired,
    /// This many consecutive refreshes failed transiently.
    TooManyFailures {
        /// The number of consecutive failures.
        failures: u32,
        /// The last failure's message.
        last: String,
    },
    /// A refresh failed with a permanent error (permission revoked, malformed reply).
    RefreshFailed(String),
    /// The refresher stopped unexpectedly (its runtime shut down).
    RefresherStopped,
}

impl LostReason {
    /// Whether the lease may still be ours on the server, so a compare-and-delete release
    /// is worth attempting. `false` when the backend said someone else owns it now.
    pub fn may_still_be_held(&self) -> bool {
        !matches!(self, Self::NotOwner(_))
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotOwner(m) => write!(f, "no longer the owner ({m})"),
            Self::ValidityExpired => f.write_str("validity expired before a refresh succeeded"),
            Self::TooManyFailures { failures, last } => {
                write!(f, "{failures} consecutive refresh failures (last: {last})")
            }
            Self::RefreshFailed(m) => write!(f, "refresh failed permanently ({m})"),
            Self::RefresherStopped => f.write_str("the lease refresher stopped"),
        }
    }
}

/// Something that happened to a held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A refresh succeeded.
    Refreshed,
    /// A refresh failed in a way worth retrying.
    TransientFailure(String),
    /// The backend reported the lock is no longer ours.
    NotOwner(String),
    /// A refresh failed permanently.
    PermanentFailure(String),
    /// The local validity deadline passed.
    ValidityExpired,
    /// The holder released the lease.
    Released,
}

impl Event {
    /// Classifies a refresh error: `Lost` is [`Event::NotOwner`], temporary errors
    /// (including outcome unknown) are transient, everything else is permanent.
    pub fn from_refresh_error(err: &Error) -> Event {
        let message = err.to_string();
        if err.kind() == ErrorKind::Lost {
            Event::NotOwner(message)
        } else if err.is_temporary() {
            Event::TransientFailure(message)
        } else {
            Event::PermanentFailure(message)
        }
    }
}

/// Applies `event` to `health`; `max_failures` is the consecutive transient failure limit.
pub fn transition(health: &Health, event: Event, max_failures: u32) -> Health {
    if health.is_terminal() {
        return health.clone();
    }
    match event {
        Event::Refreshed => Health::Healthy,
        Event::TransientFailure(last) => {
            let failures = match health {
                Health::Degraded { failures } => failures.saturating_add(1),
                _ => 1,
            };
            if failures >= max_failures {
                Health::Lost(LostReason::TooManyFailures { failures, last })
            } else {
                Health::Degraded { failures }
            }
        }
        Event::NotOwner(m) => Health::Lost(LostReason::NotOwner(m)),
        Event::PermanentFailure(m) => Health::Lost(LostReason::RefreshFailed(m)),
        Event::ValidityExpired => Health::Lost(LostReason::ValidityExpired),
        Event::Released => Health::Released,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: &Health, e: Event) -> Health {
        transition(h, e, 3)
    }

    fn transient() -> Event {
        Event::TransientFailure("timeout".into())
    }

    #[test]
    fn healthy_stays_healthy_on_refresh() {
        assert_eq!(t(&Health::Healthy, Event::Refreshed), Health::Healthy);
    }

    #[test]
    fn transient_failures_degrade_then_lose_at_the_limit() {
        let h1 = t(&Health::Healthy, transient());
        assert_eq!(h1, Health::Degraded { failures: 1 });
        let h2 = t(&h1, transient());
        assert_eq!(h2, Health::Degraded { failures: 2 });
        let h3 = t(&h2, transient());
        assert_eq!(
            h3,
            Health::Lost(LostReason::TooManyFailures {
                failures: 3,
                last: "timeout".into()
            })
        );
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let h = t(&Health::Degraded { failures: 2 }, Event::Refreshed);
        assert_eq!(h, Health::Healthy);
        assert_eq!(t(&h, transient()), Health::Degraded { failures: 1 });
    }

    #[test]
    fn a_limit_of_one_loses_on_the_first_failure() {
        let h = transition(&Health::Healthy, transient(), 1);
        assert!(matches!(
            h,
            Health::Lost(LostReason::TooManyFailures { failures: 1, .. })
        ));
    }

    #[test]
    fn unexpected_state_is_lost_at_once_from_any_live_state() {
        for start in [Health::Healthy, Health::Degraded { failures: 2 }] {
            let h = t(&start, Event::NotOwner("deleted".into()));
            assert_eq!(h, Health::Lost(LostReason::NotOwner("deleted".into())));
        }
    }

    #[test]
    fn permanent_failure_is_lost_at_once() {
        let h = t(&Health::Healthy, Event::PermanentFailure("denied".into()));
        assert_eq!(h, Health::Lost(LostReason::RefreshFailed("denied".into())));
    }

    #[test]
    fn validity_expiry_is_lost_from_any_live_state() {
        for start in [Health::Healthy, Health::Degraded { failures: 1 }] {
            assert_eq!(
                t(&start, Event::ValidityExpired),
                Health::Lost(LostReason::ValidityExpired)
            );
        }
    }

    #[test]
    fn release_is_terminal_from_live_states() {
        assert_eq!(t(&Health::Healthy, Event::Released), Health::Released);
        assert_eq!(
            t(&Health::Degraded { failures: 1 }, Event::Released),
            Health::Released
        );
    }

    #[test]
    fn terminal_states_absorb_every_event() {
        let lost = Health::Lost(LostReason::ValidityExpired);
        let events = [
            Event::Refreshed,
            transient(),
            Event::NotOwner("x".into()),
            Event::PermanentFailure("x".into()),
            Event::ValidityExpired,
            Event::Released,
        ];
        for e in events {
            assert_eq!(t(&lost, e.clone()), lost);
            assert_eq!(t(&Health::Released, e), Health::Released);
        }
    }

    #[test]
    fn refresh_errors_are_classified() {
        let lost = Error::lost("stolen");
        assert!(matches!(
            Event::from_refresh_error(&lost),
            Event::NotOwner(_)
        ));
        let net = Error::unavailable("reset");
        assert!(matches!(
            Event::from_refresh_error(&net),
            Event::TransientFailure(_)
        ));
        let unknown = Error::new(ErrorKind::OutcomeUnknown, "timeout after send");
        assert!(matches!(
            Event::from_refresh_error(&unknown),
            Event::TransientFailure(_)
        ));
        let denied = Error::new(ErrorKind::PermissionDenied, "no");
        assert!(matches!(
            Event::from_refresh_error(&denied),
            Event::PermanentFailure(_)
        ));
    }

    #[test]
    fn only_not_owner_rules_out_a_release() {
        assert!(!LostReason::NotOwner("x".into()).may_still_be_held());
        assert!(LostReason::ValidityExpired.may_still_be_held());
        assert!(LostReason::RefreshFailed("x".into()).may_still_be_held());
    }

    #[test]
    fn health_display_is_readable() {
        assert_eq!(
            Health::Degraded { failures: 2 }.to_string(),
            "degraded (2 refresh failures)"
        );
        assert!(
            Health::Lost(LostReason::ValidityExpired)
                .to_string()
                .starts_with("lost: ")
        );
    }
}
