//! The connect-time check of every member: TCP, TLS, authentication and one Range.

use std::sync::atomic::Ordering;

use lockcore::{Error, Result};

use super::EtcdClient;
use crate::error::{Failure, Op};
use crate::grpc::Connection;
use crate::{requests, secure};

impl EtcdClient {
    /// Connects every member at once, each within the connect timeout: TCP, the TLS
    /// handshake (with the server's first bytes, so a refused client certificate shows),
    /// authentication, and one Range on the key prefix (so a user without the RBAC
    /// permission is told now). Later RPCs start at a member that passed.
    ///
    /// # Errors
    /// When no member passes: the first TLS or authentication refusal
    /// ([`PermissionDenied`](ErrorKind::PermissionDenied)) or configuration error, else
    /// [`Unavailable`](ErrorKind::Unavailable) naming every member and why.
    pub(crate) async fn verify(&self) -> Result<()> {
        let checks = (0..self.members.len()).map(|index| self.verify_member(index));
        let results = futures_util::future::join_all(checks).await;
        if let Some(index) = results.iter().position(Result::is_ok) {
            self.current.store(index, Ordering::Relaxed);
            return Ok(());
        }
        let errors: Vec<Error> = results.into_iter().filter_map(Result::err).collect();
        if let Some(refused) = errors.iter().find(|e| !e.is_temporary()) {
            return Err(Error::new(refused.kind(), refused.message().to_owned()));
        }
        let why: Vec<&str> = errors.iter().map(Error::message).collect();
        Err(Error::unavailable(format!(
            "no etcd member reachable within the connect timeout ({:?}): {}",
            self.connect_timeout,
            why.join("; ")
        )))
    }

    async fn verify_member(&self, index: usize) -> Result<()> {
        let endpoint = &self.members[index].endpoint;
        let host_port = endpoint
            .split_once("://")
            .map_or(endpoint.as_str(), |(_, h)| h);
        let tls = self.tls.clone().map(|c| (c, self.client_certificate));
        let plaintext_hint = |e: Error| match self.tls {
            None if e.is_temporary() => Error::unavailable(format!(
                "{} (if the server only speaks TLS, use an `etcds://` URL)",
                e.message()
            )),
            _ => e,
        };
        let check = async {
            secure::check_transport(host_port, tls).await?;
            let client = self
                .member(index)
                .await
                .map_err(|e| plaintext_hint(self.map(Op::Authenticate, Failure::Etcd(e))))?;
            let range = requests::count(self.prefix.as_bytes());
            let count = |c: Connection, r| async move { Ok(c.kv().range(r).await?) };
            client
                .call(range, count)
                .await
                .map(drop)
                .map_err(|e| plaintext_hint(self.map(Op::Get, Failure::Etcd(e))))
        };
        let limit = self.connect_timeout;
        match tokio::time::timeout(limit, check).await {
            Ok(result) => result,
            Err(_) if self.tls.is_none() => Err(Error::unavailable(format!(
                "{endpoint}: no etcd answer within {limit:?} (if the server only speaks TLS, \
                 use an `etcds://` URL)"
            ))),
            Err(_) => Err(Error::unavailable(format!(
                "{endpoint}: no etcd answer within {limit:?}"
            ))),
        }
    }
}
