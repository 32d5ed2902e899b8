//! JSON resources in and out: object and bucket resources as GCS renders
//! them, and the request bodies of insert metadata and PATCH.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::object::{MetadataEntries, NewObject, Object, Patch};

/// Characters GCS percent-encodes in an object name inside a URL path.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// An object name encoded as one URL path segment (`/` becomes `%2F`).
pub(crate) fn encode_name(name: &str) -> String {
    utf8_percent_encode(name, PATH_SEGMENT).to_string()
}

/// The object resource: strings for the 64-bit numbers, RFC 3339
/// timestamps with milliseconds, `metadata` and `cacheControl` only when set.
pub(crate) fn object_json(object: &Object, base_url: &str) -> Value {
    let (bucket, name) = (&object.bucket, encode_name(&object.name));
    let mut resource = json!({
        "kind": "storage#object",
        "id": format!("{}/{}/{}", object.bucket, object.name, object.generation),
        "selfLink": format!("{base_url}/storage/v1/b/{bucket}/o/{name}"),
        "mediaLink": format!(
            "{base_url}/download/storage/v1/b/{bucket}/o/{name}?generation={}&alt=media",
            object.generation
        ),
        "name": object.name,
        "bucket": object.bucket,
        "generation": object.generation.to_string(),
        "metageneration": object.metageneration.to_string(),
        "contentType": object.content_type,
        "storageClass": "STANDARD",
        "size": object.data.len().to_string(),
        "etag": format!("{:x}-{:x}", object.generation, object.metageneration),
        "timeCreated": rfc3339_millis(object.time_created),
        "updated": rfc3339_millis(object.updated),
        "timeStorageClassUpdated": rfc3339_millis(object.time_created),
    });
    if let Some(cache_control) = &object.cache_control {
        resource["cacheControl"] = json!(cache_control);
    }
    if !object.metadata.is_empty() {
        resource["metadata"] = json!(object.metadata);
    }
    resource
}

/// The bucket resource (the fields a test may look at).
pub(crate) fn bucket_json(name: &str, created: SystemTime, base_url: &str) -> Value {
    json!({
        "kind": "storage#bucket",
        "id": name,
        "name": name,
        "selfLink": format!("{base_url}/storage/v1/b/{name}"),
        "projectNumber": "0",
        "metageneration": "1",
        "location": "US",
        "storageClass": "STANDARD",
        "etag": "CAE=",
        "timeCreated": rfc3339_millis(created),
        "updated": rfc3339_millis(created),
    })
}

/// Reads the JSON metadata part of a multipart insert into `new`.
pub(crate) fn read_insert_metadata(body: &[u8], new: &mut NewObject) -> Result<(), ApiError> {
    let fields = json_object(body)?;
    if let Some(name) = optional_string(&fields, "name")? {
        new.name = name;
    }
    new.cache_control = optional_string(&fields, "cacheControl")?;
    if let Some(content_type) = optional_string(&fields, "contentType")? {
        new.content_type = Some(content_type);
    }
    if let Some(entries) = metadata_entries(&fields)? {
        new.metadata = entries
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect();
    }
    Ok(())
}

/// Reads a PATCH body: `metadata` (merged; null values remove keys, a null
/// map removes all), `cacheControl` and `contentType`. Other fields are
/// ignored.
pub(crate) fn read_patch(body: &[u8]) -> Result<Patch, ApiError> {
    let fields = json_object(body)?;
    let metadata = match fields.get("metadata") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(_) => Some(metadata_entries(&fields)?),
    };
    let cache_control = match fields.get("cacheControl") {
        None => None,
        Some(_) => Some(optional_string(&fields, "cacheControl")?),
    };
    let content_type = optional_string(&fields, "contentType")?;
    Ok(Patch {
        metadata,
        cache_control,
        content_type,
    })
}

fn metadata_entries(fields: &Map<String, Value>) -> Result<Option<MetadataEntries>, ApiError> {
    let map = match fields.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(ApiError::bad_request("metadata must be an object")),
    };
    let entry = |(key, value): (&String, &Value)| match value {
        Value::Null => Ok((key.clone(), None)),
        Value::String(s) => Ok((key.clone(), Some(s.clone()))),
        _ => Err(ApiError::bad_request(format!(
            "metadata.{key} must be a string"
        ))),
    };
    map.iter().map(entry).collect::<Result<_, _>>().map(Some)
}

fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON body: {e}"))),
    }
}

fn optional_string(fields: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(format!("{key} must be a string"))),
    }
}

/// The last instant RFC 3339 can write: 9999-12-31T23:59:59.999999999Z.
const LAST_RFC3339: Duration = Duration::new(253_402_300_799, 999_999_999);

/// `2024-05-07T12:34:56.789Z`: UTC, millisecond precision, like GCS (clamped to
/// 1970–9999, where humantime's formatting works).
pub(crate) fn rfc3339_millis(time: SystemTime) -> String {
    let time = time.clamp(UNIX_EPOCH, UNIX_EPOCH + LAST_RFC3339);
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_with_millis() {
        let t = UNIX_EPOCH + Duration::from_millis(1_715_085_296_789);
        assert_eq!(rfc3339_millis(t), "2024-05-07T12:34:56.789Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339_millis(before), "1970-01-01T00:00:00.000Z");
        let after = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(rfc3339_millis(after), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn encodes_slashes_in_names() {
        assert_eq!(encode_name("locks/a b~c"), "locks%2Fa%20b~c");
    }

    #[test]
    fn patch_null_values_remove_keys() {
        let patch = read_patch(br#"{"metadata":{"a":"1","b":null},"cacheControl":null}"#).unwrap();
        let entries = patch.metadata.unwrap().unwrap();
        assert!(entries.contains(&("a".into(), Some("1".into()))));
        assert!(entries.contains(&("b".into(), None)));
        assert_eq!(patch.cache_control, Some(None));
    }
}
