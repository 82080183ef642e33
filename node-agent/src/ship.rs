//! Shipping batches to the coordinator over QUIC (quinn).
//!
//! One connection per agent. The agent opens a bidirectional stream, sends
//! [`Hello`] with the job token and waits for [`HelloReply`]; then every batch
//! travels on its own unidirectional stream, so one lost or slow batch never
//! blocks the next. TLS authenticates the coordinator (its certificate must
//! chain to the CA file the agent was given); the token authenticates the
//! agent.

use std::{net::SocketAddr, sync::Arc};

use quinn::{crypto::rustls::QuicClientConfig, Connection, Endpoint};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use slowrank_shared::wire::{self, Batch, Hello, HelloReply, WireError};

/// Largest reply the agent reads on the control stream.
const MAX_REPLY: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("cannot read the coordinator CA certificate {path}")]
    Ca {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("invalid TLS setup")]
    Tls(#[from] rustls::Error),
    #[error("invalid QUIC TLS setup")]
    QuicTls(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
    #[error("cannot open a local UDP endpoint")]
    Endpoint(#[source] std::io::Error),
    #[error("cannot start connecting to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: quinn::ConnectError,
    },
    #[error("connection to the coordinator failed")]
    Connection(#[from] quinn::ConnectionError),
    #[error("stream write failed")]
    Write(#[from] quinn::WriteError),
    #[error("stream closed")]
    Closed(#[from] quinn::ClosedStream),
    #[error("reading the coordinator's reply failed")]
    Read(#[from] quinn::ReadToEndError),
    #[error("bad message")]
    Wire(#[from] WireError),
    #[error("the coordinator refused this agent: {0}")]
    Refused(String),
}

/// Builds the QUIC client config that trusts exactly the given CA (PEM).
pub fn client_config(ca_pem: &[u8], ca_name: &str) -> Result<quinn::ClientConfig, ShipError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|source| ShipError::Ca {
            path: ca_name.to_owned(),
            source,
        })?;
        roots.add(cert)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(tls)?,
    )))
}

/// An authenticated connection to the coordinator.
pub struct Shipper {
    // Kept so the endpoint's driver lives as long as the connection.
    _endpoint: Endpoint,
    conn: Connection,
}

impl Shipper {
    /// Connects, says hello and waits for the coordinator to accept us.
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        config: quinn::ClientConfig,
        hello: &Hello,
    ) -> Result<Self, ShipError> {
        let bind: SocketAddr = if addr.is_ipv6() {
            "[::]:0".parse().expect("literal")
        } else {
            "0.0.0.0:0".parse().expect("literal")
        };
        let mut endpoint = Endpoint::client(bind).map_err(ShipError::Endpoint)?;
        endpoint.set_default_client_config(config);
        let conn = endpoint
            .connect(addr, server_name)
            .map_err(|source| ShipError::Connect { addr, source })?
            .await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&wire::encode(hello)?).await?;
        send.finish()?;
        let reply: HelloReply = wire::decode(&recv.read_to_end(MAX_REPLY).await?)?;
        if !reply.accepted {
            return Err(ShipError::Refused(reply.reason));
        }
        Ok(Self {
            _endpoint: endpoint,
            conn,
        })
    }

    /// Sends one batch on its own stream.
    pub async fn send(&self, batch: &Batch) -> Result<(), ShipError> {
        self.send_encoded(&wire::encode(batch)?).await
    }

    /// Sends an already encoded message (e.g. from the spool).
    pub async fn send_encoded(&self, bytes: &[u8]) -> Result<(), ShipError> {
        let mut stream = self.conn.open_uni().await?;
        stream.write_all(bytes).await?;
        stream.finish()?;
        // Wait until the peer has the data, so a clean close loses nothing.
        let _ = stream.stopped().await;
        Ok(())
    }

    /// Closes the connection cleanly after pending streams are acknowledged.
    pub async fn close(self) {
        self.conn.close(0u32.into(), b"agent done");
        self._endpoint.wait_idle().await;
    }
}
