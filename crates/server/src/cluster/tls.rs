//! A node's end of mutual TLS with its peers ([`forkbox_cluster::tls`] has the certificates):
//! the acceptor its listener takes peers' connections with, and a client per peer that checks
//! the peer's certificate names that peer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use forkbox_cluster::tls::Identity;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type PeerClient = Client<HttpsConnector<HttpConnector>, Body>;

pub struct NodeTls {
    client: Arc<rustls::ClientConfig>,
    server: Arc<rustls::ServerConfig>,
    /// One pooled client per peer node, each expecting that node's name.
    peers: Mutex<HashMap<String, PeerClient>>,
}

fn connector() -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(Duration::from_secs(2)));
    c.set_nodelay(true);
    c.enforce_http(false);
    c
}

impl NodeTls {
    pub fn new(id: &Identity) -> Result<NodeTls, String> {
        forkbox_cluster::tls::install_provider();
        let server = id.server_config()?;
        Ok(NodeTls {
            client: Arc::new(id.client_config()?),
            server: Arc::new(server),
            peers: Mutex::default(),
        })
    }

    /// What the node's TCP listener takes peers' TLS connections with (a client certificate
    /// of the cluster CA required).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }

    /// The HTTPS client for calls to node `peer`.
    pub fn client(&self, peer: &str) -> Result<PeerClient, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = peers.get(peer) {
            return Ok(c.clone());
        }
        let name = Identity::server_name(peer)?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*self.client).clone())
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(name))
            .enable_http1()
            .wrap_connector(connector());
        let c = Client::builder(TokioExecutor::new()).build(https);
        peers.insert(peer.to_string(), c.clone());
        Ok(c)
    }

    /// A TLS stream to node `peer` at `authority` (`HOST:PORT`), its certificate checked.
    pub async fn dial(
        &self,
        peer: &str,
        authority: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = Identity::server_name(peer).map_err(std::io::Error::other)?;
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        tcp.set_nodelay(true)?;
        tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
    }
}

/// An error with every cause it carries (a TLS refusal sits deep in a client's error).
pub fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        next = s.source();
    }
    out
}
