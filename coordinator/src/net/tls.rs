//! The coordinator's TLS identity and the per-job PKI.
//!
//! Two ways to run:
//! * token over TLS: `load_or_create` keeps a self-signed certificate and key
//!   in a directory (made with rcgen on first use, key mode 0600). Agents get
//!   the certificate as their CA (`slowrank-agent --ca`), so they only talk to
//!   this coordinator; they prove themselves with the job token.
//! * mutual TLS: `slowrank certs` ([`make_job_pki`]) makes a per-job CA, the
//!   coordinator's certificate and agent certificates, all signed by it:
//!   one per host (`--hosts`, [`make_job_pki_for_hosts`]), which binds the
//!   agent to that host name ([`cert_host`]), or one for the whole job.
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
/// Where per-host agent certificates go: `agents/<host>.crt`, `.key`.
pub const AGENTS_DIR: &str = "agents";
/// A per-host agent certificate carries its host as a URI SAN with this
/// prefix. The CN and a DNS SAN say the same for people and tools, but the
/// URI is what the coordinator trusts: a job-wide certificate has DNS names
/// too, and must not be read as bound to a host that happens to share one.
pub const HOST_URI_PREFIX: &str = slowrank_shared::wire::CERT_HOST_URI_PREFIX;
/// Longest host name accepted (a DNS name's limit).
const MAX_HOST_NAME: usize = 253;

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
    #[error(
        "host name {0:?} is not usable in a certificate file name: use 1 to {MAX_HOST_NAME} \
         characters of letters, digits, '-', '_' and '.', not starting with '.' or '-'"
    )]
    BadHostName(String),
    #[error("cannot parse the peer's certificate")]
    PeerCert(#[source] webpki::Error),
    #[error("the peer's certificate names several hosts ({0:?})")]
    AmbiguousHost(Vec<String>),
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
/// certificate for the whole job (`agent.crt`: not bound to a host, so its
/// holders are bound like token holders, by first live connection), in
/// `dir`. Keys are written 0600. Refuses to overwrite.
pub fn make_job_pki(dir: &Path, extra_names: &[String]) -> Result<JobPki, TlsError> {
    make_pki(dir, extra_names, None)
}

/// The same, with one agent certificate per host instead
/// (`agents/<host>.crt` and `.key`): the coordinator takes an agent's host
/// from its certificate and refuses a hello that claims another.
pub fn make_job_pki_for_hosts(
    dir: &Path,
    extra_names: &[String],
    hosts: &[String],
) -> Result<JobPki, TlsError> {
    make_pki(dir, extra_names, Some(hosts))
}

/// Whether `host` can name a certificate file and a SAN as it is (no path
/// separators, no hidden or option-like names).
pub fn valid_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= MAX_HOST_NAME
        && !host.starts_with(['.', '-'])
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The host an agent certificate is bound to (its [`HOST_URI_PREFIX`] SAN);
/// `None` for a certificate bound to no host (the job-wide `agent.crt`).
/// Only meaningful for a certificate the TLS layer has verified.
pub fn cert_host(der: &CertificateDer<'_>) -> Result<Option<String>, TlsError> {
    let cert = webpki::EndEntityCert::try_from(der).map_err(TlsError::PeerCert)?;
    slowrank_shared::wire::cert_host_of(cert.valid_uri_names()).map_err(TlsError::AmbiguousHost)
}

/// A certificate file, its key file, and the host it is bound to.
type AgentFiles<'a> = (PathBuf, PathBuf, Option<&'a str>);

fn make_pki(
    dir: &Path,
    extra_names: &[String],
    hosts: Option<&[String]>,
) -> Result<JobPki, TlsError> {
    let hosts = checked_hosts(hosts)?;
    let agents = agent_files(dir, hosts.as_deref());
    refuse_overwrite(dir, &agents)?;
    make_dirs(dir, hosts.is_some())?;
    let (ca, ca_key) = job_ca()?;
    let (server_cert, server_key) = server_cert(extra_names, &ca, &ca_key)?;
    let mut public = vec![
        (dir.join(CA_FILE), ca.pem()),
        (dir.join(CERT_FILE), server_cert.pem()),
    ];
    let mut private = vec![
        (dir.join(CA_KEY_FILE), ca_key.serialize_pem()),
        (dir.join(KEY_FILE), server_key.serialize_pem()),
    ];
    for (crt, key, host) in agents {
        let (agent_cert, agent_key) = agent_cert(host, &ca, &ca_key)?;
        public.push((crt, agent_cert.pem()));
        private.push((key, agent_key.serialize_pem()));
    }
    let mut files = Vec::new();
    for (p, pem) in public {
        fs::write(&p, pem).map_err(|source| TlsError::Io {
            path: p.clone(),
            source,
        })?;
        files.push(p);
    }
    for (p, pem) in private {
        write_private(&p, &pem)?;
        files.push(p);
    }
    Ok(JobPki {
        dir: dir.to_owned(),
        files,
    })
}

/// The hosts to make certificates for, each usable as a file name, sorted
/// and without repeats.
fn checked_hosts(hosts: Option<&[String]>) -> Result<Option<Vec<String>>, TlsError> {
    let mut hosts: Option<Vec<String>> = hosts.map(<[String]>::to_vec);
    if let Some(h) = &mut hosts {
        if let Some(bad) = h.iter().find(|h| !valid_host_name(h)) {
            return Err(TlsError::BadHostName(bad.clone()));
        }
        h.sort();
        h.dedup();
    }
    Ok(hosts)
}

/// Where the agent certificates go: the job-wide pair, or one per host.
fn agent_files<'a>(dir: &Path, hosts: Option<&'a [String]>) -> Vec<AgentFiles<'a>> {
    match hosts {
        None => vec![(dir.join(AGENT_CERT_FILE), dir.join(AGENT_KEY_FILE), None)],
        Some(h) => h
            .iter()
            .map(|host| {
                let base = dir.join(AGENTS_DIR).join(host);
                (
                    base.with_extension("crt"),
                    base.with_extension("key"),
                    Some(host.as_str()),
                )
            })
            .collect(),
    }
}

/// Refuses before writing anything when any file to be made exists.
fn refuse_overwrite(dir: &Path, agents: &[AgentFiles<'_>]) -> Result<(), TlsError> {
    let mut names: Vec<PathBuf> = [CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE]
        .iter()
        .map(|n| dir.join(n))
        .collect();
    for (crt, key, _) in agents {
        names.extend([crt.clone(), key.clone()]);
    }
    for n in &names {
        if n.exists() {
            return Err(TlsError::Exists(n.clone()));
        }
    }
    Ok(())
}

/// `dir`, and its [`AGENTS_DIR`] when there are per-host certificates.
fn make_dirs(dir: &Path, per_host: bool) -> Result<(), TlsError> {
    let mkdir = |d: &Path| {
        fs::create_dir_all(d).map_err(|source| TlsError::Io {
            path: d.to_owned(),
            source,
        })
    };
    mkdir(dir)?;
    if per_host {
        mkdir(&dir.join(AGENTS_DIR))?;
    }
    Ok(())
}

/// The job's CA: self-signed, signs certificates only.
fn job_ca() -> Result<(rcgen::Certificate, rcgen::KeyPair), TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
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
    Ok((ca, ca_key))
}

/// The coordinator's certificate: for [`SERVER_NAME`], `localhost` and
/// `extra_names`.
fn server_cert(
    extra_names: &[String],
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
) -> Result<(rcgen::Certificate, rcgen::KeyPair), TlsError> {
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair};
    let mut sans = vec![SERVER_NAME.to_owned(), "localhost".to_owned()];
    sans.extend(extra_names.iter().cloned());
    let mut server = CertificateParams::new(sans)?;
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate()?;
    let server_cert = server.signed_by(&server_key, ca, ca_key)?;
    Ok((server_cert, server_key))
}

/// An agent's client certificate: bound to `host` (CN, DNS and
/// [`HOST_URI_PREFIX`] URI SANs), or job-wide when `None`.
fn agent_cert(
    host: Option<&str>,
    ca: &rcgen::Certificate,
    ca_key: &rcgen::KeyPair,
) -> Result<(rcgen::Certificate, rcgen::KeyPair), TlsError> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};
    let mut agent = CertificateParams::new(Vec::<String>::new())?;
    match host {
        Some(h) => {
            agent.distinguished_name.push(DnType::CommonName, h);
            agent.subject_alt_names = vec![
                SanType::DnsName(h.try_into()?),
                SanType::URI(format!("{HOST_URI_PREFIX}{h}").try_into()?),
            ];
        }
        None => {
            agent
                .distinguished_name
                .push(DnType::CommonName, "slowrank agent");
            agent.subject_alt_names = vec![SanType::DnsName("slowrank-agent".try_into()?)];
        }
    }
    agent.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let agent_key = KeyPair::generate()?;
    let agent_cert = agent.signed_by(&agent_key, ca, ca_key)?;
    Ok((agent_cert, agent_key))
}
