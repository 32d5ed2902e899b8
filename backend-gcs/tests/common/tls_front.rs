//! A TLS endpoint on 127.0.0.1 presenting a certificate of the test's choosing: in front
//! of a GCS test server (TLS terminated, bytes relayed), or alone (the handshake and
//! nothing after). [`TlsFront::present`] switches the certificate and cuts every open
//! connection, so the next request needs a new handshake: an endpoint whose certificate
//! changed under a connected backend.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

pub struct TlsFront {
    pub port: u16,
    config: Arc<Mutex<Arc<rustls::ServerConfig>>>,
    cut: watch::Sender<u64>,
}

fn server_config(cert: &Path, key: &Path) -> Arc<rustls::ServerConfig> {
    let chain = vec![CertificateDer::from_pem_file(cert).expect("certificate")];
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    Arc::new(config)
}

impl TlsFront {
    /// Presents `cert` (with `key`); relays to `upstream` when given.
    pub async fn start(cert: &Path, key: &Path, upstream: Option<SocketAddr>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let config = Arc::new(Mutex::new(server_config(cert, key)));
        let (cut, _) = watch::channel(0);
        let front = Self {
            port,
            config: Arc::clone(&config),
            cut: cut.clone(),
        };
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let current = Arc::clone(&config.lock().expect("config"));
                let mut cut = cut.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        () = serve(tcp, current, upstream) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        front
    }

    /// From now on presents `cert`; open connections are cut.
    pub fn present(&self, cert: &Path, key: &Path) {
        *self.config.lock().expect("config") = server_config(cert, key);
        self.cut.send_modify(|n| *n += 1);
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

async fn serve(
    tcp: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    upstream: Option<SocketAddr>,
) {
    use tokio::io::AsyncReadExt;
    let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await else {
        return;
    };
    match upstream {
        Some(addr) => {
            if let Ok(mut server) = tokio::net::TcpStream::connect(addr).await {
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
            }
        }
        None => {
            let mut buf = [0u8; 1024];
            while matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {}
        }
    }
}
