//! The in-memory buckets and objects. Every operation on an object checks
//! the rate limit and preconditions and applies its write under the one
//! `&mut Store` borrow the caller holds (the server wraps it in a mutex), so
//! conditional writes are atomic like GCS's.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::ApiError;
use crate::object::{NewObject, Object, Patch};
use crate::precondition::Preconditions;

/// Buckets, live objects, the generation counter and the rate limiter.
#[derive(Debug, Default)]
pub(crate) struct Store {
    buckets: BTreeMap<String, SystemTime>,
    objects: BTreeMap<(String, String), Object>,
    last_generation: i64,
    rate_limit: Option<Duration>,
    last_mutation: HashMap<(String, String), Instant>,
}

impl Store {
    /// Creates a bucket; 409 if it exists.
    pub(crate) fn create_bucket(&mut self, name: &str, now: SystemTime) -> Result<(), ApiError> {
        if self.buckets.contains_key(name) {
            return Err(ApiError::bucket_conflict());
        }
        self.buckets.insert(name.to_owned(), now);
        Ok(())
    }

    /// The bucket's creation time; 404 if it does not exist.
    pub(crate) fn bucket(&self, name: &str) -> Result<SystemTime, ApiError> {
        self.buckets
            .get(name)
            .copied()
            .ok_or_else(ApiError::no_such_bucket)
    }

    /// Turns the per-object mutation rate limit on (`Some`) or off.
    pub(crate) fn set_rate_limit(&mut self, min_interval: Option<Duration>) {
        self.rate_limit = min_interval;
        self.last_mutation.clear();
    }

    /// Writes a new generation of `new.name` if the preconditions hold.
    pub(crate) fn insert(
        &mut self,
        bucket: &str,
        new: NewObject,
        pre: Preconditions,
        now: SystemTime,
    ) -> Result<Object, ApiError> {
        self.bucket(bucket)?;
        let key = (bucket.to_owned(), new.name.clone());
        self.admit(&key)?;
        pre.check(self.objects.get(&key))?;
        let mut object = Object::empty(bucket, &new.name, now);
        object.generation = self.next_generation(now);
        object.data = new.data;
        if let Some(content_type) = new.content_type {
            object.content_type = content_type;
        }
        object.cache_control = new.cache_control;
        object.metadata = new.metadata;
        self.record(key.clone());
        self.objects.insert(key, object.clone());
        Ok(object)
    }

    /// The live object if the preconditions hold; 404 before 412.
    pub(crate) fn get(
        &self,
        bucket: &str,
        name: &str,
        pre: Preconditions,
    ) -> Result<Object, ApiError> {
        let object = self.live(bucket, name)?;
        pre.check(Some(object))?;
        Ok(object.clone())
    }

    /// Applies a metadata patch: merges keys, bumps metageneration and
    /// `updated`; the generation stays.
    pub(crate) fn patch(
        &mut self,
        bucket: &str,
        name: &str,
        patch: Patch,
        pre: Preconditions,
        now: SystemTime,
    ) -> Result<Object, ApiError> {
        let key = self.checked_key(bucket, name, pre)?;
        let object = self
            .objects
            .get_mut(&key)
            .ok_or_else(|| ApiError::no_such_object(bucket, name))?;
        apply_patch(object, patch);
        object.metageneration += 1;
        object.updated = now;
        let patched = object.clone();
        self.record(key);
        Ok(patched)
    }

    /// Deletes the live object if the preconditions hold.
    pub(crate) fn delete(
        &mut self,
        bucket: &str,
        name: &str,
        pre: Preconditions,
    ) -> Result<(), ApiError> {
        let key = self.checked_key(bucket, name, pre)?;
        self.objects.remove(&key);
        self.record(key);
        Ok(())
    }

    /// One page of the live objects whose names start with `prefix`, by name (byte
    /// order): at most `max` of them, after `after` when given; `true` when more follow.
    pub(crate) fn list(
        &self,
        bucket: &str,
        prefix: &str,
        after: Option<&str>,
        max: usize,
    ) -> Result<(Vec<Object>, bool), ApiError> {
        use std::ops::Bound;
        self.bucket(bucket)?;
        let start = match after {
            Some(after) => Bound::Excluded((bucket.to_owned(), after.to_owned())),
            None => Bound::Included((bucket.to_owned(), prefix.to_owned())),
        };
        let mut matching = self
            .objects
            .range((start, Bound::Unbounded))
            .take_while(|((b, _), _)| b == bucket)
            .filter(|((_, n), _)| n.starts_with(prefix))
            .map(|(_, o)| o);
        let page: Vec<Object> = matching.by_ref().take(max).cloned().collect();
        Ok((page, matching.next().is_some()))
    }

    /// 404 (bucket or object), then the rate limit, then the preconditions.
    fn checked_key(
        &self,
        bucket: &str,
        name: &str,
        pre: Preconditions,
    ) -> Result<(String, String), ApiError> {
        let object = self.live(bucket, name)?;
        let key = (bucket.to_owned(), name.to_owned());
        self.admit(&key)?;
        pre.check(Some(object))?;
        Ok(key)
    }

    fn live(&self, bucket: &str, name: &str) -> Result<&Object, ApiError> {
        self.bucket(bucket)?;
        self.objects
            .get(&(bucket.to_owned(), name.to_owned()))
            .ok_or_else(|| ApiError::no_such_object(bucket, name))
    }

    /// A generation above every earlier one: the server clock in
    /// microseconds, like GCS, bumped when the clock has not moved on.
    fn next_generation(&mut self, now: SystemTime) -> i64 {
        let micros = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let micros = i64::try_from(micros).unwrap_or(i64::MAX);
        self.last_generation = micros.max(self.last_generation + 1);
        self.last_generation
    }

    /// 429 when the last accepted mutation of this name is too recent.
    fn admit(&self, key: &(String, String)) -> Result<(), ApiError> {
        let (Some(interval), Some(last)) = (self.rate_limit, self.last_mutation.get(key)) else {
            return Ok(());
        };
        if last.elapsed() < interval {
            return Err(ApiError::rate_limited());
        }
        Ok(())
    }

    fn record(&mut self, key: (String, String)) {
        if self.rate_limit.is_some() {
            self.last_mutation.insert(key, Instant::now());
        }
    }
}

fn apply_patch(object: &mut Object, patch: Patch) {
    match patch.metadata {
        None => {}
        Some(None) => object.metadata.clear(),
        Some(Some(entries)) => {
            for (key, value) in entries {
                match value {
                    Some(value) => object.metadata.insert(key, value),
                    None => object.metadata.remove(&key),
                };
            }
        }
    }
    if let Some(cache_control) = patch.cache_control {
        object.cache_control = cache_control;
    }
    if let Some(content_type) = patch.content_type {
        object.content_type = content_type;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let mut store = Store::default();
        store.create_bucket("b", UNIX_EPOCH).unwrap();
        store
    }

    fn new(name: &str) -> NewObject {
        NewObject {
            name: name.to_owned(),
            ..NewObject::default()
        }
    }

    #[test]
    fn generations_increase_even_when_the_clock_stands_still() {
        let mut store = store();
        let at = UNIX_EPOCH + Duration::from_secs(1);
        let first = store
            .insert("b", new("n"), Preconditions::default(), at)
            .unwrap();
        store.delete("b", "n", Preconditions::default()).unwrap();
        let second = store
            .insert("b", new("n"), Preconditions::default(), at)
            .unwrap();
        assert!(second.generation > first.generation);
    }

    #[test]
    fn list_pages_by_name_after_the_last_one_returned() {
        let mut store = store();
        for name in ["p/b", "p/a", "q", "p/c", "o"] {
            store
                .insert("b", new(name), Preconditions::default(), UNIX_EPOCH)
                .unwrap();
        }
        let names = |page: &[Object]| page.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
        let (page, more) = store.list("b", "p/", None, 2).unwrap();
        assert_eq!(
            (names(&page), more),
            (vec!["p/a".into(), "p/b".into()], true)
        );
        let (page, more) = store.list("b", "p/", Some("p/b"), 2).unwrap();
        assert_eq!((names(&page), more), (vec!["p/c".into()], false));
        let (page, more) = store.list("b", "", None, 10).unwrap();
        assert_eq!(names(&page), ["o", "p/a", "p/b", "p/c", "q"]);
        assert!(!more);
        // Another bucket's objects sort after this one's, never into its pages.
        store.create_bucket("c", UNIX_EPOCH).unwrap();
        store
            .insert("c", new("p/z"), Preconditions::default(), UNIX_EPOCH)
            .unwrap();
        let (page, more) = store.list("b", "p/", Some("p/c"), 10).unwrap();
        assert!(page.is_empty() && !more);
    }

    #[test]
    fn missing_bucket_is_404() {
        let mut store = Store::default();
        let err = store
            .insert("nope", new("n"), Preconditions::default(), UNIX_EPOCH)
            .unwrap_err();
        assert_eq!(err.status, 404);
    }
}
