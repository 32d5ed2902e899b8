//! [`GcsBackend`]: the lock object of Lai's GCS locking post, judged on the server's clock.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use lockcore::{
    Acquire, AcquireRequest, Durability, Error, Exclusion, ExpiryClock, Fairness, FenceToken,
    Fencing, Guarantees, HeldLock, HolderInfo, Lease, LockBackend, LockName, LockOptions, Result,
    Semaphores, Waiting,
};

use crate::client::{Answer, BATCH_LIMIT, GcsClient, Preconditions};
use crate::config::{GcsConfig, MIN_REFRESH_INTERVAL};
use crate::error::{no_bucket, protocol};
use crate::object::{self, LockObject};
use crate::permit_names::{PermitNames, Target};
use crate::reply::Reply;

mod batch;
mod list;

/// The object name (after the prefix) that `server_time` reads; never created.
const CLOCK_PROBE: &str = ".anylock-clock";

const NOTES: &str = "Real GCS sustains about one mutation per second per object, so the \
refresh interval must be at least 1 s (the Locker refuses shorter ones); each call costs tens of milliseconds. Expiry is judged by comparing the object's `updated` \
plus its TTL with the server's one-second-resolution Date header, so a lapsed lock is taken \
over up to 2 s after its TTL. A semaphore keeps one slot object per permit, whose \
generation is the permit's token; a grant costs 3 requests (a list, the slot write, a list \
that checks no other limit was written meanwhile), and each slot takes about one grant per \
second on real GCS; waiters poll.";

/// What [`GcsBackend`] promises, without connecting. See `docs/gcs.md`.
pub fn guarantees() -> Guarantees {
    Guarantees::new(
        Exclusion::SingleStore,
        Fencing::Monotonic,
        ExpiryClock::Server,
    )
    .with_waiting(Waiting::Polled)
    .with_fairness(Fairness::None)
    .with_same_owner_retake(true)
    .with_durability(Durability::SurvivesRestart)
    .with_listing(true)
    .with_semaphores(Semaphores::Supported)
    .with_notes(NOTES)
}

/// Lai's defaults: TTL 5 min, refresh every 37 s, 3 failed refreshes tolerated.
pub fn default_options() -> LockOptions {
    LockOptions::new(Duration::from_secs(300))
        .with_refresh_interval(Duration::from_secs(37))
        .with_max_refresh_failures(3)
}

/// Checks `options` against real GCS's limits: lockcore's own rules, plus a refresh
/// interval of at least [`MIN_REFRESH_INTERVAL`]. A [`Locker`](lockcore::Locker) on a
/// [`GcsBackend`] runs the same check (with the backend's configured minimum) before every
/// acquisition; call this to check options up front.
///
/// # Errors
/// [`InvalidInput`](lockcore::ErrorKind::InvalidInput) when they break either.
pub fn validate_options(options: &LockOptions) -> Result<()> {
    options.validate()?;
    check_refresh(options, MIN_REFRESH_INTERVAL)
}

fn check_refresh(options: &LockOptions, min: Duration) -> Result<()> {
    if options.refresh_interval() < min {
        return Err(Error::invalid_input(format!(
            "refresh interval {:?} is below {min:?}, GCS's ~1 mutation/s per object; use a \
             TTL of at least 8 s or set the interval to 1 s or more",
            options.refresh_interval()
        )));
    }
    Ok(())
}

/// A lock backend over one GCS bucket: one object per lock name.
#[derive(Debug, Clone)]
pub struct GcsBackend {
    pub(crate) client: GcsClient,
}

impl GcsConfig {
    /// The backend this configuration describes, connected ([`GcsBackend::connect`]).
    ///
    /// # Errors
    /// As [`GcsBackend::connect`].
    pub async fn build(self) -> Result<GcsBackend> {
        GcsBackend::connect(self).await
    }
}

impl GcsBackend {
    /// A backend for `config`: builds the HTTP client, reads a credentials file, if any,
    /// and checks that the endpoint can be reached, as the other backends' `connect` does:
    /// a TCP connection and, for `https`, a TLS handshake that verifies the server's
    /// certificate and host name against the OS trust store, each within the request
    /// timeout. Nothing is sent over that connection; the first lock call makes the first
    /// request (and fetches the first token).
    ///
    /// # Errors
    /// [`Config`](lockcore::ErrorKind::Config) when the HTTP client cannot be built, the
    /// credentials would travel in clear, a credentials file is unreadable or malformed,
    /// or the endpoint is `https` in a build without the `tls` feature;
    /// [`PermissionDenied`](lockcore::ErrorKind::PermissionDenied) when the TLS handshake
    /// fails (an untrusted, expired or misnamed certificate: never worth retrying);
    /// [`Unavailable`](lockcore::ErrorKind::Unavailable) when the endpoint cannot be
    /// reached (refused, timed out, a name that does not resolve), naming it and why.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect(config: GcsConfig) -> Result<Self> {
        let client = GcsClient::new(config)?;
        crate::security::reach(client.config()).await?;
        Ok(Self { client })
    }

    /// A backend for a `gs://bucket/prefix[?endpoint=…]` URL.
    ///
    /// # Errors
    /// As [`GcsConfig::from_url`] and [`GcsBackend::connect`].
    pub async fn from_url(url: &str) -> Result<Self> {
        GcsConfig::from_url(url)?.build().await
    }

    /// The configuration.
    pub fn config(&self) -> &GcsConfig {
        self.client.config()
    }

    /// One attempt (Lai's GCS locking post, "Taking the lock"): create-if-absent; on 412
    /// read the object; if it vanished, or is our own leftover or stale on the server's
    /// clock (then deleted exactly), create once more at once. At most two creates, no
    /// loop: anything else is reported and lockcore decides when to try again.
    async fn try_acquire(&self, object: &str, request: &AcquireRequest) -> Result<Acquire> {
        if let Some(acquired) = self.create(object, request).await? {
            return Ok(acquired);
        }
        let Some((existing, date)) = self.read(object).await? else {
            return self.create_again(object, request, None).await;
        };
        if existing.is_owned_by(&request.owner) || existing.is_stale(date) {
            // A 412/404 on this delete means someone else moved first; the create says so.
            let exact = Preconditions::exact(existing.generation, existing.metageneration);
            self.client.delete(object, exact).await?;
            let seen = existing.holder(Some(date));
            return self.create_again(object, request, Some(seen)).await;
        }
        Ok(Acquire::Held(existing.holder(Some(date))))
    }

    /// Create-if-absent: `Some` when granted, `None` on 412.
    async fn create(&self, object: &str, request: &AcquireRequest) -> Result<Option<Acquire>> {
        let metadata = object::grant_metadata(&request.owner, request.ttl, request.note.as_ref());
        let absent = Preconditions {
            generation: Some(0),
            metageneration: None,
        };
        match self.client.insert(object, metadata, absent).await?.reply {
            Reply::Ok(Some(obj)) => Ok(Some(Acquire::Acquired(lease(request, &obj)))),
            Reply::Ok(None) => Err(protocol("the insert reply has no object")),
            Reply::NotFound => Err(no_bucket()),
            Reply::PreconditionFailed => Ok(None),
        }
    }

    /// The object and the server's `Date`, or `None` when it does not exist.
    async fn read(&self, object: &str) -> Result<Option<(LockObject, SystemTime)>> {
        let Answer { reply, date } = self.client.get(object).await?;
        match reply {
            Reply::Ok(Some(obj)) => {
                let date = date.ok_or_else(|| protocol("GCS sent no Date header"))?;
                Ok(Some((obj, date)))
            }
            Reply::NotFound => Ok(None),
            _ => Err(protocol("the object read has no object")),
        }
    }

    /// The attempt's second and last create; on 412 someone else moved first.
    async fn create_again(
        &self,
        object: &str,
        request: &AcquireRequest,
        seen: Option<HolderInfo>,
    ) -> Result<Acquire> {
        if let Some(acquired) = self.create(object, request).await? {
            return Ok(acquired);
        }
        match (self.read(object).await?, seen) {
            (Some((winner, date)), _) => Ok(Acquire::Held(winner.holder(Some(date)))),
            (None, Some(seen)) => Ok(Acquire::Held(seen)),
            (None, None) => Err(Error::unavailable(
                "the lock object changed twice during the attempt; retry",
            )),
        }
    }

    async fn try_refresh(&self, target: &Target, lease: &Lease) -> Result<Lease> {
        match self.extend(target, lease, target.metageneration).await? {
            Some(refreshed) => Ok(refreshed),
            None => self.recover_refresh(target, lease).await,
        }
    }

    /// One PATCH rewriting our metadata, which moves the server's `updated` (and so the
    /// expiry) to when GCS applies it, under exact preconditions (the grant's generation,
    /// `metageneration`); `None` on 412.
    async fn extend(
        &self,
        target: &Target,
        lease: &Lease,
        metageneration: u64,
    ) -> Result<Option<Lease>> {
        let metadata = object::metadata(lease.owner(), lease.ttl());
        let exact = Preconditions::exact(target.generation, metageneration);
        let reply = self
            .client
            .patch(&target.object, metadata, exact)
            .await?
            .reply;
        extended(reply, lease, target, metageneration)
    }

    /// After a refresh's 412: an earlier PATCH whose reply was lost may have applied and
    /// moved the metageneration. When the object is still this grant (same generation, our
    /// identity) and fresh on the server's clock, extend it once more under its current
    /// metageneration: adopting it as it stands would report a full TTL although its
    /// `updated` is as old as that earlier PATCH (issue #14, item 6). Otherwise it is lost.
    async fn recover_refresh(&self, target: &Target, lease: &Lease) -> Result<Lease> {
        let lost = || Error::lost("the lock object changed (deleted, taken over or replaced)");
        let Some((obj, date)) = self.own_object(target, lease).await? else {
            return Err(lost());
        };
        if obj.is_stale(date) {
            return Err(lost());
        }
        match self.extend(target, lease, obj.metageneration).await? {
            Some(refreshed) => Ok(refreshed),
            None => Err(Error::unavailable(
                "the lock object changed again during the refresh; retry",
            )),
        }
    }

    /// The object of `target` when it is still `lease`'s grant: the same generation (no
    /// one recreated it) and our identity, with the server time it was read at.
    async fn own_object(
        &self,
        target: &Target,
        lease: &Lease,
    ) -> Result<Option<(LockObject, SystemTime)>> {
        let found = self.read(&target.object).await?;
        Ok(found.filter(|(obj, _)| {
            obj.generation == target.generation && obj.is_owned_by(lease.owner())
        }))
    }

    /// Deletes our object under exact preconditions. A 412 may mean only that a refresh
    /// whose reply was lost moved the metageneration: when the object is still this grant,
    /// delete it under its current metageneration; otherwise (404, or another generation or
    /// owner) nothing of ours is left.
    async fn try_release(&self, target: &Target, lease: &Lease) -> Result<()> {
        let exact = Preconditions::exact(target.generation, target.metageneration);
        let reply = self.client.delete(&target.object, exact).await?.reply;
        if !matches!(reply, Reply::PreconditionFailed) {
            return Ok(());
        }
        if let Some((obj, _)) = self.own_object(target, lease).await? {
            // A 412 or 404 here means someone else moved first: nothing of ours is left.
            let current = Preconditions::exact(target.generation, obj.metageneration);
            self.client.delete(&target.object, current).await?;
        }
        Ok(())
    }

    /// The live, unexpired object of `object`, with the server time it was read at.
    async fn current(&self, object: &str) -> Result<Option<(LockObject, SystemTime)>> {
        let found = self.read(object).await?;
        Ok(found.filter(|(obj, date)| !obj.is_stale(*date)))
    }

    async fn try_break(&self, object: &str) -> Result<Option<HolderInfo>> {
        let Some((obj, date)) = self.read(object).await? else {
            return Ok(None);
        };
        let only = Preconditions {
            generation: Some(obj.generation),
            metageneration: None,
        };
        match self.client.delete(object, only).await?.reply {
            Reply::Ok(_) => {}
            Reply::NotFound => return Ok(None),
            Reply::PreconditionFailed => {
                return Err(Error::unavailable(
                    "the lock changed hands while breaking it; retry",
                ));
            }
        }
        Ok((!obj.is_stale(date)).then(|| obj.holder(Some(date))))
    }
}

/// The refreshed lease a refresh's PATCH of `target` under `metageneration` answered (alone or in a batch); `None` on 412. A 200 without the object, with another
/// object's generation, or with a metageneration the PATCH did not move (a batch answer
/// matched to the wrong call) proves nothing about the new metageneration: the outcome is
/// unknown, and the next refresh's 412 recovery decides.
fn extended(
    reply: Reply,
    lease: &Lease,
    target: &Target,
    metageneration: u64,
) -> Result<Option<Lease>> {
    let generation = target.generation;
    let unknown = |what: &str| {
        Error::new(
            lockcore::ErrorKind::OutcomeUnknown,
            format!("GCS answered the refresh PATCH {what}"),
        )
    };
    match reply {
        Reply::Ok(Some(obj)) if obj.generation != generation => {
            Err(unknown("with another object's generation"))
        }
        // A PATCH that applied moved the metageneration past the one it matched.
        Reply::Ok(Some(obj)) if obj.metageneration <= metageneration => {
            Err(unknown("with a metageneration it did not move"))
        }
        Reply::Ok(Some(obj)) if obj.is_owned_by(lease.owner()) => {
            Ok(Some(lease.clone().with_grant(target.grant(&obj))))
        }
        Reply::Ok(Some(_)) => Err(Error::lost("the lock object now names another owner")),
        Reply::Ok(None) => Err(unknown("without the object")),
        Reply::NotFound => Err(Error::lost("the lock object was deleted")),
        Reply::PreconditionFailed => Ok(None),
    }
}

fn lease(request: &AcquireRequest, obj: &LockObject) -> Lease {
    Lease::new(
        request.name.clone(),
        request.owner.clone(),
        request.ttl,
        obj.grant(),
    )
    .with_token(FenceToken::new(obj.generation))
}

#[async_trait]
impl LockBackend for GcsBackend {
    fn backend_name(&self) -> &str {
        "gcs"
    }

    fn check_options(&self, options: &LockOptions) -> Result<()> {
        check_refresh(options, self.config().min_refresh_interval())
    }

    async fn acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let object = self.config().object_name(&request.name)?;
        let _slot = self.client.slot().await?;
        self.try_acquire(&object, request).await
    }

    /// A lock's object or a permit's slot object, alike (see `permit_names::Target`).
    async fn refresh(&self, lease: &Lease) -> Result<Lease> {
        let target = Target::of(self.config(), lease)?;
        let _slot = self.client.slot().await?;
        self.try_refresh(&target, lease).await
    }

    /// The PATCHes of up to 100 leases (GCS's batch limit) in one batch request
    /// (`POST /batch/storage/v1`, one request turn), each under its lease's exact
    /// preconditions: one HTTP request where lone refreshes send one each. A 412 is then
    /// recovered as a lone refresh recovers it. An endpoint without batches (404, 405 or
    /// 501 on the batch path) gets lone refreshes, from then on too.
    async fn refresh_many(&self, leases: &[Lease]) -> Vec<Result<Lease>> {
        self.refresh_leases(leases).await
    }

    /// 100 (GCS's batch limit), or 1 for an endpoint with a path (never batched). A
    /// `Locker` reads this once; while the endpoint refuses batches, `refresh_many` sends
    /// each lease alone.
    fn refresh_batch_limit(&self) -> usize {
        if self.client.may_batch() {
            BATCH_LIMIT
        } else {
            1
        }
    }

    /// A lock's object or a permit's slot object, alike (see `permit_names::Target`).
    async fn release(&self, lease: &Lease) -> Result<()> {
        let target = Target::of(self.config(), lease)?;
        let _slot = self.client.slot().await?;
        self.try_release(&target, lease).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let object = self.config().object_name(name)?;
        let _slot = self.client.slot().await?;
        let current = self.current(&object).await?;
        Ok(current.map(|(obj, date)| obj.holder(Some(date))))
    }

    /// One list of the semaphore's objects; when there is room (or our own permit to
    /// retake), the slot's conditional write and one more list that checks the limit.
    /// See `docs/gcs.md`, "Semaphores".
    async fn acquire_permit(&self, request: &AcquireRequest) -> Result<Acquire> {
        let Some(limit) = request.permits else {
            return Err(Error::invalid_input(
                "a permit request without a number of permits",
            ));
        };
        let names = PermitNames::new(self.config(), &request.name)?;
        let _slot = self.client.slot().await?;
        self.try_acquire_permit(&names, request, limit).await
    }

    /// One list of the semaphore's objects (one request per 1000).
    async fn inspect_permits(&self, name: &LockName) -> Result<Vec<HolderInfo>> {
        let names = PermitNames::new(self.config(), name)?;
        let _slot = self.client.slot().await?;
        self.try_inspect_permits(&names).await
    }

    fn guarantees(&self) -> Guarantees {
        guarantees()
    }

    /// `objects.list` pages of up to 1000 objects under the configured prefix + `prefix`,
    /// each item with its metadata: one request per 1000 objects stored under the prefix,
    /// held or not (expired objects nobody deleted count too).
    async fn list(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        let _slot = self.client.slot().await?;
        self.try_list(prefix).await
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<HolderInfo>> {
        let object = self.config().object_name(name)?;
        let _slot = self.client.slot().await?;
        self.try_break(&object).await
    }

    /// One object GET of a name no lock uses (`prefix + ".anylock-clock"`): every reply,
    /// a 404 included, carries `Date`, and it needs only `storage.objects.get`, the
    /// permission the lock itself needs (a bucket GET would need `storage.buckets.get`).
    async fn server_time(&self) -> Result<Option<SystemTime>> {
        let probe = format!("{}{CLOCK_PROBE}", self.config().prefix());
        let _slot = self.client.slot().await?;
        let answer = self.client.get(&probe).await?;
        Ok(answer.date)
    }

    /// One check of the endpoint as `connect` makes it: TLS (with the version and cipher
    /// negotiated) only when a handshake just verified the server's certificate and host
    /// name against the OS trust store; `NotConnected` with the reason when it could not
    /// be reached or the handshake failed; plaintext for `http`.
    async fn connection_security(&self) -> Result<Vec<lockcore::ConnectionSecurity>> {
        crate::security::report(self.config()).await
    }
}

#[cfg(test)]
mod backend_tests;
