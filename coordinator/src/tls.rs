//! The coordinator's TLS identity and the per-job PKI.
//!
//! Two ways to run:
//! * token over TLS: `load_or_create` keeps a self-signed certificate and key
//!   in a directory (made with rcgen on first use, key mode 0600). Agents get
//!   the certificate as their CA (`slowrank-agent --ca`), so they only talk to
//!   this coordinator; they prove themselves with the job token.
//! * mutual TLS: `slowrank certs` ([`make_job_pki`]) makes a per-job CA, the
//!   coordinator's certificate and an agent certificate, all signed by it.
//!   When the directory holds `ca.crt`, the server demands a client
//!   certificate signed by that CA; a connection without one fails the
//!   handshake before it can send anything.

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
pub const CA_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
pub const AGENT_CERT_FILE: &str = "agent.crt";
pub const AGENT_KEY_FILE: &str = "agent.key";

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
    #[error("invalid client CA")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
    #[error("{0} already exists: refusing to overwrite a job's keys")]
    Exists(PathBuf),
}

/// A certificate chain and its private key.
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_path: Option<PathBuf>,
    /// When set, agents must present a certificate signed by this CA.
    pub client_ca_pem: Option<String>,
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
            client_ca_pem: None,
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
            let ca = dir.join(CA_FILE);
            let client_ca_pem = if ca.exists() {
                Some(fs::read_to_string(&ca).map_err(io(&ca))?)
            } else {
                None
            };
            return Ok(Self {
                cert_pem: fs::read_to_string(&cert).map_err(io(&cert))?,
                key_pem: fs::read_to_string(&key).map_err(io(&key))?,
                cert_path: Some(cert),
                client_ca_pem,
            });
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut id = Self::generate()?;
        fs::write(&cert, &id.cert_pem).map_err(io(&cert))?;
        write_private(&key, &id.key_pem)?;
        id.cert_path = Some(cert);
        Ok(id)
    }

    /// Whether agents must present a certificate (mutual TLS).
    pub fn requires_client_cert(&self) -> bool {
        self.client_ca_pem.is_some()
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
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
        let tls = match &self.client_ca_pem {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                    roots.add(c.map_err(pem_err)?)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()?;
                builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(certs, key)?
            }
            None => builder.with_no_client_auth().with_single_cert(certs, key)?,
        };
        Ok(quinn::ServerConfig::with_crypto(Arc::new(
            QuicServerConfig::try_from(tls)?,
        )))
    }
}

fn write_private(path: &Path, pem: &str) -> Result<(), TlsError> {
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(pem.as_bytes()))
        .map_err(|source| TlsError::Io {
            path: path.to_owned(),
            source,
        })
}

/// What [`make_job_pki`] wrote.
#[derive(Debug)]
pub struct JobPki {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
}

/// Makes a per-job CA and, signed by it, the coordinator's certificate
/// (for [`SERVER_NAME`], `localhost` and `extra_names`) and one agent
/// certificate, in `dir`. Keys are written 0600. Refuses to overwrite.
pub fn make_job_pki(dir: &Path, extra_names: &[String]) -> Result<JobPki, TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let names = [
        CA_FILE,
        CA_KEY_FILE,
        CERT_FILE,
        KEY_FILE,
        AGENT_CERT_FILE,
        AGENT_KEY_FILE,
    ];
    for n in names {
        if dir.join(n).exists() {
            return Err(TlsError::Exists(dir.join(n)));
        }
    }
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "slowrank job CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let mut sans = vec![SERVER_NAME.to_owned(), "localhost".to_owned()];
    sans.extend(extra_names.iter().cloned());
    let mut server = CertificateParams::new(sans)?;
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate()?;
    let server_cert = server.signed_by(&server_key, &ca, &ca_key)?;

    let mut agent = CertificateParams::new(vec!["slowrank-agent".to_owned()])?;
    agent
        .distinguished_name
        .push(DnType::CommonName, "slowrank agent");
    agent.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let agent_key = KeyPair::generate()?;
    let agent_cert = agent.signed_by(&agent_key, &ca, &ca_key)?;

    let public = [
        (CA_FILE, ca.pem()),
        (CERT_FILE, server_cert.pem()),
        (AGENT_CERT_FILE, agent_cert.pem()),
    ];
    let private = [
        (CA_KEY_FILE, ca_key.serialize_pem()),
        (KEY_FILE, server_key.serialize_pem()),
        (AGENT_KEY_FILE, agent_key.serialize_pem()),
    ];
    let mut files = Vec::new();
    for (n, pem) in public {
        let p = dir.join(n);
        fs::write(&p, pem).map_err(|source| TlsError::Io {
            path: p.clone(),
            source,
        })?;
        files.push(p);
    }
    for (n, pem) in private {
        let p = dir.join(n);
        write_private(&p, &pem)?;
        files.push(p);
    }
    Ok(JobPki {
        dir: dir.to_owned(),
        files,
    })
}
