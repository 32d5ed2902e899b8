//! Reading a config from an `etcd://` URL or the environment.

use lockcore::Error;
use lockcore::url::{Query, percent_decode};

use super::{EtcdConfig, SCHEME, TLS_SCHEME, URL_ENV};

/// The query parameters an etcd URL takes.
const KNOWN: &[&str] = &["tls", "timeout", "connect_timeout", "ca", "cert", "key"];

impl EtcdConfig {
    /// Parses an `etcd://` or `etcds://` URL (see the type docs).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for another scheme, a
    /// malformed host, an unknown option or a bad option value. Messages never contain the
    /// password.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("etcds://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("etcd://") {
            (false, rest)
        } else {
            let scheme = url.split_once("://").map_or("", |(s, _)| s);
            return Err(Error::invalid_input(format!(
                "not an etcd URL (scheme {scheme:?}; expected {SCHEME}:// or {TLS_SCHEME}://)"
            )));
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.split_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        if hosts.contains('@') {
            // Never echo the authority: it holds passwords.
            return Err(Error::invalid_input(
                "etcd URL credentials go once, before the first host \
                 (etcd://user:password@h1,h2); percent-encode '@' as %40",
            ));
        }
        let endpoints = Self::new(hosts.split(',')).map_err(|err| {
            // A raw '/' or '?' in a password ends the host list before its '@' (`u:pa/ss@h`):
            // then the "host" holds part of the password and must not be echoed.
            if userinfo.is_none() && (path.contains('@') || query.contains('@')) {
                Error::invalid_input(
                    "malformed etcd URL host list; percent-encode '/', '?', '#' and '@' \
                     in a password (%2F, %3F, %23, %40)",
                )
            } else {
                err
            }
        })?;
        let mut config = endpoints.with_prefix(&percent_decode(path, "prefix")?);
        config.tls = tls;
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            config.user = Some(percent_decode(user, "user name")?);
            config.password = Some(percent_decode(password, "password")?);
        }
        config.take_options(Query::parse(SCHEME, query)?)?;
        if tls && !config.tls {
            return Err(Error::new(
                lockcore::ErrorKind::Config,
                "`tls=false` on an `etcds://` URL asks for TLS and plaintext at once; use \
                 `etcd://` for plaintext",
            ));
        }
        if !config.tls {
            config.tls_files.refuse_on_plaintext(SCHEME, TLS_SCHEME)?;
        }
        Ok(config)
    }

    /// Reads the URL from `ANYLOCK_ETCD_URL`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) when the variable is unset; as
    /// [`from_url`](Self::from_url) otherwise.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::from_url(url.trim()),
            _ => Err(Error::new(
                lockcore::ErrorKind::Config,
                format!("{URL_ENV} is not set (expected an etcd:// URL)"),
            )),
        }
    }

    /// Reads the query parameters: `tls`, the two timeouts, and the TLS files.
    fn take_options(&mut self, mut query: Query) -> Result<(), Error> {
        if let Some(tls) = query.take_flag("tls")? {
            self.tls = tls;
        }
        if let Some(timeout) = query.take_duration("timeout")? {
            self.request_timeout = timeout;
        }
        if let Some(timeout) = query.take_duration("connect_timeout")? {
            self.connect_timeout = timeout;
        }
        for key in ["ca", "cert", "key"] {
            if let Some(path) = query.take(key) {
                self.tls_files.take_param(key, &path)?;
            }
        }
        query.finish(KNOWN)
    }
}
