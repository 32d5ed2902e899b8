//! An object as the store keeps it, and what inserts and patches write to it.

use std::collections::BTreeMap;
use std::time::SystemTime;

use bytes::Bytes;

/// One live object generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Object {
    pub(crate) bucket: String,
    pub(crate) name: String,
    pub(crate) generation: i64,
    pub(crate) metageneration: i64,
    pub(crate) data: Bytes,
    pub(crate) content_type: String,
    pub(crate) cache_control: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) time_created: SystemTime,
    pub(crate) updated: SystemTime,
}

impl Object {
    /// An empty object (generation 0 until the store assigns one).
    pub(crate) fn empty(bucket: &str, name: &str, now: SystemTime) -> Self {
        Self {
            bucket: bucket.to_owned(),
            name: name.to_owned(),
            generation: 0,
            metageneration: 1,
            data: Bytes::new(),
            content_type: "application/octet-stream".to_owned(),
            cache_control: None,
            metadata: BTreeMap::new(),
            time_created: now,
            updated: now,
        }
    }
}

/// What an insert writes: the name, content and the resource fields GCS
/// lets a client set that this server keeps.
#[derive(Debug, Clone, Default)]
pub(crate) struct NewObject {
    pub(crate) name: String,
    pub(crate) data: Bytes,
    pub(crate) content_type: Option<String>,
    pub(crate) cache_control: Option<String>,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// Metadata keys to set (`Some`) or remove (`None`).
pub(crate) type MetadataEntries = Vec<(String, Option<String>)>;

/// A metadata PATCH: `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Patch {
    /// `Some(None)`: `"metadata": null`, remove every key.
    pub(crate) metadata: Option<Option<MetadataEntries>>,
    /// `Some(None)`: `"cacheControl": null`.
    pub(crate) cache_control: Option<Option<String>>,
    pub(crate) content_type: Option<String>,
}
