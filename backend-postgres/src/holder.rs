//! Reading holders from the rows the statements return.

use std::time::{Duration, UNIX_EPOCH};

use lockcore::{FenceToken, HolderInfo, Identity, Note};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// A holder from a row with `owner, token, note, acquired_at_us, expires_in_us`.
pub(crate) fn holder(row: &PgRow) -> Result<HolderInfo, sqlx::Error> {
    let owner: String = row.try_get("owner")?;
    let token: i64 = row.try_get("token")?;
    let note: Option<String> = row.try_get("note")?;
    let acquired_at: Option<i64> = row.try_get("acquired_at_us")?;
    let expires_in: Option<i64> = row.try_get("expires_in_us")?;
    let mut info = HolderInfo::new(Identity::from_stored(owner))
        .with_token(FenceToken::new(token.max(0) as u64))
        .with_note(note.as_deref().and_then(Note::from_stored));
    if let Some(at) = acquired_at.and_then(|us| u64::try_from(us).ok()) {
        info = info.with_acquired_at(UNIX_EPOCH + Duration::from_micros(at));
    }
    if let Some(left) = expires_in {
        info = info.with_expires_in(Duration::from_micros(left.max(0).unsigned_abs()));
    }
    Ok(info)
}
