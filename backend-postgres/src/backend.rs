//! [`PostgresBackend`]: the [`LockBackend`] over a PostgreSQL lease table.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use futures_util::TryStreamExt;
use lockcore::{
    Acquire, AcquireRequest, ConnectionSecurity, Durability, Error, ExpiryClock, Fairness,
    FenceToken, Fencing, Guarantees, HeldLock, HolderInfo, Identity, Lease, LockBackend, LockName,
    ReleaseEvents, Result, Semaphores, TlsDetails, Transport, Waiting,
};
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};

use crate::client::Client;
use crate::config::PostgresConfig;
use crate::error::{BACKEND, Effect};
use crate::holder::holder;
use crate::notify::Notifier;
use crate::permits;
use crate::refresh;
pub(crate) use crate::refresh::grant_token;
use crate::sql;

/// What [`PostgresBackend::guarantees`](LockBackend::guarantees) says besides the enums.
const NOTES: &str = "Linearizable on one PostgreSQL primary; leases and tokens survive a \
    restart when commits are durable (synchronous_commit=on), but an asynchronous standby \
    promoted in a failover can lose recent grants. Expiry uses the database clock only. \
    Tokens come from one sequence, so they rise per name even if an operator deletes rows; \
    the sequence must keep CACHE 1 (connect refuses a cached one), and restoring a backup or \
    restarting the sequence can repeat tokens. Every statement carries statement_timeout and \
    lock_timeout (statement_timeout_ms, default the client timeout), fenced ones included. \
    No session state: works behind PgBouncer transaction pooling (prepared_statements=false \
    before PgBouncer 1.21), except LISTEN, which needs a session connection (listen_url). \
    begin_fenced/fenced make writes in the same database commit only while the lease holds. \
    Semaphore permits: a table and a token sequence of their own; an acquire is one \
    transaction serialized per semaphore name by a transaction-scoped advisory lock.";

/// The owner reported when a lock changed hands twice while one attempt ran.
const UNKNOWN_HOLDER: &str = "(unknown: the lock changed hands during this attempt)";

/// A lease-lock backend over one PostgreSQL table. Cheap to clone; clones share the
/// connection pool and the `LISTEN` connection.
///
/// Each lock is one row `(name, owner, token, acquired_at, expires_at, note)`. Acquire,
/// refresh and release are one statement each, expiry is decided by the database's clock,
/// fence tokens come from a sequence and never go back, and releases wake waiters through
/// `NOTIFY`. [`begin_fenced`](Self::begin_fenced) makes writes in the same database
/// conditional on the lease. Semaphore permits are rows of a table of their own (one per
/// holder), granted by one transaction per attempt. The statements are in
/// `docs/postgres.md`.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    notifier: Notifier,
    config: PostgresConfig,
    channel: String,
}

impl PostgresBackend {
    /// Connects and creates the schema, sequence and table when they are missing (unless
    /// [`PostgresConfig::with_create_schema`] turned that off). Safe to call from many
    /// processes at once.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for a bad config;
    /// [`ErrorKind::PermissionDenied`](lockcore::ErrorKind::PermissionDenied) for a wrong
    /// password or a missing privilege;
    /// [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable) when the server cannot
    /// be reached within the timeout;
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) for a missing database, or a
    /// missing table with schema creation off.
    ///
    /// # Cancel safety
    /// Dropping the future leaves at most an idle pool behind; schema creation is one
    /// transaction.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let setup = config.tls();
        if setup.verification == lockcore::Verification::ChainOnly
            && setup.roots != "the OS trust store"
        {
            tracing::warn!(
                "sslmode=verify-ca (or require with `ca`): the driver trusts the OS trust store \
                 as well as the `ca` file and does not check the host name, so any server \
                 holding a certificate from a public CA is accepted; use sslmode=verify-full \
                 (docs/tls-and-auth.md)"
            );
        }
        let client = Client::new(&config);
        client.check_reachable(&config).await?;
        client.ensure_schema(config.create_schema()).await?;
        let channel = config.channel();
        let notifier = Notifier::new(config.listen_options(), channel.clone(), config.timeout());
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                notifier,
                config,
                channel,
            }),
        })
    }

    /// [`PostgresConfig::from_url`] then [`connect`](Self::connect).
    ///
    /// # Errors
    /// As both.
    pub async fn from_url(url: &str) -> Result<Self> {
        Self::connect(PostgresConfig::from_url(url)?).await
    }

    /// The configuration (its `Display` hides the password).
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// A sqlx pool (of `pool_size` connections, opened when used) for your own statements
    /// (fenced ones go through [`begin_fenced`](Self::begin_fenced)). Lock calls do not
    /// use it: they run on connections the backend keeps apart (docs/postgres.md,
    /// "Connections"), so your statements never wait behind lock traffic, nor it behind
    /// yours.
    pub fn pool(&self) -> &PgPool {
        &self.inner.client.pool
    }

    pub(crate) fn client(&self) -> &Client {
        &self.inner.client
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.client.timeout
    }

    /// The acquire statement's outcome; a second read when the lock changed hands while
    /// the statement ran (its snapshot then predates the winner).
    async fn attempt(&self, request: &AcquireRequest, ttl_us: i64) -> Result<Option<Outcome>> {
        let c = self.client();
        c.run(Effect::Write, async |conn| {
            let row = c
                .query(&c.statements.acquire)
                .bind(request.name.as_str())
                .bind(request.owner.as_str())
                .bind(ttl_us)
                .bind(request.note.as_ref().map(lockcore::Note::as_str))
                .fetch_optional(conn)
                .await?;
            row.map(|row| {
                let acquired: bool = row.try_get("acquired")?;
                Ok(Outcome {
                    acquired,
                    holder: holder(&row)?,
                })
            })
            .transpose()
        })
        .await
    }
}

impl PostgresConfig {
    /// Validates and connects: [`PostgresBackend::connect`] (here rather than in the
    /// config's module, which the backend depends on).
    ///
    /// # Errors
    /// As [`PostgresBackend::connect`].
    pub async fn build(self) -> Result<PostgresBackend> {
        PostgresBackend::connect(self).await
    }
}

/// One acquire statement's answer.
struct Outcome {
    acquired: bool,
    holder: HolderInfo,
}

#[async_trait]
impl LockBackend for PostgresBackend {
    fn backend_name(&self) -> &str {
        BACKEND
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let ttl = request.ttl;
        match self.attempt(request, ttl.as_micros()).await? {
            Some(Outcome {
                acquired: true,
                holder,
            }) => {
                let token = holder.token().unwrap_or(FenceToken::new(0));
                let lease = Lease::new(
                    request.name.clone(),
                    request.owner.clone(),
                    ttl,
                    token.to_string(),
                );
                Ok(Acquire::Acquired(lease.with_token(token)))
            }
            Some(Outcome { holder, .. }) => Ok(Acquire::Held(holder)),
            None => {
                let now = self.inspect(&request.name).await?;
                Ok(Acquire::Held(now.unwrap_or_else(|| {
                    // The lock is free again: a holder that ends at once, so a waiter
                    // tries again now (zero would read as expired and wait a backoff).
                    HolderInfo::new(Identity::from_stored(UNKNOWN_HOLDER))
                        .with_expires_in(Duration::from_micros(1))
                })))
            }
        }
    }

    /// A batch of one ([`refresh_many`](LockBackend::refresh_many)), in the statement's
    /// one-lease form: one statement, one round trip.
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let mut results = refresh::refresh_leases(self.client(), std::slice::from_ref(lease)).await;
        results.pop().unwrap_or_else(|| {
            Err(Error::new(
                lockcore::ErrorKind::Protocol,
                "the refresh gave no result",
            ))
        })
    }

    /// One statement per 1,000 leases (`refresh_batch_limit`): each lease's outcome is
    /// what [`refresh`](LockBackend::refresh) of it alone would be.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        refresh::refresh_leases(self.client(), leases).await
    }

    fn refresh_batch_limit(&self) -> usize {
        refresh::BATCH
    }

    /// A permit's release deletes its row; a lock's clears it (both notify).
    async fn release(&self, lease: &Lease) -> Result<()> {
        let token = grant_token(lease)?;
        let c = self.client();
        let channel = &self.inner.channel;
        if lease.permits().is_some() {
            return permits::release(c, lease, token, channel).await;
        }
        c.run(Effect::Write, async |conn| {
            c.query(&c.statements.release)
                .bind(lease.name().as_str())
                .bind(lease.owner().as_str())
                .bind(token)
                .bind(channel.as_str())
                .execute(conn)
                .await
        })
        .await
        .map(drop)
    }

    async fn server_time(&self) -> Result<Option<std::time::SystemTime>> {
        let c = self.client();
        let micros: i64 = c
            .run(Effect::Read, async |conn| {
                let row =
                    sqlx::query("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8")
                        .fetch_one(conn)
                        .await?;
                row.try_get(0)
            })
            .await?;
        let micros = u64::try_from(micros).unwrap_or(0);
        Ok(Some(UNIX_EPOCH + Duration::from_micros(micros)))
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let c = self.client();
        c.run(Effect::Read, async |conn| {
            let row = c
                .query(&c.statements.holder)
                .bind(name.as_str())
                .fetch_optional(conn)
                .await?;
            row.as_ref().map(holder).transpose()
        })
        .await
    }

    /// One statement, streamed row by row: memory grows with the locks listed, not with
    /// the table. A row whose name is not a valid lock name (written by hand) is skipped.
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let c = self.client();
        let mut held = c
            .run(Effect::Read, async |conn| {
                let mut rows = c.query(&c.statements.list).bind(prefix).fetch(conn);
                let mut held = Vec::new();
                while let Some(row) = rows.try_next().await? {
                    let name: String = row.try_get("name")?;
                    match LockName::new(&name) {
                        Ok(name) => held.push(HeldLock::new(name, holder(&row)?)),
                        Err(err) => tracing::warn!(name = %name.escape_debug(), %err,
                            "list: skipping a row whose name is not a lock name"),
                    }
                }
                Ok(held)
            })
            .await?;
        // The statement orders by bytes already; this keeps the contract in a database
        // whose encoding is not UTF-8.
        held.sort_by(|a, b| a.name().cmp(b.name()));
        held.dedup_by(|a, b| a.name() == b.name());
        Ok(held)
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let c = self.client();
        let channel = &self.inner.channel;
        c.run(Effect::Write, async |conn| {
            let row = c
                .query(&c.statements.break_lock)
                .bind(name.as_str())
                .bind(channel.as_str())
                .fetch_optional(conn)
                .await?;
            match row {
                Some(row) if row.try_get::<bool, _>("live")? => holder(&row).map(Some),
                _ => Ok(None),
            }
        })
        .await
    }

    /// One transaction: `BEGIN`, the semaphore's advisory lock, the deciding statement,
    /// `COMMIT` (docs/postgres.md, Semaphores).
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        permits::acquire(self.client(), request).await
    }

    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        permits::holders(self.client(), name).await
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }

    async fn subscribe(&self, name: &LockName) -> Result<Option<ReleaseEvents>> {
        Ok(Some(self.inner.notifier.subscribe(name)))
    }

    /// Asks the server about a pooled connection: `pg_stat_ssl` for TLS, its version and
    /// cipher, `current_user` for the role. What was verified follows from the effective
    /// `sslmode` (the server cannot know); the `LISTEN` connection is not reported.
    async fn connection_security(&self) -> Result<Vec<ConnectionSecurity>> {
        let config = &self.inner.config;
        let c = self.client();
        let row = c
            .run(Effect::Read, async |conn| {
                sqlx::query(sql::CONNECTION_SECURITY)
                    .persistent(false)
                    .fetch_one(conn)
                    .await
                    .and_then(|row| SslRow::from_row(&row))
            })
            .await?;
        let setup = config.tls();
        let transport = if row.ssl {
            let client_certificate = setup.client_certificate || row.client_dn.is_some();
            Transport::Tls(
                TlsDetails::new(setup.verification, client_certificate)
                    .with_roots(setup.roots)
                    .with_negotiated(row.version, row.cipher),
            )
        } else {
            Transport::Plaintext
        };
        let mut identity = format!("user {:?}", row.user);
        if let Some(dn) = row.client_dn.filter(|dn| !dn.is_empty()) {
            identity.push_str(&format!(", client certificate {dn}"));
        }
        Ok(vec![
            ConnectionSecurity::new(config.endpoint(), transport).with_identity(identity),
        ])
    }
}

/// One row of [`sql::CONNECTION_SECURITY`].
struct SslRow {
    ssl: bool,
    version: Option<String>,
    cipher: Option<String>,
    client_dn: Option<String>,
    user: String,
}

impl SslRow {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            ssl: row.try_get::<Option<bool>, _>("ssl")?.unwrap_or(false),
            version: row.try_get("version")?,
            cipher: row.try_get("cipher")?,
            client_dn: row.try_get("client_dn")?,
            user: row.try_get("user")?,
        })
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// What every [`PostgresBackend`] promises, without connecting (for comparison tables).
/// `docs/postgres.md` explains each field.
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        lockcore::Exclusion::SingleStore,
        Fencing::Monotonic,
        ExpiryClock::Server,
    )
    .with_waiting(Waiting::Notified)
    .with_fairness(Fairness::None)
    .with_same_owner_retake(true)
    .with_durability(Durability::SurvivesRestart)
    .with_listing(true)
    .with_semaphores(Semaphores::Supported)
    .with_notes(NOTES)
}
