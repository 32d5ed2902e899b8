//! The anylock conformance suite: one set of cases every backend must pass against a real
//! server, with its [`report`]s. The fault proxy, the shared-server settings and the other
//! test plumbing live in `anylock-test-kit` (`test_kit`).
//!
//! A backend crate implements [`Harness`] in its `tests/` and stamps one `#[tokio::test]`
//! per case with [`suite!`]:
//!
//! ```ignore
//! // backend-foo/tests/conformance.rs
//! async fn harness() -> FooHarness { FooHarness::from_env().await }
//! conformance::suite!(harness().await);
//! ```
//!
//! Every case records its outcome, duration and measurements in
//! `target/conformance/<label>.jsonl` (see [`report`]); the README's comparison table is
//! generated from those results and the backends' [`Guarantees`](lockcore::Guarantees).
//! [`CLAIMS`] maps every promise a descriptor can make to the cases that verify it.

pub mod cases;
mod harness;
pub mod report;

pub use harness::{Cuttable, Harness, MemoryHarness, Outage, Timing};
pub use report::{Report, run_case};

/// The one list of cases, in the order the suite stamps them (the precondition canary
/// first): calls `$callback!($($args)* ; case, case, …)`. [`CASES`] and [`suite!`] are both
/// made from it, so a case cannot be listed in one and missing from the other.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:path; $($args:tt)*) => {
        $callback!($($args)*;
            canary_conditional_create,
            acquire_release_reacquire,
            mutual_exclusion_under_contention,
            waiting_acquire_gets_the_lock_after_release,
            waiting_acquire_times_out,
            expiry_frees_a_crashed_holder,
            refresh_keeps_the_lease_beyond_its_ttl,
            stale_lease_cannot_release,
            stale_lease_cannot_refresh,
            refresh_many_answers_each_lease,
            fence_tokens_strictly_increase,
            deleted_lock_turns_the_guard_lost,
            stolen_lock_turns_the_guard_lost,
            unreachable_backend_degrades_then_loses,
            unreachable_backend_recovers,
            same_identity_instant_retake,
            bad_names_and_options_are_rejected,
            dropped_acquire_leaves_nothing_held,
            many_names_held_at_once,
            inspect_shows_the_holder,
            note_is_stored_with_the_grant,
            list_shows_held_locks,
            handoff_latency,
            notification_claim,
            fifo_claim,
            durability_claim,
            permits_admit_at_most_n,
            permits_never_exceed_n_under_contention,
            expired_permits_free_their_places,
            released_permit_frees_its_place,
            stale_permit_cannot_release_or_refresh,
            same_owner_retakes_its_permit,
            mixed_permit_limits_are_refused,
            permit_waiter_gets_a_released_place,
            refresh_keeps_a_permit_beyond_its_ttl,
            a_permit_and_the_lock_of_its_name_are_apart,
            refresh_many_mixes_locks_and_permits,
            one_leader_at_a_time_and_terms_rise,
            a_crashed_leader_is_replaced_within_ttl,
            observers_see_each_term,
        );
    };
}

macro_rules! case_names {
    (; $($case:ident),* $(,)?) => {
        /// Every case, in the order the suite stamps them (the precondition canary first).
        pub const CASES: &[&str] = &[$(stringify!($case)),*];
    };
}
__with_cases!(case_names;);

/// A promise a [`Guarantees`](lockcore::Guarantees) descriptor can make, and the cases
/// that fail when a backend makes it without keeping it.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    /// The descriptor field.
    pub field: &'static str,
    /// The promising value.
    pub value: &'static str,
    /// The cases that verify it.
    pub cases: &'static [&'static str],
    /// What the cases cannot check, for people.
    pub caveat: &'static str,
}

/// Every promise and the cases that check it.
pub const CLAIMS: &[Claim] = &[
    Claim {
        field: "exclusion",
        value: "any",
        cases: &[
            "canary_conditional_create",
            "mutual_exclusion_under_contention",
            "stale_lease_cannot_release",
        ],
        caveat: "under faults, exclusion is measured by the reliability harness",
    },
    Claim {
        field: "fencing",
        value: "Monotonic",
        cases: &[
            "fence_tokens_strictly_increase",
            "mutual_exclusion_under_contention",
        ],
        caveat: "",
    },
    Claim {
        field: "expiry_clock",
        value: "Server",
        cases: &["expiry_frees_a_crashed_holder"],
        caveat: "checks expiry timing only; client clock jumps are replayed by the reliability harness",
    },
    Claim {
        field: "waiting",
        value: "Notified",
        cases: &["notification_claim"],
        caveat: "",
    },
    Claim {
        field: "fairness",
        value: "Fifo",
        cases: &["fifo_claim"],
        caveat: "",
    },
    Claim {
        field: "same_owner_retake",
        value: "true",
        cases: &["same_identity_instant_retake"],
        caveat: "",
    },
    Claim {
        field: "listing",
        value: "true",
        cases: &["list_shows_held_locks"],
        caveat: "",
    },
    Claim {
        field: "semaphores",
        value: "Supported",
        cases: &[
            "permits_admit_at_most_n",
            "permits_never_exceed_n_under_contention",
            "expired_permits_free_their_places",
            "released_permit_frees_its_place",
            "stale_permit_cannot_release_or_refresh",
            "same_owner_retakes_its_permit",
            "mixed_permit_limits_are_refused",
            "permit_waiter_gets_a_released_place",
            "refresh_keeps_a_permit_beyond_its_ttl",
            "a_permit_and_the_lock_of_its_name_are_apart",
            "refresh_many_mixes_locks_and_permits",
        ],
        caveat: "contention comes from tasks of one process; under faults, permits are not yet in the reliability harness",
    },
    Claim {
        field: "durability",
        value: "SurvivesRestart",
        cases: &["durability_claim"],
        caveat: "",
    },
];

/// Stamps one `#[tokio::test]` per conformance case. The argument is an expression,
/// evaluated inside each test's async body (so it may `.await`), that yields a
/// [`Harness`]. The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a
/// dev-dependency.
#[macro_export]
macro_rules! suite {
    ($make:expr) => {
        $crate::__with_cases!($crate::suite; @cases $make);
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::run_case(&harness, stringify!($case), $crate::cases::$case).await;
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_claim_names_existing_cases() {
        for claim in CLAIMS {
            assert!(!claim.cases.is_empty(), "{} has no case", claim.field);
            for case in claim.cases {
                assert!(CASES.contains(case), "{}: unknown case {case}", claim.field);
            }
        }
    }

    #[test]
    fn every_promising_descriptor_field_has_a_claim() {
        for field in [
            "exclusion",
            "fencing",
            "expiry_clock",
            "waiting",
            "fairness",
            "same_owner_retake",
            "durability",
            "listing",
            "semaphores",
        ] {
            assert!(
                CLAIMS.iter().any(|c| c.field == field),
                "{field} is unchecked"
            );
        }
    }
}
