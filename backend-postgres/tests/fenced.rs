//! Fenced writes on the shared server: a write in the same database commits only while the
//! lease still holds the grant, and a takeover waits for an open fenced transaction.

mod common;

use std::time::Duration;

use backend_postgres::PostgresBackend;
use common::{admin, backend, fresh_name, fresh_schema, grant, shared_url};
use lockcore::{ErrorKind, Identity, Lease, LockBackend};
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};
use tokio::time::{Instant, sleep, timeout};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A backend plus a protected table `"schema".ledger (fence bigint, note text)`.
struct Rig {
    _cleanup: common::DropSchema,
    backend: PostgresBackend,
    admin: PgPool,
    ledger: String,
}

impl Rig {
    async fn new(url: &str) -> Rig {
        let schema = fresh_schema("fenced");
        let _cleanup = common::drop_schema_later(url, &schema);
        let backend = backend(url, &schema).await;
        let admin = admin(url).await;
        let ledger = format!("\"{schema}\".ledger");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {ledger} (fence bigint NOT NULL, note text NOT NULL)"
        )))
        .execute(&admin)
        .await
        .expect("ledger");
        Rig {
            _cleanup,
            backend,
            admin,
            ledger,
        }
    }

    /// The notes written, in order.
    async fn notes(&self) -> Vec<String> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT note FROM {} ORDER BY fence, note",
            self.ledger
        )))
        .fetch_all(&self.admin)
        .await
        .expect("read ledger")
        .iter()
        .map(|r| r.get("note"))
        .collect()
    }

    /// Writes `note` with `lease`'s token, fenced.
    async fn write(&self, lease: &Lease, note: &str) -> Result<(), BoxError> {
        let ledger = self.ledger.clone();
        self.backend
            .fenced(lease, async |conn| -> Result<(), BoxError> {
                let token = lease.token().expect("token").get() as i64;
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {ledger} (fence, note) VALUES ($1, $2)"
                )))
                .bind(token)
                .bind(note)
                .execute(conn)
                .await?;
                Ok(())
            })
            .await
    }
}

fn kind(err: &BoxError) -> Option<ErrorKind> {
    err.downcast_ref::<lockcore::Error>()
        .map(lockcore::Error::kind)
}

/// A holder's fenced write commits while it holds the lease; the transaction sees the
/// token it was fenced with.
#[tokio::test]
async fn a_fenced_write_commits_while_held() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let lease = grant(
        &rig.backend,
        &fresh_name("held"),
        &Identity::unique(),
        secs(30),
    )
    .await;
    rig.write(&lease, "mine").await.expect("fenced write");
    let tx = rig.backend.begin_fenced(&lease).await.expect("begin");
    assert_eq!(Some(tx.token()), lease.token());
    tx.rollback().await.expect("rollback");
    assert_eq!(rig.notes().await, ["mine"]);
}

/// The required case (Kleppmann's paused client): the holder pauses past its TTL,
/// another client takes over, and the holder's write is rejected with Lost without
/// running; the new holder's write commits.
#[tokio::test]
async fn a_paused_holders_write_is_rejected_after_takeover() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let name = fresh_name("paused");
    let paused = grant(&rig.backend, &name, &Identity::unique(), ms(800)).await;
    sleep(ms(1200)).await; // the "GC pause": no refresh
    let next = grant(&rig.backend, &name, &Identity::unique(), secs(30)).await;
    assert!(next.token() > paused.token());
    let mut ran = false;
    let err = rig
        .backend
        .fenced(&paused, async |_conn| -> Result<(), BoxError> {
            ran = true;
            Ok(())
        })
        .await
        .expect_err("a stale holder's write committed");
    assert_eq!(kind(&err), Some(ErrorKind::Lost), "{err}");
    assert!(!ran, "the fenced work ran for a lost lease");
    rig.write(&next, "new holder")
        .await
        .expect("new holder writes");
    let stale = rig.write(&paused, "stale").await.expect_err("stale write");
    assert_eq!(kind(&stale), Some(ErrorKind::Lost));
    assert_eq!(rig.notes().await, ["new holder"]);
}

/// A lease that expired on the database clock cannot fence a write even when nobody has
/// taken the lock over yet (the row still names the holder and its token).
#[tokio::test]
async fn an_expired_lease_cannot_fence_even_without_a_takeover() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let lease = grant(
        &rig.backend,
        &fresh_name("lapsed"),
        &Identity::unique(),
        ms(300),
    )
    .await;
    sleep(ms(600)).await;
    let err = rig
        .write(&lease, "late")
        .await
        .expect_err("an expired lease fenced a write");
    assert_eq!(kind(&err), Some(ErrorKind::Lost), "{err}");
    assert!(rig.notes().await.is_empty());
}

/// A takeover after expiry waits while the old holder's fenced transaction is open, so
/// the old holder's committed write is ordered before the new grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_an_open_fenced_transaction() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let name = fresh_name("ordered");
    let old = grant(&rig.backend, &name, &Identity::unique(), ms(1000)).await;
    let mut tx = rig.backend.begin_fenced(&old).await.expect("fenced");
    let insert = format!("INSERT INTO {} VALUES ($1, 'old')", rig.ledger);
    sqlx::query(AssertSqlSafe(insert))
        .bind(old.token().expect("token").get() as i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    let taker = tokio::spawn({
        let backend = rig.backend.clone();
        async move {
            sleep(ms(1200)).await; // past the old lease's expiry
            grant(&backend, &name, &Identity::unique(), secs(30)).await
        }
    });
    // Stay active (not idle past the TTL) in the transaction until well after expiry.
    let until = Instant::now() + ms(2200);
    while Instant::now() < until {
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("alive");
        sleep(ms(200)).await;
    }
    assert!(
        !taker.is_finished(),
        "the takeover did not wait for the fenced transaction"
    );
    tx.commit().await.expect("commit while the row is locked");
    let new = timeout(secs(10), taker)
        .await
        .expect("takeover after commit")
        .expect("join");
    assert!(new.token() > old.token());
    assert_eq!(rig.notes().await, ["old"]);
}

/// `FOR KEY SHARE` lets the holder's own refresh through while its fenced transaction is
/// open (a long transaction does not starve the refresher).
#[tokio::test]
async fn the_holder_refreshes_during_its_fenced_transaction() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let lease = grant(
        &rig.backend,
        &fresh_name("refresh"),
        &Identity::unique(),
        secs(5),
    )
    .await;
    let tx = rig.backend.begin_fenced(&lease).await.expect("fenced");
    let refreshed = timeout(secs(2), rig.backend.refresh(&lease)).await;
    let refreshed = refreshed.expect("the refresh waited for the fenced transaction");
    assert_eq!(refreshed.expect("refresh").token(), lease.token());
    tx.commit().await.expect("commit");
}

/// A holder paused *inside* a fenced transaction cannot block takeovers forever nor commit
/// afterwards: the transaction may sit idle at most the lease TTL, then the server ends the
/// session, the takeover proceeds, and the write never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_inside_a_fenced_transaction_cannot_commit() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let name = fresh_name("idle");
    let old = grant(&rig.backend, &name, &Identity::unique(), ms(1000)).await;
    let mut tx = rig.backend.begin_fenced(&old).await.expect("fenced");
    let insert = format!("INSERT INTO {} VALUES ($1, 'paused')", rig.ledger);
    sqlx::query(AssertSqlSafe(insert))
        .bind(old.token().expect("token").get() as i64)
        .execute(&mut *tx)
        .await
        .expect("insert");
    let started = Instant::now();
    sleep(ms(1200)).await; // expired on the database clock; the row is still locked
    let new = timeout(
        secs(10),
        grant(&rig.backend, &name, &Identity::unique(), secs(30)),
    )
    .await
    .expect("the paused transaction blocked the takeover indefinitely");
    assert!(started.elapsed() < secs(8), "took {:?}", started.elapsed());
    sleep(ms(1500)).await; // the pause ends
    let err = tx
        .commit()
        .await
        .expect_err("a paused holder committed after takeover");
    // The server ended the session: the COMMIT meets either its error or a closed socket.
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Unavailable | ErrorKind::OutcomeUnknown
        ),
        "{err}"
    );
    assert!(new.token() > old.token());
    assert!(rig.notes().await.is_empty(), "the paused write landed");
}

/// Returning an error from the work rolls the transaction back.
#[tokio::test]
async fn an_error_from_the_work_rolls_back() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let lease = grant(
        &rig.backend,
        &fresh_name("rb"),
        &Identity::unique(),
        secs(30),
    )
    .await;
    let ledger = rig.ledger.clone();
    let failed = rig
        .backend
        .fenced(&lease, async |conn| -> Result<(), BoxError> {
            let insert = format!("INSERT INTO {ledger} VALUES (1, 'rolled')");
            sqlx::query(AssertSqlSafe(insert)).execute(conn).await?;
            Err("the caller changed its mind".into())
        })
        .await;
    assert!(failed.is_err());
    assert!(
        rig.notes().await.is_empty(),
        "a failed fenced write committed"
    );
}

/// A released lease cannot fence anything; a lease from another backend is invalid input.
#[tokio::test]
async fn released_and_foreign_leases_are_refused() {
    let Some(url) = shared_url() else { return };
    let rig = Rig::new(&url).await;
    let lease = grant(
        &rig.backend,
        &fresh_name("gone"),
        &Identity::unique(),
        secs(30),
    )
    .await;
    rig.backend.release(&lease).await.expect("release");
    let err = rig
        .backend
        .begin_fenced(&lease)
        .await
        .expect_err("released");
    assert_eq!(err.kind(), ErrorKind::Lost);
    // Called outside a Locker, the error still says where it comes from.
    assert_eq!(err.backend(), Some("postgres"), "{err}");
    assert_eq!(err.lock(), Some(lease.name()), "{err}");
    let foreign = Lease::new(
        lease.name().clone(),
        lease.owner().clone(),
        lockcore::Ttl::new(secs(1)).expect("valid TTL"),
        "etcd:7",
    );
    let err = rig
        .backend
        .begin_fenced(&foreign)
        .await
        .expect_err("foreign");
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
