//! Which host this agent speaks for. Under mutual TLS with per-host
//! certificates (`slowrank certs --hosts`) the coordinator binds an agent to
//! the host its certificate names and refuses a hello claiming another, so
//! the agent takes its host from the same place rather than from the
//! machine's hostname (which need not match the name the certificate was
//! issued for), and a contradicting `--host` stops it at startup instead of
//! being refused on every reconnect.

use rustls::pki_types::{pem::PemObject, CertificateDer};

#[derive(Debug, thiserror::Error)]
pub enum CertHostError {
    #[error("cannot read a certificate from {path}")]
    Pem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    Empty { path: String },
    #[error("cannot parse the certificate in {path}")]
    Parse {
        path: String,
        #[source]
        source: webpki::Error,
    },
    #[error("the certificate in {path} names several hosts ({hosts:?})")]
    Ambiguous { path: String, hosts: Vec<String> },
    #[error(
        "--host {given} contradicts --cert {path}, which is issued for host {cert}: the \
         coordinator would refuse every hello (host_not_in_certificate); leave --host out \
         or pass agents/{given}.crt"
    )]
    Contradicts {
        given: String,
        cert: String,
        path: String,
    },
}

/// The host the first (leaf) certificate of `pem` is bound to, read from
/// its `urn:slowrank:host:<host>` URI SAN as the coordinator reads it;
/// `None` for a certificate bound to no host (the job-wide `agent.crt`).
pub fn cert_host(pem: &[u8], path: &str) -> Result<Option<String>, CertHostError> {
    let leaf = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or_else(|| CertHostError::Empty {
            path: path.to_owned(),
        })?
        .map_err(|source| CertHostError::Pem {
            path: path.to_owned(),
            source,
        })?;
    let cert = webpki::EndEntityCert::try_from(&leaf).map_err(|source| CertHostError::Parse {
        path: path.to_owned(),
        source,
    })?;
    slowrank_shared::wire::cert_host_of(cert.valid_uri_names()).map_err(|hosts| {
        CertHostError::Ambiguous {
            path: path.to_owned(),
            hosts,
        }
    })
}

/// The host to report: the certificate's when it names one (`--host`, if
/// given, must agree), else `--host`, else `machine()` (the hostname).
/// `cert` is the agent certificate's PEM and its path, under mutual TLS.
pub fn resolve_host(
    given: Option<&str>,
    cert: Option<(&[u8], &str)>,
    machine: impl FnOnce() -> String,
) -> Result<String, CertHostError> {
    let bound = match cert {
        Some((pem, path)) => cert_host(pem, path)?.map(|h| (h, path)),
        None => None,
    };
    match (given, bound) {
        (Some(g), Some((c, path))) if g != c => Err(CertHostError::Contradicts {
            given: g.to_owned(),
            cert: c,
            path: path.to_owned(),
        }),
        (_, Some((c, _))) => Ok(c),
        (Some(g), None) => Ok(g.to_owned()),
        (None, None) => Ok(machine()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        SanType,
    };
    use slowrank_shared::wire::CERT_HOST_URI_PREFIX;

    /// An agent certificate as `slowrank certs` makes it (the coordinator's
    /// `make_pki`): signed by a job CA, the host in the CN, a DNS SAN and
    /// the URI SAN; `host: None` is the job-wide `agent.crt`.
    fn agent_cert(host: Option<&str>) -> String {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "slowrank job CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let mut agent = CertificateParams::new(Vec::<String>::new()).unwrap();
        match host {
            Some(h) => {
                agent.distinguished_name.push(DnType::CommonName, h);
                agent.subject_alt_names = vec![
                    SanType::DnsName(h.try_into().unwrap()),
                    SanType::URI(format!("{CERT_HOST_URI_PREFIX}{h}").try_into().unwrap()),
                ];
            }
            None => {
                agent
                    .distinguished_name
                    .push(DnType::CommonName, "slowrank agent");
                agent.subject_alt_names =
                    vec![SanType::DnsName("slowrank-agent".try_into().unwrap())];
            }
        }
        agent.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        agent.signed_by(&key, &ca_cert, &ca_key).unwrap().pem()
    }

    fn machine() -> String {
        "this-machine".to_owned()
    }

    #[test]
    fn the_host_comes_from_a_per_host_certificate() {
        let pem = agent_cert(Some("node-3"));
        let cert = Some((pem.as_bytes(), "agents/node-3.crt"));
        assert_eq!(
            cert_host(pem.as_bytes(), "x").unwrap().as_deref(),
            Some("node-3")
        );
        assert_eq!(resolve_host(None, cert, machine).unwrap(), "node-3");
        assert_eq!(
            resolve_host(Some("node-3"), cert, machine).unwrap(),
            "node-3"
        );
    }

    #[test]
    fn a_host_contradicting_the_certificate_is_a_startup_error() {
        let pem = agent_cert(Some("node-3"));
        let err =
            resolve_host(Some("node-4"), Some((pem.as_bytes(), "n3.crt")), machine).unwrap_err();
        assert!(matches!(err, CertHostError::Contradicts { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("node-4") && msg.contains("node-3"), "{msg}");
    }

    #[test]
    fn a_job_wide_certificate_or_none_leaves_the_host_to_the_flag_or_machine() {
        let pem = agent_cert(None);
        let cert = Some((pem.as_bytes(), "agent.crt"));
        assert_eq!(cert_host(pem.as_bytes(), "x").unwrap(), None);
        assert_eq!(resolve_host(None, cert, machine).unwrap(), "this-machine");
        assert_eq!(
            resolve_host(Some("node-7"), cert, machine).unwrap(),
            "node-7"
        );
        assert_eq!(resolve_host(None, None, machine).unwrap(), "this-machine");
        assert_eq!(
            resolve_host(Some("node-7"), None, machine).unwrap(),
            "node-7"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_host() {
        assert!(matches!(
            cert_host(b"not a certificate", "x"),
            Err(CertHostError::Empty { .. })
        ));
    }
}
