//! The four JSON-API precondition parameters and GCS's rules for them.

use crate::error::ApiError;
use crate::object::Object;
use crate::query::Query;

/// `ifGenerationMatch`, `ifGenerationNotMatch`, `ifMetagenerationMatch` and
/// `ifMetagenerationNotMatch` from one request's query string.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Preconditions {
    pub(crate) generation_match: Option<i64>,
    pub(crate) generation_not_match: Option<i64>,
    pub(crate) metageneration_match: Option<i64>,
    pub(crate) metageneration_not_match: Option<i64>,
}

impl Preconditions {
    /// Reads the parameters; a value that is not an integer is a 400.
    pub(crate) fn from_query(query: &Query) -> Result<Self, ApiError> {
        Ok(Self {
            generation_match: int_param(query, "ifGenerationMatch")?,
            generation_not_match: int_param(query, "ifGenerationNotMatch")?,
            metageneration_match: int_param(query, "ifMetagenerationMatch")?,
            metageneration_not_match: int_param(query, "ifMetagenerationNotMatch")?,
        })
    }

    /// Checks the preconditions against the live object (`None`: no live
    /// object). Callers that need an object (get, patch, delete) answer 404
    /// before calling this; insert calls it with `None` for a new name.
    ///
    /// GCS's rules: with no live object, only `ifGenerationMatch=0` holds and
    /// every other parameter fails; with a live object, `ifGenerationMatch=0`
    /// fails and the rest compare against its generation and metageneration.
    pub(crate) fn check(&self, live: Option<&Object>) -> Result<(), ApiError> {
        let holds = match live {
            None => {
                self.generation_match.is_none_or(|g| g == 0)
                    && self.generation_not_match.is_none()
                    && self.metageneration_match.is_none()
                    && self.metageneration_not_match.is_none()
            }
            Some(object) => {
                self.generation_match.is_none_or(|g| g == object.generation)
                    && self
                        .generation_not_match
                        .is_none_or(|g| g != object.generation)
                    && self
                        .metageneration_match
                        .is_none_or(|m| m == object.metageneration)
                    && self
                        .metageneration_not_match
                        .is_none_or(|m| m != object.metageneration)
            }
        };
        if holds {
            Ok(())
        } else {
            Err(ApiError::precondition_failed())
        }
    }
}

fn int_param(query: &Query, name: &str) -> Result<Option<i64>, ApiError> {
    query
        .get(name)
        .map(|raw| {
            raw.parse::<i64>()
                .map_err(|_| ApiError::bad_request(format!("Invalid value for {name}: {raw:?}")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Object;

    fn object(generation: i64, metageneration: i64) -> Object {
        let mut o = Object::empty("b", "n", std::time::SystemTime::UNIX_EPOCH);
        o.generation = generation;
        o.metageneration = metageneration;
        o
    }

    fn pre(gm: Option<i64>, gnm: Option<i64>, mm: Option<i64>, mnm: Option<i64>) -> Preconditions {
        Preconditions {
            generation_match: gm,
            generation_not_match: gnm,
            metageneration_match: mm,
            metageneration_not_match: mnm,
        }
    }

    #[test]
    fn missing_object_only_generation_zero_holds() {
        assert!(pre(None, None, None, None).check(None).is_ok());
        assert!(pre(Some(0), None, None, None).check(None).is_ok());
        assert!(pre(Some(5), None, None, None).check(None).is_err());
        assert!(pre(None, Some(0), None, None).check(None).is_err());
        assert!(pre(None, Some(5), None, None).check(None).is_err());
        assert!(pre(None, None, Some(1), None).check(None).is_err());
        assert!(pre(None, None, None, Some(1)).check(None).is_err());
    }

    #[test]
    fn live_object_compares_each_parameter() {
        let o = object(7, 2);
        assert!(pre(Some(7), None, None, None).check(Some(&o)).is_ok());
        assert!(pre(Some(0), None, None, None).check(Some(&o)).is_err());
        assert!(pre(Some(8), None, None, None).check(Some(&o)).is_err());
        assert!(pre(None, Some(8), None, None).check(Some(&o)).is_ok());
        assert!(pre(None, Some(7), None, None).check(Some(&o)).is_err());
        assert!(pre(None, None, Some(2), None).check(Some(&o)).is_ok());
        assert!(pre(None, None, Some(1), None).check(Some(&o)).is_err());
        assert!(pre(None, None, None, Some(1)).check(Some(&o)).is_ok());
        assert!(pre(None, None, None, Some(2)).check(Some(&o)).is_err());
        assert!(pre(Some(7), None, Some(3), None).check(Some(&o)).is_err());
    }
}
