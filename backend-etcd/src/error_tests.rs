//! Tests of the error mapping: kinds by gRPC code and by whether the RPC writes, and the
//! wording of etcd's refusals. That backend and lock are named is checked through a
//! `Locker` in `tests/etcd.rs`.

use std::time::Duration;

use lockcore::ErrorKind;
use tonic::Code;

use crate::error::{Failure, Op, Refusal, explain, map_error};
use crate::grpc::RpcError as E;

fn status(code: Code) -> Failure {
    Failure::Etcd(E::Status(tonic::Status::new(code, "x")))
}

fn kind(op: Op, failure: Failure) -> ErrorKind {
    let err = map_error(op, failure);
    assert!(err.to_string().contains(op.name()), "{err}");
    err.kind()
}

#[test]
fn errors_map_by_code_and_by_whether_the_rpc_writes() {
    use ErrorKind::*;
    let second = Duration::from_secs(1);
    assert_eq!(
        kind(Op::CreateIfFree, status(Code::Unavailable)),
        OutcomeUnknown
    );
    assert_eq!(
        kind(Op::Retake, status(Code::DeadlineExceeded)),
        OutcomeUnknown
    );
    assert_eq!(
        kind(Op::LeaseRevoke, Failure::TimedOut(second)),
        OutcomeUnknown
    );
    assert_eq!(kind(Op::Get, status(Code::Unavailable)), Unavailable);
    assert_eq!(kind(Op::Get, Failure::TimedOut(second)), Unavailable);
    assert_eq!(kind(Op::Get, status(Code::ResourceExhausted)), Unavailable);
    assert_eq!(
        kind(Op::Get, status(Code::PermissionDenied)),
        PermissionDenied
    );
    assert_eq!(
        kind(Op::Get, status(Code::Unauthenticated)),
        PermissionDenied
    );
    assert_eq!(
        kind(Op::CreateIfFree, status(Code::InvalidArgument)),
        InvalidInput
    );
    assert_eq!(kind(Op::LeaseRevoke, status(Code::NotFound)), Lost);
    assert_eq!(kind(Op::Get, status(Code::Unimplemented)), Unsupported);
    assert_eq!(kind(Op::Get, status(Code::FailedPrecondition)), Config);
    let gone = Failure::Etcd(E::LeaseKeepAlive("lease not found".into()));
    assert_eq!(kind(Op::KeepAlive, gone), Lost);
    let bad = Failure::Etcd(E::InvalidUri("invalid authority".into()));
    assert_eq!(kind(Op::Get, bad), Config);
    let unanswered = Failure::Etcd(E::Watch("failed to create lease keeper".into()));
    assert_eq!(kind(Op::KeepAlive, unanswered), Unavailable);
    assert!(map_error(Op::Get, status(Code::Unavailable)).is_temporary());
    assert!(!map_error(Op::Get, status(Code::PermissionDenied)).is_temporary());
}

#[test]
fn refusals_name_the_user_and_the_fix_but_no_password() {
    let bad = explain(
        Refusal::BadCredentials,
        "Authenticate",
        "anylock",
        "anylock/",
    );
    assert!(
        bad.contains("etcd refused user `anylock`: authentication failed"),
        "{bad}"
    );
    let denied = explain(Refusal::NoPermission, "Range", "anylock", "anylock/");
    assert!(
        denied.contains("readwrite --prefix=true 'anylock/'"),
        "{denied}"
    );
    assert!(denied.contains("grant-role anylock"), "{denied}");
}
