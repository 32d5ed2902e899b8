//! Proof that the suite can fail: each deliberately broken `MemoryBackend` variant must fail
//! the case written to catch it, while an unrelated basic case still passes (so the failure
//! is the defect being caught, not a variant broken across the board).

use std::panic::AssertUnwindSafe;

use conformance::{Harness, MemoryHarness, Report, cases};
use futures_util::FutureExt;
use lockcore::Defect;

/// Runs `case` on a harness with `defect` and returns its failure message.
async fn failure_of<F>(defect: Defect, case: F) -> String
where
    F: AsyncFnOnce(&dyn Harness) -> Report,
{
    let harness = MemoryHarness::with_defect(defect);
    let limit = harness.timing().case_limit;
    let run = AssertUnwindSafe(case(&harness)).catch_unwind();
    match tokio::time::timeout(limit, run).await {
        Ok(Ok(_)) => panic!("{defect:?} passed the case meant to catch it"),
        Ok(Err(panic)) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default(),
        Err(_) => panic!("{defect:?}: the case hung instead of failing"),
    }
}

/// The variant is otherwise a working lock.
async fn still_basically_works(defect: Defect) {
    let harness = MemoryHarness::with_defect(defect);
    cases::acquire_release_reacquire(&harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_comparing_only_the_owner_is_caught() {
    let message = failure_of(
        Defect::ReleaseChecksOwnerOnly,
        cases::same_identity_instant_retake,
    )
    .await;
    assert!(message.contains("removed the retake"), "{message}");
    still_basically_works(Defect::ReleaseChecksOwnerOnly).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_ignoring_the_owner_is_caught() {
    let message = failure_of(
        Defect::ReleaseIgnoresOwner,
        cases::stale_lease_cannot_release,
    )
    .await;
    assert!(
        message.contains("deleted the newer holder's lock"),
        "{message}"
    );
    still_basically_works(Defect::ReleaseIgnoresOwner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_never_expire_are_caught() {
    let message = failure_of(Defect::NeverExpires, cases::expiry_frees_a_crashed_holder).await;
    assert!(message.contains("freed within TTL + slack"), "{message}");
    still_basically_works(Defect::NeverExpires).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_monotonic_fence_tokens_are_caught() {
    let message = failure_of(
        Defect::NonMonotonicTokens,
        cases::fence_tokens_strictly_increase,
    )
    .await;
    assert!(
        message.contains("fence token did not increase"),
        "{message}"
    );
    still_basically_works(Defect::NonMonotonicTokens).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_after_a_steal_is_caught() {
    let message = failure_of(
        Defect::RefreshIgnoresOwner,
        cases::stale_lease_cannot_refresh,
    )
    .await;
    assert!(message.contains("a stale lease was refreshed"), "{message}");
    let message = failure_of(
        Defect::RefreshIgnoresOwner,
        cases::stolen_lock_turns_the_guard_lost,
    )
    .await;
    assert!(message.contains("not Lost"), "{message}");
    still_basically_works(Defect::RefreshIgnoresOwner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refresh_matching_by_name_is_caught() {
    let message = failure_of(
        Defect::BatchRefreshMatchesName,
        cases::refresh_many_answers_each_lease,
    )
    .await;
    assert!(
        message.contains("a batch refreshed a released lease"),
        "{message}"
    );
    still_basically_works(Defect::BatchRefreshMatchesName).await;
    let message = failure_of(
        Defect::BatchAnswersReversed,
        cases::refresh_many_answers_each_lease,
    )
    .await;
    assert!(message.contains("answers another lock"), "{message}");
    still_basically_works(Defect::BatchAnswersReversed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racy_acquire_is_caught() {
    let message = failure_of(Defect::RacyAcquire, cases::canary_conditional_create).await;
    assert!(
        message.contains("2 of 2 simultaneous conditional creates won"),
        "{message}"
    );
    let message = failure_of(
        Defect::RacyAcquire,
        cases::mutual_exclusion_under_contention,
    )
    .await;
    assert!(message.contains("overlapping holders"), "{message}");
    still_basically_works(Defect::RacyAcquire).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_expired_leases_is_caught() {
    let message = failure_of(Defect::ListsExpired, cases::list_shows_held_locks).await;
    assert!(message.contains("list("), "{message}");
    still_basically_works(Defect::ListsExpired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_with_an_unescaped_pattern_is_caught() {
    let message = failure_of(Defect::ListReadsPatterns, cases::list_shows_held_locks).await;
    assert!(message.contains("prefix \"a_\""), "{message}");
    still_basically_works(Defect::ListReadsPatterns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_lost_on_refresh_is_caught() {
    let message = failure_of(
        Defect::RefreshDropsNote,
        cases::note_is_stored_with_the_grant,
    )
    .await;
    assert!(message.contains("lost by a refresh"), "{message}");
    still_basically_works(Defect::RefreshDropsNote).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_outliving_its_grant_is_caught() {
    let message = failure_of(
        Defect::NoteOutlivesGrant,
        cases::note_is_stored_with_the_grant,
    )
    .await;
    assert!(message.contains("outlived it"), "{message}");
    still_basically_works(Defect::NoteOutlivesGrant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_too_many_is_caught() {
    let message = failure_of(Defect::PermitOverGrant, cases::permits_admit_at_most_n).await;
    assert!(message.contains("a fourth permit of 3"), "{message}");
    let message = failure_of(
        Defect::PermitOverGrant,
        cases::permits_never_exceed_n_under_contention,
    )
    .await;
    assert!(message.contains("holders of a semaphore of 3"), "{message}");
    still_basically_works(Defect::PermitOverGrant).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_permit_is_caught() {
    let message = failure_of(
        Defect::PermitReleaseKeeps,
        cases::released_permit_frees_its_place,
    )
    .await;
    assert!(message.contains("still holds its place"), "{message}");
    still_basically_works(Defect::PermitReleaseKeeps).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leaders_and_repeated_terms_are_caught() {
    let message = failure_of(
        Defect::RacyAcquire,
        cases::one_leader_at_a_time_and_terms_rise,
    )
    .await;
    assert!(message.contains("two leaders at once"), "{message}");
    let message = failure_of(
        Defect::NonMonotonicTokens,
        cases::one_leader_at_a_time_and_terms_rise,
    )
    .await;
    assert!(message.contains("a term did not rise"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_never_expires_is_caught() {
    let message = failure_of(
        Defect::NeverExpires,
        cases::a_crashed_leader_is_replaced_within_ttl,
    )
    .await;
    assert!(message.contains("elected within TTL + slack"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_permit_for_one_owner_is_caught() {
    let message = failure_of(
        Defect::PermitIgnoresOwner,
        cases::same_owner_retakes_its_permit,
    )
    .await;
    assert!(message.contains("one owner holds 2 permits"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_limits_admitted_are_caught() {
    let message = failure_of(
        Defect::PermitIgnoresLimit,
        cases::mixed_permit_limits_are_refused,
    )
    .await;
    assert!(
        message.contains("a limit of 3 against a held limit of 2"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_that_never_expire_are_caught() {
    let message = failure_of(
        Defect::PermitNeverExpires,
        cases::expired_permits_free_their_places,
    )
    .await;
    assert!(
        message.contains("a place freed within TTL + slack"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_revives_a_permit_is_caught() {
    let message = failure_of(
        Defect::PermitRefreshRecreates,
        cases::stale_permit_cannot_release_or_refresh,
    )
    .await;
    assert!(message.contains("a stale refresh must fail"), "{message}");
    let message = failure_of(
        Defect::PermitRefreshRecreates,
        cases::refresh_many_mixes_locks_and_permits,
    )
    .await;
    assert!(message.contains("the released permit"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_extends_nothing_is_caught() {
    let message = failure_of(
        Defect::PermitRefreshNoop,
        cases::refresh_keeps_a_permit_beyond_its_ttl,
    )
    .await;
    assert!(message.contains("the permit lapsed"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_another_owners_permit_is_caught() {
    let message = failure_of(
        Defect::PermitReleaseOldest,
        cases::stale_permit_cannot_release_or_refresh,
    )
    .await;
    assert!(
        message.contains("freed the new holder's permit"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_that_wakes_nobody_is_caught() {
    let message = failure_of(
        Defect::PermitReleaseSilent,
        cases::permit_waiter_gets_a_released_place,
    )
    .await;
    assert!(message.contains("slept on after the release"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_that_holds_the_lock_of_its_name_is_caught() {
    let message = failure_of(
        Defect::PermitBlocksLock,
        cases::a_permit_and_the_lock_of_its_name_are_apart,
    )
    .await;
    assert!(message.contains("unexpectedly held"), "{message}");
    still_basically_works(Defect::PermitBlocksLock).await;
}
