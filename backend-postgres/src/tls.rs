//! TLS for PostgreSQL: the `ca`, `cert` and `key` URL parameters (and their libpq names
//! `sslrootcert`, `sslcert`, `sslkey`), read and checked before any connection, the
//! effective `sslmode` (libpq's rule: `require` with a root certificate is `verify-ca`), and
//! the failures sqlx reports, worded by [`anylock_tls::diagnose`].

use anylock_tls::{TlsFiles, TlsMaterial};
use lockcore::url::Query;
use lockcore::{Result, Verification};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The libpq (and sqlx) names of anylock's TLS file parameters, with the name they stand for.
pub(crate) const ALIASES: &[(&str, &str)] = &[
    ("sslrootcert", "ca"),
    ("ssl-root-cert", "ca"),
    ("ssl-ca", "ca"),
    ("sslcert", "cert"),
    ("ssl-cert", "cert"),
    ("sslkey", "key"),
    ("ssl-key", "key"),
];

/// libpq's environment variables for the same files; sqlx reads them too, so anylock takes
/// them over (checked like the URL parameters) when the URL names no file.
const ENV: &[(&str, &str)] = &[
    ("PGSSLROOTCERT", "ca"),
    ("PGSSLCERT", "cert"),
    ("PGSSLKEY", "key"),
];

/// The TLS file parameters of one URL, under whichever name they were given.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsParams {
    files: TlsFiles,
    /// The name each canonical parameter was given under (`ca` or `sslrootcert`...).
    given: Vec<(&'static str, String)>,
    /// `sslmode` (or `ssl-mode`) appeared in the URL.
    explicit_mode: bool,
}

impl TlsParams {
    /// Takes the TLS file parameters (under any of their names, in URL order) out of
    /// `query`, then the files named by libpq's environment variables where the URL named
    /// none. `explicit_mode`: the URL sets `sslmode` (or `ssl-mode`).
    ///
    /// # Errors
    /// As [`take`](Self::take) and [`take_env`](Self::take_env).
    pub(crate) fn read(query: &mut Query, explicit_mode: bool) -> Result<Self> {
        let mut params = Self {
            explicit_mode,
            ..Self::default()
        };
        for (name, value) in query.take_matching(is_file_param) {
            params.take(&name, &value)?;
        }
        params.take_env()?;
        Ok(params)
    }

    /// Takes `name=value` when it is a TLS file parameter; `Ok(false)` for any other
    /// parameter.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](lockcore::ErrorKind::InvalidInput) for an empty path,
    /// or a file given twice (under one name or under a name and its alias).
    pub(crate) fn take(&mut self, name: &str, value: &str) -> Result<bool> {
        let canonical = match ALIASES.iter().find(|(alias, _)| *alias == name) {
            Some((_, canonical)) => *canonical,
            None if matches!(name, "ca" | "cert" | "key") => canonical_name(name),
            None => return Ok(false),
        };
        if let Some((_, first)) = self.given.iter().find(|(c, _)| *c == canonical)
            && first != name
        {
            return Err(lockcore::Error::invalid_input(format!(
                "URL parameters `{first}` and `{name}` both name the `{canonical}` file; give one"
            )));
        }
        self.files.take_param(canonical, value)?;
        self.given.push((canonical, name.to_owned()));
        Ok(true)
    }

    /// Adds the files named by `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` where the URL
    /// named none.
    fn take_env(&mut self) -> Result<()> {
        for (var, canonical) in ENV {
            let Some(value) = std::env::var_os(var) else {
                continue;
            };
            if self.given.iter().any(|(c, _)| c == canonical) || value.is_empty() {
                continue;
            }
            let value = value.to_string_lossy().into_owned();
            self.files.take_param(canonical, &value)?;
            self.given.push((canonical, (*var).to_owned()));
        }
        Ok(())
    }

    /// Reads the files and applies them and the effective `sslmode` to `options`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](lockcore::ErrorKind::Config) for an unreadable or non-PEM
    /// file, a certificate without its key, TLS files with an `sslmode` that would not
    /// use or not check them, or a password with an `sslmode` that may send it without TLS.
    pub(crate) fn apply(&self, options: PgConnectOptions) -> Result<(PgConnectOptions, TlsSetup)> {
        let tcp = over_tcp(&options);
        let password = tcp && has_password(&options);
        let (mode, defaulted) = self.effective_mode(options.get_ssl_mode(), tcp, password)?;
        let material = self.files.load()?;
        let mut options = options.ssl_mode(mode);
        if let Some(ca) = material.ca() {
            options = options.ssl_root_cert_from_pem(ca.pem().to_vec());
        }
        if let Some(client) = material.client() {
            options = options
                .ssl_client_cert_from_pem(client.cert_pem())
                .ssl_client_key_from_pem(client.key_pem());
        }
        Ok((options, TlsSetup::new(mode, defaulted, &material)))
    }

    /// The `sslmode` to use, and whether it is `verify-full` by default alone (no
    /// `sslmode`, no TLS files):
    /// - over TCP with no `sslmode`, `verify-full`: nothing that proves who we are goes to
    ///   a server whose certificate was not checked, and nothing but the one-byte answer
    ///   to the TLS request and the handshake (both bounded) is read from an unverified
    ///   one (sqlx bounds no PostgreSQL message);
    /// - `require` with a CA file is `verify-ca` (libpq's rule);
    /// - modes that may go on without TLS (`disable`, `allow`, an explicit `prefer`) are
    ///   refused with TLS files, and `allow` and an explicit `prefer` with a password:
    ///   `disable` says "no TLS" knowingly, they do not.
    fn effective_mode(
        &self,
        mode: PgSslMode,
        tcp: bool,
        password: bool,
    ) -> Result<(PgSslMode, bool)> {
        let explicit = self.explicit_mode || std::env::var_os("PGSSLMODE").is_some();
        let verify = tcp || !self.files.is_empty();
        if !explicit && verify && matches!(mode, PgSslMode::Prefer) {
            return Ok((PgSslMode::VerifyFull, self.files.is_empty()));
        }
        if self.files.is_empty() {
            return match mode {
                PgSslMode::Allow | PgSslMode::Prefer if password => Err(weak_with_password(mode)),
                other => Ok((other, false)),
            };
        }
        let named: Vec<&str> = self.given.iter().map(|(_, n)| n.as_str()).collect();
        match mode {
            PgSslMode::Require if self.files.ca().is_some() => Ok((PgSslMode::VerifyCa, false)),
            PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => Err(config(format!(
                "TLS parameter(s) {} given with sslmode={}, which may connect without TLS \
                     and does not check the server's certificate; use sslmode=verify-full \
                     (or verify-ca, require), or leave sslmode out",
                named.join(", "),
                mode_name(mode)
            ))),
            other => Ok((other, false)),
        }
    }
}

/// Whether the connection goes over TCP: a Unix socket's server is the one the file
/// system lets listen there, and PostgreSQL offers no TLS on one (libpq ignores `sslmode`
/// there).
fn over_tcp(options: &PgConnectOptions) -> bool {
    !(options.get_socket().is_some() || options.get_host().starts_with('/'))
}

/// Whether the connection has a password to send (from the URL, `PGPASSWORD` or the
/// password file sqlx reads).
fn has_password(options: &PgConnectOptions) -> bool {
    use sqlx::ConnectOptions as _;
    (options.to_url_lossy().password()).is_some_and(|p| !p.is_empty())
}

/// The refusal of a password with `allow` or an explicit `prefer`.
fn weak_with_password(mode: PgSslMode) -> lockcore::Error {
    let why = match mode {
        PgSslMode::Allow => "the driver (sqlx 0.9) never uses TLS under `allow`",
        _ => "`prefer` goes on without TLS when the server declines it, and checks no certificate",
    };
    config(format!(
        "sslmode={} with a password (from the URL, PGPASSWORD or ~/.pgpass): {why}, so a \
         server without TLS, or an impostor in its place, would be sent the password in a \
         form it can read; use sslmode=verify-full (with `ca=FILE` when a private CA signs \
         the server's certificate), or sslmode=disable for a server without TLS on a \
         trusted network",
        mode_name(mode)
    ))
}

/// Whether `name` is a TLS file parameter: `ca`, `cert`, `key` or one of their [`ALIASES`].
pub(crate) fn is_file_param(name: &str) -> bool {
    matches!(name, "ca" | "cert" | "key") || ALIASES.iter().any(|(alias, _)| *alias == name)
}

fn canonical_name(name: &str) -> &'static str {
    match name {
        "ca" => "ca",
        "cert" => "cert",
        _ => "key",
    }
}

/// What the pool's connections are set up to use, for
/// [`connection_security`](lockcore::LockBackend::connection_security) and the wording of
/// TLS failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TlsSetup {
    /// What is checked about the server's certificate.
    pub(crate) verification: Verification,
    /// A client certificate is configured.
    pub(crate) client_certificate: bool,
    /// TLS is required (`require` or stricter): no plaintext fallback.
    pub(crate) required: bool,
    /// The CAs the server's certificate may chain to. sqlx adds the `ca` file to the OS
    /// trust store rather than trusting it alone, as libpq does.
    pub(crate) roots: &'static str,
    /// The effective `sslmode`, as the URL spells it.
    pub(crate) mode: &'static str,
    /// `mode` is `verify-full` because the URL has a password and no `sslmode` (and no TLS
    /// files, which ask for TLS themselves).
    pub(crate) defaulted: bool,
}

impl TlsSetup {
    fn new(mode: PgSslMode, defaulted: bool, material: &TlsMaterial) -> Self {
        let verification = match mode {
            PgSslMode::VerifyFull => Verification::Full,
            PgSslMode::VerifyCa => Verification::ChainOnly,
            _ => Verification::None,
        };
        Self {
            verification,
            client_certificate: material.client().is_some(),
            roots: if material.ca().is_some() {
                "the `ca` file and the OS trust store"
            } else {
                "the OS trust store"
            },
            required: matches!(
                mode,
                PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
            ),
            mode: mode_name(mode),
            defaulted,
        }
    }

    /// What to do when the server declines TLS (`declined`) or fails verification under
    /// this setup; `None` when [`anylock_tls::diagnose`]'s wording says it already.
    pub(crate) fn remedy(&self, declined: bool) -> Option<String> {
        let files = self.client_certificate || self.roots != "the OS trust store";
        let default = if self.defaulted {
            ", the default over TCP without an sslmode,"
        } else {
            ""
        };
        let disable = if files {
            ""
        } else {
            ", or pass `sslmode=disable` for a server without TLS on a trusted network \
             (everything, a password too, then travels in clear)"
        };
        if declined {
            return Some(format!(
                "sslmode={}{default} needs TLS: turn TLS on at the server (`ssl = on`) and pass \
                 `ca=FILE` when a private CA signs its certificate{disable}",
                self.mode
            ));
        }
        self.defaulted.then(|| {
            format!(
                "sslmode={}{default} needs a server certificate that verifies: pass `ca=FILE` \
                 when a private CA signs it{disable}",
                self.mode
            )
        })
    }
}

/// The URL spelling of `mode`.
pub(crate) fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// [`ErrorKind::Config`](lockcore::ErrorKind::Config) with `message`.
fn config(message: String) -> lockcore::Error {
    lockcore::Error::new(lockcore::ErrorKind::Config, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn a_name_and_its_alias_together_are_refused() {
        let mut params = TlsParams::default();
        assert!(params.take("sslrootcert", "/a.pem").expect("first"));
        let err = params.take("ca", "/b.pem").expect_err("alias twice");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("`sslrootcert` and `ca`"), "{err}");
        let err = params
            .take("sslrootcert", "/b.pem")
            .expect_err("same twice");
        assert!(err.to_string().contains("twice"), "{err}");
        assert!(!params.take("schema", "x").expect("not ours"));
    }

    #[test]
    fn require_with_a_root_certificate_verifies_the_chain() {
        let mut params = TlsParams::default();
        params.take("sslrootcert", "/ca.pem").expect("take");
        params.explicit_mode = true;
        assert_eq!(
            mode_name(
                params
                    .effective_mode(PgSslMode::Require, true, false)
                    .expect("ok")
                    .0
            ),
            mode_name(PgSslMode::VerifyCa)
        );
        assert_eq!(
            mode_name(
                params
                    .effective_mode(PgSslMode::VerifyFull, true, true)
                    .expect("ok")
                    .0
            ),
            mode_name(PgSslMode::VerifyFull)
        );
        for weak in [PgSslMode::Disable, PgSslMode::Allow, PgSslMode::Prefer] {
            let err = params
                .effective_mode(weak, true, false)
                .expect_err("plaintext possible");
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            assert!(err.to_string().contains("sslrootcert"), "{err}");
        }
    }

    #[test]
    fn a_client_certificate_alone_does_not_verify_the_server_under_require() {
        let mut params = TlsParams::default();
        params.take("cert", "/c.pem").expect("take");
        params.take("key", "/k.pem").expect("take");
        assert_eq!(
            mode_name(
                params
                    .effective_mode(PgSslMode::Require, true, false)
                    .expect("ok")
                    .0
            ),
            mode_name(PgSslMode::Require)
        );
    }

    /// The mode a URL ends up with: `(url, effective mode, anylock chose it)`.
    fn mode_of(url: &str) -> (&'static str, bool) {
        let config = crate::PostgresConfig::from_url(url).expect(url);
        (config.tls().mode, config.tls().defaulted)
    }

    #[test]
    fn no_sslmode_over_tcp_requires_a_verified_server() {
        for url in [
            "postgres://app:pw@db/x",
            "postgres://app@db/x?password=pw",
            "postgres://app:pw@db:5433/x?host=db2",
            "postgres://app@db/x",
            "postgres://app:@db/x",
        ] {
            assert_eq!(mode_of(url), ("verify-full", true), "{url}");
        }
        // Said explicitly, the user's choice stands.
        for mode in ["disable", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://app:pw@db/x?sslmode={mode}");
            assert_eq!(mode_of(&url), (mode_name(parse(mode)), false), "{url}");
        }
        // A Unix socket: no TLS there (libpq ignores sslmode on one), the file system
        // decides who listens; libpq's default.
        for url in [
            "postgres://app:pw@%2Frun%2Fpostgresql/x",
            "postgres://app:pw@localhost/x?host=/run/postgresql",
        ] {
            assert_eq!(mode_of(url), ("prefer", false), "{url}");
        }
    }

    #[test]
    fn a_password_with_allow_or_an_explicit_prefer_is_refused() {
        for mode in ["allow", "prefer"] {
            let url = format!("postgres://app:pw@db/x?sslmode={mode}");
            let err = crate::PostgresConfig::from_url(&url).expect_err(&url);
            assert_eq!(err.kind(), ErrorKind::Config, "{err}");
            let shown = err.to_string();
            assert!(
                shown.contains(&format!("sslmode={mode} with a password")),
                "{shown}"
            );
            assert!(shown.contains("sslmode=disable"), "{shown}");
            assert!(!shown.contains("pw@"), "{shown}");
            let no_password = format!("postgres://app@db/x?sslmode={mode}");
            assert_eq!(mode_of(&no_password), (mode, false));
        }
    }

    fn parse(mode: &str) -> PgSslMode {
        mode.parse().expect("an sslmode")
    }
}
