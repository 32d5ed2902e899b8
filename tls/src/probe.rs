//! [`probe`]: one TLS handshake to report the negotiated version and cipher suite.

use std::sync::Arc;
use std::time::Duration;

use lockcore::{Error, ErrorKind, Result};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;

use crate::diagnose::diagnose;

/// Bytes a server expects before the TLS handshake on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Preamble {
    /// TLS from the first byte (Redis, etcd, HTTPS).
    None,
    /// PostgreSQL's `SSLRequest`: the server answers `S` and the handshake follows.
    Postgres,
}

/// The outcome of one handshake: protocol version and cipher suite, as rustls names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// `TLSv1.3`.
    pub version: String,
    /// `TLS13_AES_256_GCM_SHA384`.
    pub cipher: String,
}

/// Makes one TLS handshake with `host:port` (checking the server as `config` says, under the
/// name `server_name`) and reports what was negotiated. No credentials are sent beyond the
/// client certificate, and the connection is closed straight away.
///
/// # Errors
/// [`Unavailable`](ErrorKind::Unavailable) when the server is unreachable or `timeout`
/// passes; a TLS failure as [`diagnose`] words it.
pub async fn probe(
    host: &str,
    port: u16,
    server_name: &str,
    config: ClientConfig,
    preamble: Preamble,
    timeout: Duration,
) -> Result<Negotiated> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| {
        Error::invalid_input(format!("`{server_name}` is not a TLS server name: {e}"))
    })?;
    let attempt = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| {
                Error::unavailable(format!("cannot connect to {host}:{port}")).with_source(e)
            })?;
        if preamble == Preamble::Postgres {
            // Length 8, then the SSLRequest code 1234.5679.
            tcp.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
                .await
                .map_err(|e| Error::unavailable("SSLRequest not sent").with_source(e))?;
            let mut answer = [0u8; 1];
            tcp.read_exact(&mut answer)
                .await
                .map_err(|e| Error::unavailable("no answer to SSLRequest").with_source(e))?;
            if answer[0] != b'S' {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("{host}:{port} does not offer TLS (ssl = off on the server)"),
                ));
            }
        }
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = connector.connect(name, tcp).await.map_err(|e| {
            let wrapped = Error::unavailable(format!("TLS handshake with {host}:{port} failed"))
                .with_source(e);
            diagnose(&wrapped).unwrap_or(wrapped)
        })?;
        let (_, session) = stream.get_ref();
        Ok(Negotiated {
            version: session
                .protocol_version()
                .map_or_else(|| "unknown".to_owned(), version_name),
            cipher: session
                .negotiated_cipher_suite()
                .map_or_else(|| "unknown".to_owned(), |c| format!("{:?}", c.suite())),
        })
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(Error::unavailable(format!(
                "no TLS handshake with {host}:{port} within {timeout:?}"
            )))
        })
}

/// `TLSv1.3` for rustls's `TLSv1_3`.
fn version_name(version: rustls::ProtocolVersion) -> String {
    format!("{version:?}").replace('_', ".")
}
