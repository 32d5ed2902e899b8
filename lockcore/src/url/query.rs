//! [`Query`]: a URL's query parameters, each taken once by a typed reader.

use std::str::FromStr;
use std::time::Duration;

use super::percent_decode;
use crate::error::Error;

/// What [`Query::take_duration`] accepts.
const DURATION_RULE: &str =
    "must be a positive whole number of milliseconds, written like 500ms, 5s or 1m";

/// A URL's query parameters. Take each one the backend reads with a typed reader, then
/// call [`finish`](Query::finish), which refuses whatever is left.
///
/// Messages name the backend and the parameter, never a value (a misspelled `password=`
/// holds a secret), and never a name holding `@`: that is most likely the rest of a
/// password written with a raw `?`.
#[derive(Clone, PartialEq, Eq)]
pub struct Query {
    backend: &'static str,
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Splits `query` (the text after `?`, without it) into percent-decoded pairs. A
    /// parameter without `=` has the empty value (`?tls` is `tls=`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for bad percent-encoding
    /// or a parameter given twice.
    pub fn parse(backend: &'static str, query: &str) -> Result<Self, Error> {
        let mut pairs = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key, "parameter names")?;
            let value = percent_decode(value, "parameter values")?;
            pairs.push((key, value));
        }
        Self::from_pairs(backend, pairs)
    }

    /// Pairs already percent-decoded by [`parse`](Self::parse); a parameter given twice is
    /// refused, as which of the two was meant cannot be known.
    fn from_pairs<K, V>(
        backend: &'static str,
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, Error>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let mut query = Self {
            backend,
            pairs: Vec::new(),
        };
        for (key, value) in pairs {
            let key = key.into();
            if query.pairs.iter().any(|(k, _)| *k == key) {
                return Err(query.refuse(&key, "is given twice; give it once"));
            }
            query.pairs.push((key, value.into()));
        }
        Ok(query)
    }

    /// Takes `key`'s value as text.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let at = self.pairs.iter().position(|(k, _)| k == key)?;
        Some(self.pairs.remove(at).1)
    }

    /// Takes every parameter whose name satisfies `wanted`, in order (for parameters a
    /// driver reads itself).
    pub fn take_matching(&mut self, wanted: impl Fn(&str) -> bool) -> Vec<(String, String)> {
        let (taken, kept) = std::mem::take(&mut self.pairs)
            .into_iter()
            .partition(|(k, _)| wanted(k));
        self.pairs = kept;
        taken
    }

    /// Takes a yes/no parameter: `true`, `1`, `yes`, `on` or empty (`?tls`), or `false`, `0`,
    /// `no`, `off`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for another value.
    pub fn take_flag(&mut self, key: &str) -> Result<Option<bool>, Error> {
        self.take_with(key, "must be true or false", |v| match v {
            "" | "true" | "1" | "yes" | "on" => Some(true),
            "false" | "0" | "no" | "off" => Some(false),
            _ => None,
        })
    }

    /// Takes a positive whole number of milliseconds (`timeout_ms=250`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for anything else.
    pub fn take_millis(&mut self, key: &str) -> Result<Option<Duration>, Error> {
        self.take_with(
            key,
            "must be a positive whole number of milliseconds",
            |v| {
                v.parse::<u64>()
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis)
            },
        )
    }

    /// Takes a positive duration as people write them (`500ms`, `5s`, `1m`, or seconds):
    /// [`parse_duration`](crate::parse_duration), in whole milliseconds (what every
    /// backend's timeouts resolve, and what a config's `Display` writes back exactly).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for anything else,
    /// `100us` included.
    pub fn take_duration(&mut self, key: &str) -> Result<Option<Duration>, Error> {
        self.take_with(key, DURATION_RULE, |v| {
            crate::parse_duration(v)
                .ok()
                .filter(|d| !d.is_zero() && d.subsec_nanos() % 1_000_000 == 0)
        })
    }

    /// Takes a value of any type that parses from text (a whole number, say).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) saying the parameter
    /// `must be` `what`.
    pub fn take_parsed<T: FromStr>(&mut self, key: &str, what: &str) -> Result<Option<T>, Error> {
        self.take_with(key, &format!("must be {what}"), |v| v.parse().ok())
    }

    /// Refuses whatever was not taken, naming the first such parameter and `known`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when a parameter is left.
    pub fn finish(self, known: &[&str]) -> Result<(), Error> {
        match self.pairs.first() {
            None => Ok(()),
            Some((key, _)) => {
                Err(self.refuse(key, &format!("is unknown; known: {}", known.join(", "))))
            }
        }
    }

    fn take_with<T>(
        &mut self,
        key: &str,
        rule: &str,
        read: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        match self.take(key) {
            None => Ok(None),
            Some(value) => read(value.trim())
                .map(Some)
                .ok_or_else(|| self.refuse(key, rule)),
        }
    }

    /// `unknown redis URL parameter `x`; …` style messages; `rule` starts with a verb.
    fn refuse(&self, key: &str, rule: &str) -> Error {
        let backend = self.backend;
        if key.contains('@') {
            return Error::invalid_input(format!(
                "a {backend} URL parameter (not shown: it holds '@') {rule}; if it is part of \
                 a password, percent-encode '?', '#' and '@' in the password as %3F, %23 and %40"
            ));
        }
        match rule.strip_prefix("is unknown; ") {
            Some(known) => {
                Error::invalid_input(format!("unknown {backend} URL parameter `{key}`; {known}"))
            }
            None => Error::invalid_input(format!("the {backend} URL parameter `{key}` {rule}")),
        }
    }
}

impl std::fmt::Debug for Query {
    /// Names only: values may be secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Query")
            .field("backend", &self.backend)
            .field(
                "names",
                &self.pairs.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(text: &str) -> Query {
        Query::parse("etcd", text).expect("parses")
    }

    #[test]
    fn typed_readers_name_the_parameter_and_never_the_value() {
        for (text, take, message) in [
            (
                "tls=maybe",
                "flag",
                "the etcd URL parameter `tls` must be true or false",
            ),
            (
                "t=0",
                "millis",
                "the etcd URL parameter `t` must be a positive whole number of milliseconds",
            ),
            (
                "n=-1",
                "number",
                "the etcd URL parameter `n` must be a whole number",
            ),
        ] {
            check(text, take, message);
        }
        for text in ["t=soon", "t=0s", "t=100us", "t=0.0001"] {
            check(
                text,
                "duration",
                &format!("the etcd URL parameter `t` {DURATION_RULE}"),
            );
        }
        fn check(text: &str, take: &str, message: &str) {
            let mut q = query(text);
            let err = match take {
                "flag" => q.take_flag("tls").map(drop),
                "millis" => q.take_millis("t").map(drop),
                "duration" => q.take_duration("t").map(drop),
                _ => q.take_parsed::<u32>("n", "a whole number").map(drop),
            }
            .expect_err(text);
            assert_eq!(err.message(), message);
        }
    }

    #[test]
    fn reads_values_and_refuses_what_is_left() {
        let mut q = query("tls&timeout=1m30s&t_ms=5&n=7&x=a%2Bb+c&options%5Ba%5D=1");
        assert_eq!(q.take_flag("tls").expect("ok"), Some(true));
        assert_eq!(
            q.take_duration("timeout").expect("ok"),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            q.take_millis("t_ms").expect("ok"),
            Some(Duration::from_millis(5))
        );
        assert_eq!(q.take_parsed::<u32>("n", "n").expect("ok"), Some(7));
        assert_eq!(q.take("x").as_deref(), Some("a+b+c"));
        assert_eq!(q.take("absent"), None);
        let driver = q.take_matching(|k| k.starts_with("options["));
        assert_eq!(driver, [("options[a]".to_owned(), "1".to_owned())]);
        q.finish(&[]).expect("nothing left");
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        let err = query("pasword=S3CRET")
            .finish(&["tls", "ca"])
            .expect_err("unknown");
        assert_eq!(
            err.message(),
            "unknown etcd URL parameter `pasword`; known: tls, ca"
        );
        let err = query("rest@host=1").finish(&["tls"]).expect_err("unknown");
        assert!(!err.to_string().contains("rest"), "{err}");
        assert!(err.to_string().contains("not shown"), "{err}");
        let err = Query::parse("etcd", "tls=true&tls=false").expect_err("twice");
        assert_eq!(
            err.message(),
            "the etcd URL parameter `tls` is given twice; give it once"
        );
        assert!(Query::parse("etcd", "ca=%zz").is_err());
        let debug = format!("{:?}", query("password=S3CRET"));
        assert!(!debug.contains("S3CRET"), "{debug}");
    }
}
