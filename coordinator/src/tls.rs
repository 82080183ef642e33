//! The coordinator's TLS identity.
//!
//! `load_or_create` keeps a self-signed certificate and key in a directory
//! (made with rcgen on first use, key file mode 0600). Agents are given the
//! certificate file as their CA (`slowrank-agent --ca`), so they only talk to
//! this coordinator.

use std::{
    fs,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use quinn::crypto::rustls::QuicServerConfig;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// Name the certificate is issued for; agents connect with it as SNI.
pub const SERVER_NAME: &str = "slowrank-coordinator";
pub const CERT_FILE: &str = "coordinator.crt";
pub const KEY_FILE: &str = "coordinator.key";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate a certificate")]
    Generate(#[from] rcgen::Error),
    #[error("cannot read or write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("invalid TLS configuration")]
    Rustls(#[from] rustls::Error),
    #[error("invalid QUIC TLS configuration")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
}

/// A certificate chain and its private key.
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_path: Option<PathBuf>,
}

impl Identity {
    /// A fresh self-signed identity, valid for [`SERVER_NAME`] and localhost.
    pub fn generate() -> Result<Self, TlsError> {
        let ck = rcgen::generate_simple_self_signed(vec![
            SERVER_NAME.to_owned(),
            "localhost".to_owned(),
        ])?;
        Ok(Self {
            cert_pem: ck.cert.pem(),
            key_pem: ck.key_pair.serialize_pem(),
            cert_path: None,
        })
    }

    /// Loads `dir/coordinator.{crt,key}`, creating them when absent.
    pub fn load_or_create(dir: &Path) -> Result<Self, TlsError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| TlsError::Io { path, source }
        };
        let (cert, key) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
        if cert.exists() && key.exists() {
            return Ok(Self {
                cert_pem: fs::read_to_string(&cert).map_err(io(&cert))?,
                key_pem: fs::read_to_string(&key).map_err(io(&key))?,
                cert_path: Some(cert),
            });
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut id = Self::generate()?;
        fs::write(&cert, &id.cert_pem).map_err(io(&cert))?;
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&key)
            .and_then(|mut f| f.write_all(id.key_pem.as_bytes()))
            .map_err(io(&key))?;
        id.cert_path = Some(cert);
        Ok(id)
    }

    /// The QUIC server configuration (TLS 1.3 only, ring provider).
    pub fn server_config(&self) -> Result<quinn::ServerConfig, TlsError> {
        let pem_err = |source| TlsError::Pem {
            path: self.cert_path.clone().unwrap_or_default(),
            source,
        };
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_err)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(pem_err)?;
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
        Ok(quinn::ServerConfig::with_crypto(Arc::new(
            QuicServerConfig::try_from(tls)?,
        )))
    }
}
