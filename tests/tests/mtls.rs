//! Mutual TLS with a per-job CA (`slowrank certs`): an agent with the job's
//! certificate is accepted; one without a certificate, or with one from
//! another CA, is refused in the handshake and counted.

use std::sync::{atomic::Ordering, Arc};

use slowrank_agent::ship::{client_config_with, ClientIdentity, Shipper};
use slowrank_coordinator::net::ingest::{Ingest, IngestEvent};
use slowrank_coordinator::net::tls::{make_job_pki, Identity, SERVER_NAME};
use slowrank_shared::wire::Hello;
use tokio::sync::mpsc;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("slowrank-mtls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn hello() -> Hello {
    Hello {
        token: String::new(),
        host: "node-0".into(),
        agent_id: "agent-0".into(),
        mono_ns: 1,
        wall_ns: 2,
    }
}

fn read(dir: &std::path::Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap()
}

async fn connect(
    addr: std::net::SocketAddr,
    ca_dir: &std::path::Path,
    client_dir: Option<&std::path::Path>,
) -> Result<Shipper, slowrank_agent::ship::ShipError> {
    let (c, k) = client_dir
        .map(|d| (read(d, "agent.crt"), read(d, "agent.key")))
        .unzip();
    let id = c.as_ref().zip(k.as_ref()).map(|(c, k)| ClientIdentity {
        cert_pem: c,
        key_pem: k,
        name: "agent.crt",
    });
    let cfg = client_config_with(&read(ca_dir, "ca.crt"), "ca.crt", id).unwrap();
    Shipper::connect(addr, SERVER_NAME, cfg, &hello()).await
}

#[tokio::test]
async fn only_agents_with_the_jobs_certificate_get_in() {
    let job = tmp("job");
    let other = tmp("other");
    make_job_pki(&job, &[]).expect("job PKI");
    make_job_pki(&other, &[]).expect("another job's PKI");
    assert!(
        make_job_pki(&job, &[]).is_err(),
        "never overwrite a job's keys"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(job.join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "private keys are not readable by others");

    let identity = Identity::load_or_create(&job).unwrap();
    assert!(identity.requires_client_cert());
    // An empty token: the certificate is the credential.
    let ingest = Arc::new(Ingest::bind("127.0.0.1:0".parse().unwrap(), &identity, "").unwrap());
    let addr = ingest.local_addr().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let runner = ingest.clone();
    tokio::spawn(async move { runner.run(tx).await });

    let ok = connect(addr, &job, Some(&job))
        .await
        .expect("job certificate accepted");
    match tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await {
        Ok(Some(IngestEvent::AgentUp { host, .. })) => assert_eq!(host, "node-0"),
        other => panic!("expected AgentUp, got {other:?}"),
    }

    assert!(
        connect(addr, &job, None).await.is_err(),
        "no client certificate must be refused"
    );
    assert!(
        connect(addr, &job, Some(&other)).await.is_err(),
        "a certificate from another CA must be refused"
    );
    // The server counts the failed handshakes once it has seen them fail.
    let stats = ingest.stats();
    for _ in 0..100 {
        if stats.refused_agents.load(Ordering::Relaxed) >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(stats.refused_agents.load(Ordering::Relaxed), 2);
    ok.close().await;
    ingest.close();
    let _ = std::fs::remove_dir_all(&job);
    let _ = std::fs::remove_dir_all(&other);
}

/// The agent reads its host from the certificate `slowrank certs --hosts`
/// made exactly as the coordinator does, and refuses a contradicting
/// `--host`; the job-wide certificate names no host.
#[test]
fn the_agent_takes_its_host_from_the_certificate_the_coordinator_binds() {
    use slowrank_agent::certhost::{resolve_host, CertHostError};
    use slowrank_coordinator::net::tls::{cert_host, make_job_pki_for_hosts};
    use slowrank_shared::wire::CERT_HOST_URI_PREFIX;
    assert_eq!(
        CERT_HOST_URI_PREFIX,
        slowrank_coordinator::net::tls::HOST_URI_PREFIX
    );
    let dir = tmp("certhost");
    make_job_pki_for_hosts(&dir, &[], &["node-0".into(), "node-1".into()]).unwrap();
    let pem = read(&dir, "agents/node-1.crt");
    let machine = || "not-node-1".to_owned();
    let host = resolve_host(None, Some((&pem, "agents/node-1.crt")), machine).unwrap();
    assert_eq!(host, "node-1");
    let der = rustls_pki_der(&pem);
    assert_eq!(cert_host(&der).unwrap().as_deref(), Some("node-1"));
    assert!(matches!(
        resolve_host(Some("node-0"), Some((&pem, "agents/node-1.crt")), machine),
        Err(CertHostError::Contradicts { .. })
    ));
    let job = tmp("certhost-job");
    make_job_pki(&job, &[]).unwrap();
    let pem = read(&job, "agent.crt");
    let host = resolve_host(None, Some((&pem, "agent.crt")), machine).unwrap();
    assert_eq!(host, "not-node-1", "a job-wide certificate binds no host");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&job);
}

fn rustls_pki_der(pem: &[u8]) -> rustls::pki_types::CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .next()
        .unwrap()
        .unwrap()
}
