//! The secure Redis server of `scripts/servers` (TLS only, `tls-auth-clients yes`, ACL users,
//! default user off), issue #19: client certificates, the `ca` parameter, what each refusal
//! looks like, the least-privilege ACL recipe, and `connection_security`. Every error is
//! checked for the password in its Display, Debug and source chain.
#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use backend_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use common::Secure;
use lockcore::{
    Acquire, AcquireRequest, ErrorKind, Identity, LockBackend, LockOptions, Locker, Transport,
    Verification, WaitMode,
};
use tokio::time::Instant;

/// The least-privilege ACL rules of docs/tls-and-auth.md ("Redis and Redlock"), for the
/// default prefix `anylock`. Keep the two in sync. No `SCAN`: it ignores key patterns, so
/// it would let every lock client list every key name in the database.
const RECIPE: &str = "resetkeys resetchannels -@all ~{anylock:* &{anylock:* \
    +ping +evalsha +script|load +get +set +pttl +pexpire +del +publish +time \
    +hset +hget +hmget +subscribe +unsubscribe +acl|whoami";

/// The operator's rules for `anylock list`: the recipe plus `SCAN` (docs/tls-and-auth.md).
const OPERATOR_RECIPE: &str = "resetkeys resetchannels -@all ~{anylock:* &{anylock:* \
    +ping +evalsha +script|load +get +set +pttl +pexpire +del +publish +time \
    +hset +hget +hmget +scan +subscribe +unsubscribe +acl|whoami";

/// What semaphores (permits) need on top of [`RECIPE`]: the sorted-set commands of the
/// permit scripts, `HDEL` and `PEXPIREAT` (docs/redis.md, "Semaphores").
const SEMAPHORE_RULES: &str = "+zadd +zrem +zscore +zcount +zrange +zrangebyscore \
    +zremrangebyscore +hdel +pexpireat";

/// Connects with `url` and expects the error kind; checks the password never shows and
/// returns the error's text.
async fn refused(url: &str, kind: ErrorKind, password: &str) -> String {
    let err = RedisBackend::from_url(url).await.expect_err("connected");
    let shown = common::everything_shown(&err);
    assert_eq!(err.kind(), kind, "{shown}");
    assert!(!shown.contains(password), "the password shows: {shown}");
    assert!(!err.is_temporary(), "{err}");
    eprintln!("refused as expected: {err}");
    err.to_string()
}

/// The recipe documented before notes and listing (no `HSET`, `HGET`, `HMGET`, `SCAN`):
/// users created from it must keep working for everything but notes and `list`.
const RECIPE_BEFORE_NOTES: &str = "resetkeys resetchannels -@all ~{anylock:* &{anylock:* \
    +ping +evalsha +script|load +get +set +pttl +pexpire +del +publish +time \
    +subscribe +unsubscribe +acl|whoami";

/// A per-test ACL user with [`RECIPE`]'s rules (and the server's password), deleted on drop.
struct RecipeUser {
    name: String,
    admin: redis::aio::MultiplexedConnection,
}

impl RecipeUser {
    async fn create(secure: &Secure) -> RecipeUser {
        Self::create_with(secure, RECIPE).await
    }

    async fn create_with(secure: &Secure, recipe: &str) -> RecipeUser {
        let name = format!("anylock_test_{:08x}", rand::random::<u32>());
        let mut admin = secure.admin().await;
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg(&name).arg("on");
        setuser.arg(format!(">{}", secure.password));
        setuser.arg(recipe.split_whitespace().collect::<Vec<_>>());
        setuser
            .query_async::<()>(&mut admin)
            .await
            .expect("ACL SETUSER as the admin user");
        RecipeUser { name, admin }
    }
}

impl Drop for RecipeUser {
    fn drop(&mut self) {
        let mut admin = self.admin.clone();
        let name = self.name.clone();
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Best effort: the user has a random name and the server's password.
        handle.spawn(async move {
            let _ = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(name)
                .query_async::<()>(&mut admin)
                .await;
        });
    }
}

/// Right credentials, client certificate and `ca`: a least-privilege user (the documented
/// ACL recipe) acquires with a note, waits (woken by the release notification), refreshes,
/// inspects, lists, breaks and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_recipe_runs_every_operation() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let user = RecipeUser::create(&secure).await;
    let url = secure.url_as(&user.name, &secure.password);
    let backend = Arc::new(
        RedisBackend::from_url(&url)
            .await
            .expect("connect as recipe user"),
    );
    let name = common::fresh_name("recipe");
    let ttl = Duration::from_secs(10);
    let note = lockcore::Note::new("recipe run").expect("note");
    let holder =
        Locker::new(backend.clone()).with_options(LockOptions::new(ttl).with_note(note.clone()));
    let guard = holder.acquire(name.as_str()).await.expect("acquire");
    assert!(guard.fence_token().is_some());
    let found = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(found.owner(), guard.lease().owner());
    assert_eq!(found.note(), Some(&note));
    backend.refresh(&guard.lease()).await.expect("refresh");
    let err = backend
        .list(name.as_str())
        .await
        .expect_err("no SCAN for the app");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    let operator = RecipeUser::create_with(&secure, OPERATOR_RECIPE).await;
    let url = secure.url_as(&operator.name, &secure.password);
    let admin = RedisBackend::from_url(&url)
        .await
        .expect("connect as operator");
    let listed = admin.list(name.as_str()).await.expect("list");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holder().note(), Some(&note));
    let waiting = LockOptions::new(ttl).with_wait(WaitMode::Timeout(Duration::from_secs(20)));
    let waiter = Locker::new(backend.clone()).with_options(waiting);
    let started = Instant::now();
    let task = tokio::spawn(async move { waiter.acquire(name.as_str()).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "the waiter got a held lock");
    guard.release().await.expect("release");
    let second = task.await.expect("task").expect("waiting acquire");
    // Woken by the notification, not by polling at the backoff cap.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let broken = backend
        .break_lock(second.lease().name())
        .await
        .expect("break");
    assert!(broken.is_some(), "break found nothing");
    let again = AcquireRequest::new(
        second.lease().name().clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let outcome = backend.acquire(&again).await;
    let Acquire::Acquired(lease) = outcome.expect("acquire after break") else {
        panic!("held after break");
    };
    backend.release(&lease).await.expect("release");
}

/// A user created from the recipe of the previous version keeps working after the upgrade
/// for every operation without a note; an acquire with a note is refused before anything
/// is granted (the script writes the note first), and `list` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipe_before_notes_still_runs_everything_but_notes_and_list() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let user = RecipeUser::create_with(&secure, RECIPE_BEFORE_NOTES).await;
    let url = secure.url_as(&user.name, &secure.password);
    let backend = RedisBackend::from_url(&url).await.expect("connect");
    let name = common::fresh_name("old-recipe");
    let ttl = Duration::from_secs(10);
    let request = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
        panic!("held");
    };
    let found = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(found.owner(), lease.owner());
    assert_eq!(found.note(), None);
    backend.refresh(&lease).await.expect("refresh");
    let rival = AcquireRequest::new(
        name.clone(),
        Identity::unique(),
        lockcore::Ttl::new(ttl).expect("valid TTL"),
    );
    assert!(matches!(
        backend.acquire(&rival).await,
        Ok(Acquire::Held(_))
    ));
    backend.release(&lease).await.expect("release");
    let noted = rival.with_note(Some(lockcore::Note::new("needs HSET").expect("note")));
    let err = backend
        .acquire(&noted)
        .await
        .expect_err("HSET is not granted");
    assert!(!err.is_temporary(), "{err}");
    assert_eq!(
        backend.inspect(&name).await.expect("inspect"),
        None,
        "{err}"
    );
    let err = backend.list("").await.expect_err("SCAN is not granted");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
}

/// The same over Redlock with the secure server as its only node.
#[tokio::test]
async fn redlock_over_tls_with_a_client_certificate() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let user = RecipeUser::create(&secure).await;
    let url = secure
        .url_as(&user.name, &secure.password)
        .replacen("rediss://", "redlocks://", 1);
    let config = RedlockConfig::from_url(&url).expect("valid");
    assert!(!format!("{config} {config:?}").contains(&secure.password));
    let backend = RedlockBackend::connect(config).await.expect("connect");
    let request = AcquireRequest::new(
        common::fresh_name("redlock-tls"),
        Identity::unique(),
        lockcore::Ttl::new(Duration::from_secs(10)).expect("valid TTL"),
    );
    let Acquire::Acquired(lease) = backend.acquire(&request).await.expect("acquire") else {
        panic!("held");
    };
    backend.refresh(&lease).await.expect("refresh");
    backend.release(&lease).await.expect("release");
    let security = backend.connection_security().await.expect("security");
    assert_eq!(security.len(), 1);
    let expected = format!("user \"{}\" (password)", user.name);
    assert_eq!(security[0].identity.as_deref(), Some(expected.as_str()));
}

/// `connection_security` reports verified TLS with our client certificate, the version
/// and cipher, and the ACL user; no secret.
#[tokio::test]
async fn connection_security_reports_tls_and_the_user() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let backend = RedisBackend::from_url(&secure.url())
        .await
        .expect("connect");
    let security = backend.connection_security().await.expect("security");
    assert_eq!(security.len(), 1, "{security:?}");
    let report = &security[0];
    assert_eq!(report.endpoint, format!("127.0.0.1:{}", secure.port));
    let Transport::Tls(tls) = &report.transport else {
        panic!("not TLS: {report:?}");
    };
    assert_eq!(tls.verification, Verification::Full);
    assert!(tls.client_certificate);
    assert!(
        tls.version.as_deref().is_some_and(|v| v.starts_with("TLS")),
        "{tls:?}"
    );
    assert!(tls.cipher.is_some(), "{tls:?}");
    let expected = format!("user \"{}\" (password)", secure.user);
    assert_eq!(report.identity.as_deref(), Some(expected.as_str()));
    assert!(!format!("{security:?}").contains(&secure.password));
}

/// A wrong password: PermissionDenied naming authentication and the user.
#[tokio::test]
async fn a_wrong_password_names_authentication_and_the_user() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let wrong = format!("{}-wrong", secure.password);
    let url = secure.url_as(&secure.user, &wrong);
    let text = refused(&url, ErrorKind::PermissionDenied, &wrong).await;
    assert!(!text.contains(&secure.password), "{text}");
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        text.contains(&format!("user \"{}\"", secure.user)),
        "{text}"
    );
}

/// A user without the permissions the backend needs: PermissionDenied naming the ACL and
/// the fix.
#[tokio::test]
async fn a_user_without_permissions_names_the_acl_and_the_fix() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure.url_as("anylock_denied", &secure.password);
    let text = refused(&url, ErrorKind::PermissionDenied, &secure.password).await;
    assert!(text.contains("ACL"), "{text}");
    assert!(text.contains("anylock_denied"), "{text}");
    assert!(text.contains("docs/tls-and-auth.md"), "{text}");
}

/// A server certificate from a CA we do not trust: PermissionDenied naming TLS and `ca`.
#[tokio::test]
async fn an_untrusted_server_certificate_is_permission_denied() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure.url().replace("/ca.pem", "/other-ca.pem");
    let text = refused(&url, ErrorKind::PermissionDenied, &secure.password).await;
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(text.contains("not signed by a CA we trust"), "{text}");
}

/// No client certificate: PermissionDenied naming the missing client certificate, well
/// within the connect timeout.
#[tokio::test]
async fn a_missing_client_certificate_is_named_fast() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = format!(
        "rediss://{}:{}@127.0.0.1:{}/0?ca={}",
        secure.user,
        secure.password,
        secure.port,
        secure.file("ca.pem")
    );
    let started = Instant::now();
    let text = refused(&url, ErrorKind::PermissionDenied, &secure.password).await;
    let took = started.elapsed();
    eprintln!("missing client certificate refused after {took:?}");
    assert!(text.contains("client certificate"), "{text}");
    assert!(text.contains("`cert`"), "{text}");
    assert!(took < Duration::from_millis(500), "took {took:?}");
}

/// A client certificate from another CA: PermissionDenied naming our client certificate.
#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let url = secure
        .url()
        .replace("/client.pem", "/other-client.pem")
        .replace("/client-key.pem", "/other-client-key.pem");
    let text = refused(&url, ErrorKind::PermissionDenied, &secure.password).await;
    assert!(text.contains("client certificate"), "{text}");
}

/// TLS parameters on `redis://` and `redlock://`, a misspelled parameter and unusable files
/// are refused before any connection (they name no server that could answer).
#[tokio::test]
async fn bad_tls_settings_are_refused_before_connecting() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let mut errors = Vec::new();
    let plain = secure.url().replacen("rediss://", "redis://", 1);
    let err = RedisConfig::from_url(&plain).expect_err("TLS parameters on redis://");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("rediss://"), "{err}");
    errors.push(err);
    let plain = secure.url().replacen("rediss://", "redlock://", 1);
    let err = RedlockConfig::from_url(&plain).expect_err("TLS parameters on redlock://");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("redlocks://"), "{err}");
    errors.push(err);
    let typo = secure.url().replace("?ca=", "?cafile=");
    let err = RedisConfig::from_url(&typo).expect_err("misspelled parameter");
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("`cafile`"), "{err}");
    errors.push(err);
    let missing = secure.url().replace("/ca.pem", "/no-such-ca.pem");
    let err = RedisConfig::from_url(&missing).expect_err("missing CA file");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("`ca`"), "{err}");
    errors.push(err);
    let not_pem = secure.url().replace("/ca.pem", "/openssl.cnf");
    let err = RedisConfig::from_url(&not_pem).expect_err("non-PEM CA file");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("not usable PEM"), "{err}");
    errors.push(err);
    for err in errors {
        assert!(
            !common::everything_shown(&err).contains(&secure.password),
            "{err:?}"
        );
    }
}

/// A user of [`RECIPE`] is refused permits with `PermissionDenied` before anything is
/// written (no permit, no counter); with [`SEMAPHORE_RULES`] added it acquires, is refused
/// when full, refreshes (alone and in a batch with a lock), inspects and releases permits.
#[tokio::test]
async fn permits_need_the_semaphore_rules_on_top_of_the_recipe() {
    let Some(secure) = Secure::from_env() else {
        return;
    };
    let ttl = lockcore::Ttl::new(Duration::from_secs(10)).expect("valid TTL");
    let two = lockcore::Permits::new(2).expect("valid count");
    let name = common::fresh_name("recipe-permits");
    let ask = || AcquireRequest::new(name.clone(), Identity::unique(), ttl).with_permits(two);

    let plain = RecipeUser::create(&secure).await;
    let url = secure.url_as(&plain.name, &secure.password);
    let backend = RedisBackend::from_url(&url).await.expect("connect");
    let err = backend.acquire_permit(&ask()).await.expect_err("no ZCOUNT");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    let mut admin = secure.admin().await;
    let keys = backend.permit_keys(&name);
    for key in [keys.permits(), keys.info(), keys.fence()] {
        assert!(!common::exists(&mut admin, key).await, "{key} written");
    }

    let rules = format!("{RECIPE} {SEMAPHORE_RULES}");
    let user = RecipeUser::create_with(&secure, &rules).await;
    let url = secure.url_as(&user.name, &secure.password);
    let backend = RedisBackend::from_url(&url).await.expect("connect");
    let mut leases = Vec::new();
    for _ in 0..2 {
        match backend
            .acquire_permit(&ask())
            .await
            .expect("acquire_permit")
        {
            Acquire::Acquired(lease) => leases.push(lease),
            Acquire::Held(holder) => panic!("held by {}", holder.owner()),
        }
    }
    let third = backend.acquire_permit(&ask()).await.expect("call");
    assert!(matches!(third, Acquire::Held(_)), "{third:?}");
    backend.refresh(&leases[0]).await.expect("refresh");
    let lock = AcquireRequest::new(name.clone(), Identity::unique(), ttl);
    let Acquire::Acquired(lock) = backend.acquire(&lock).await.expect("acquire") else {
        panic!("the lock of the same name is held");
    };
    let batch = [leases[1].clone(), lock.clone()];
    for result in backend.refresh_many(&batch).await {
        result.expect("batch refresh");
    }
    assert_eq!(
        backend.inspect_permits(&name).await.expect("inspect").len(),
        2
    );
    for lease in leases.iter().chain([&lock]) {
        backend.release(lease).await.expect("release");
    }
    assert!(
        backend
            .inspect_permits(&name)
            .await
            .expect("inspect")
            .is_empty()
    );
}
