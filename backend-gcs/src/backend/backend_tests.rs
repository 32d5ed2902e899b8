//! Unit tests of the GCS backend's option checks and refresh replies.

use super::*;

/// What a refresh PATCH's 200 proves: the new metageneration only when it carries our
/// object of the PATCH's generation; otherwise the outcome is unknown (a batch answer
/// matched to the wrong call, a body lost), and only another owner is `Lost`.
#[test]
fn a_refresh_reply_counts_only_for_our_object_of_its_generation() {
    let owner = lockcore::Identity::unique();
    let ttl = lockcore::Ttl::new(Duration::from_secs(30)).expect("ttl");
    let lease = Lease::new(LockName::new("l").expect("name"), owner.clone(), ttl, "7:1");
    let object = |generation: u64, identity: &str| LockObject {
        generation,
        metageneration: 2,
        updated: SystemTime::now(),
        created: None,
        identity: Some(identity.to_owned()),
        ttl: Some(Duration::from_secs(30)),
        note: None,
    };
    let target = Target {
        object: "l".to_owned(),
        slot: None,
        generation: 7,
        metageneration: 1,
    };
    let ours = extended(
        Reply::Ok(Some(object(7, owner.as_str()))),
        &lease,
        &target,
        1,
    );
    assert_eq!(ours.expect("ok").expect("refreshed").grant(), "7:2");
    let kind = |reply| {
        extended(reply, &lease, &target, 1)
            .expect_err("refused")
            .kind()
    };
    use lockcore::ErrorKind::{Lost, OutcomeUnknown};
    assert_eq!(
        kind(Reply::Ok(Some(object(8, owner.as_str())))),
        OutcomeUnknown
    );
    assert_eq!(kind(Reply::Ok(None)), OutcomeUnknown);
    let unmoved = LockObject {
        metageneration: 1,
        ..object(7, owner.as_str())
    };
    assert_eq!(kind(Reply::Ok(Some(unmoved))), OutcomeUnknown);
    assert_eq!(kind(Reply::Ok(Some(object(7, "someone-else")))), Lost);
    assert_eq!(kind(Reply::NotFound), Lost);
    assert!(matches!(
        extended(Reply::PreconditionFailed, &lease, &target, 1),
        Ok(None)
    ));
}

#[test]
fn options_must_respect_the_mutation_rate() {
    validate_options(&default_options()).expect("Lai's defaults fit");
    let fast = LockOptions::new(Duration::from_secs(3));
    assert_eq!(
        validate_options(&fast).unwrap_err().kind(),
        lockcore::ErrorKind::InvalidInput
    );
    let ok = LockOptions::new(Duration::from_secs(8));
    validate_options(&ok).expect("8 s TTL refreshes every 1 s");
}
