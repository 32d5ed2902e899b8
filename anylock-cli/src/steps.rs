//! One lock across several CI steps: `acquire`, `verify` and `release` for an owner the
//! user names (`--owner`, `ANYLOCK_OWNER`), the same in every process on every runner.
//!
//! No process keeps the lease alive between the steps: `acquire` leaves it to last its
//! TTL. `verify` only reads. `release` needs the lease as the backend granted it, which a
//! new process does not have: it checks that the owner holds the lock, then makes one
//! same-owner retake (a new grant of the owner's own lock, with a new fence token) and
//! releases that grant by compare-and-delete. A lock held by anyone else answers the
//! retake with `Held`, and nothing is touched.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anylock::Config;
use lockcore::{
    Error, ErrorKind, HolderInfo, Identity, LockBackend, LockName, LockOptions, Locker, WaitMode,
};

use crate::cli::{AcquireArgs, OwnerArgs};
use crate::run::{acquire_with_status, timestamp, wait_mode};
use crate::select::{backend_url, connect};

/// `acquire`'s TTL unless `--ttl` is given.
const DEFAULT_TTL: Duration = Duration::from_secs(30 * 60);
/// The TTL of the retake `release` makes: the grant lives for one round trip, and for this
/// long if `release` dies before its release arrives.
const RELEASE_TTL: Duration = Duration::from_secs(30);

/// `anylock acquire`; returns the exit code.
pub(crate) async fn acquire(args: AcquireArgs, config: &Config, quiet: bool) -> u8 {
    let conflict = args.waiting.conflict_exit_code;
    match acquire_inner(&args, config, quiet).await {
        Ok(()) => 0,
        Err(err) => crate::run::failed(&err, conflict),
    }
}

async fn acquire_inner(args: &AcquireArgs, config: &Config, quiet: bool) -> Result<(), Error> {
    let owner = owner(&args.held.owner)?;
    let ttl = args.ttl.unwrap_or(DEFAULT_TTL);
    let mut options = LockOptions::new(ttl).with_wait(wait_mode(
        args.waiting.no_wait,
        args.waiting.wait,
        config,
    )?);
    if let Some(note) = args.note.get() {
        options = options.with_note(note.clone());
    }
    options.validate()?;
    let backend = connect(&backend_url(config)?).await?;
    let locker = Locker::new(backend)
        .with_identity(owner)
        .with_options(options);
    let guard = acquire_with_status(&locker, &args.held.name, None, quiet).await?;
    // Counted from when the grant was requested, minus the drift allowance: the printed
    // expiry is never later than the server's.
    let expires_at = SystemTime::now() + guard.remaining_validity();
    let lease = guard.detach().await?;
    let name = lease.name().as_str();
    let id = &args.held.owner;
    if args.json {
        let mut object = serde_json::json!({
            "name": name,
            "owner": id,
            "ttl_ms": lease.ttl().as_millis(),
            "expires_at": humantime::format_rfc3339_millis(expires_at).to_string(),
        });
        if let Some(token) = lease.token() {
            object["fence_token"] = token.get().into();
        }
        out!("{object}");
        return Ok(());
    }
    out!("ANYLOCK_NAME={name}");
    out!("ANYLOCK_OWNER={id}");
    if let Some(token) = lease.token() {
        out!("ANYLOCK_FENCE_TOKEN={token}");
    }
    out!("ANYLOCK_EXPIRES_AT={}", timestamp(expires_at));
    Ok(())
}

/// `anylock verify`: `Ok` when the owner holds the lock; a `Lost` error otherwise.
pub(crate) async fn verify(args: &OwnerArgs, json: bool, config: &Config) -> Result<(), Error> {
    let owner = owner(&args.owner)?;
    let name = LockName::new(&args.name)?;
    let backend = connect(&backend_url(config)?).await?;
    let holder = inspect(&backend, &name).await?;
    let held = holder.as_ref().filter(|h| *h.owner() == owner);
    if json {
        let mut object = serde_json::json!({ "name": name.as_str(), "owner": args.owner, "held": held.is_some() });
        if let Some(left) = held.and_then(HolderInfo::expires_in) {
            object["expires_in_ms"] = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).into();
        }
        if let Some(token) = held.and_then(HolderInfo::token) {
            object["fence_token"] = token.get().into();
        }
        out!("{object}");
    }
    let Some(held) = held else {
        return Err(not_held(&*backend, &name, &args.owner, holder.as_ref()));
    };
    if !json {
        out!("{}", describe(&name, &args.owner, held));
    }
    Ok(())
}

/// `anylock release`: releases the lock only if the owner holds it.
pub(crate) async fn release(args: &OwnerArgs, config: &Config) -> Result<(), Error> {
    let owner = owner(&args.owner)?;
    let name = LockName::new(&args.name)?;
    let backend = connect(&backend_url(config)?).await?;
    // Checked first, so that a free lock is not granted only to be released.
    let holder = inspect(&backend, &name).await?;
    if holder.as_ref().is_none_or(|h| *h.owner() != owner) {
        return Err(not_held(&*backend, &name, &args.owner, holder.as_ref()));
    }
    let options = LockOptions::new(RELEASE_TTL).with_wait(WaitMode::TryOnce);
    let locker = Locker::new(backend.clone())
        .with_identity(owner)
        .with_options(options);
    let guard = match locker.acquire(name.as_str()).await {
        Ok(guard) => guard,
        // Someone else holds it now: theirs, left alone. Either the owner's lease expired
        // and was taken since the check, or the retake itself gave the owner's lease up
        // (GCS deletes then re-creates; etcd hands it to the first queued waiter) and a
        // contender won: either way the owner no longer holds it.
        Err(err) if err.kind() == ErrorKind::Held => {
            let now = err
                .holder()
                .map_or_else(|| "someone else".to_owned(), |h| h.owner().to_string());
            return Err(Error::lost(format!(
                "owner {} no longer holds it: it is held by {now}, whose lease was not touched",
                args.owner
            ))
            .with_backend(backend.backend_name().to_owned())
            .with_lock(&name));
        }
        Err(err) => return Err(err),
    };
    guard.release().await?;
    out!("released {name} (owner {})", args.owner);
    Ok(())
}

/// The owner named by the user.
fn owner(id: &str) -> Result<Identity, Error> {
    Identity::named(id).map_err(|e| {
        Error::invalid_input(format!("--owner / ANYLOCK_OWNER {id:?}: {}", e.message()))
    })
}

async fn inspect(
    backend: &Arc<dyn LockBackend>,
    name: &LockName,
) -> Result<Option<HolderInfo>, Error> {
    Locker::new(Arc::clone(backend))
        .inspect(name.as_str())
        .await
}

/// The `Lost` error of `verify` and `release` (exit 122).
fn not_held(
    backend: &dyn LockBackend,
    name: &LockName,
    id: &str,
    holder: Option<&HolderInfo>,
) -> Error {
    let now = match holder {
        Some(holder) => format!("it is held by {}", holder.owner()),
        None => "it is free (released, expired or broken)".to_owned(),
    };
    Error::lost(format!(
        "not held by owner {id}: {now}; nothing was changed"
    ))
    .with_backend(backend.backend_name().to_owned())
    .with_lock(name)
}

/// "NAME is held by owner ID: expires in 29m 58s, fence token 7".
fn describe(name: &LockName, id: &str, holder: &HolderInfo) -> String {
    let mut text = format!("{name} is held by owner {id}");
    let mut sep = ": ";
    if let Some(left) = holder.expires_in() {
        let left = Duration::from_secs(left.as_secs());
        text.push_str(&format!(
            "{sep}expires in {}",
            humantime::format_duration(left)
        ));
        sep = ", ";
    }
    if let Some(token) = holder.token() {
        text.push_str(&format!("{sep}fence token {token}"));
    }
    text
}
