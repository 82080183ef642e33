//! What agents send over QUIC is validated before use: corrupted, truncated
//! or foreign batches are rejected with a counted reason while the
//! connection keeps serving; a wrong job token is refused; the counters show
//! in the report and on `/metrics`.

mod support;

use std::{io::Read, io::Write, time::Duration};

use slowrank_agent::{
    clock::HostClock,
    ship::{client_config, ShipError, Shipper},
};
use slowrank_coordinator::net::tls::{Identity, SERVER_NAME};
use slowrank_shared::wire::{self, HEADER_LEN};
use slowrank_synth::{ClockTruth, Generator, SynthSpec};
use support::*;

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("metrics connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("metrics read");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_counted_and_the_connection_keeps_serving() {
    let identity = Identity::generate().expect("identity");
    let mut cfg =
        slowrank_coordinator::serve::ServeConfig::new("127.0.0.1:0".parse().unwrap(), TOKEN);
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.print_alerts = false;
    let server = slowrank_coordinator::serve::Server::bind(cfg, &identity).expect("bind");
    let addr = server.local_addr().unwrap();
    let metrics = server.metrics_addr().expect("metrics addr");
    let stats = server.ingest_stats();
    let analyzer = server.analyzer();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve = spawn_on_own_runtime(server, async move {
        let _ = stop_rx.await;
    });

    // A wrong token is refused, and counted.
    let client = client_config(identity.cert_pem.as_bytes(), "test CA").unwrap();
    let clock = HostClock::real();
    let bad = Shipper::connect(
        addr,
        SERVER_NAME,
        client.clone(),
        &hello("node-9", "intruder", "not-the-token", &clock),
    )
    .await;
    match bad {
        Err(ShipError::Refused(reason)) => assert!(reason.contains("token"), "{reason}"),
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("an agent with a wrong token was accepted"),
    }

    let agent = Shipper::connect(
        addr,
        SERVER_NAME,
        client,
        &hello("node-0", "agent-0", TOKEN, &clock),
    )
    .await
    .expect("agent accepted");
    // A real batch from a synthetic job, on the true clock.
    let mut spec = SynthSpec::dp(1, 2);
    spec.clocks = vec![ClockTruth::new(0, 0.0, 0)];
    let mut g = Generator::new(spec);
    let mut good = g.next_iteration().batches.remove(0).1;
    let now = slowrank_agent::clock::mono_ns();
    let start = g.spec().start_ns;
    map_times(&mut good, |t| {
        (now as i128 + t as i128 - start as i128).max(1) as u64
    });
    let bytes = wire::encode(&good).unwrap();

    let mut truncated = bytes.clone();
    truncated.truncate(bytes.len() / 2);
    let mut garbage = bytes[..HEADER_LEN].to_vec();
    garbage.extend(std::iter::repeat_n(0xAB, bytes.len() - HEADER_LEN));
    let mut bad_magic = bytes.clone();
    bad_magic[0] = b'X';
    let mut wrong_version = bytes.clone();
    wrong_version[4] = 99;
    let mut foreign = good.clone();
    foreign.agent_id = "someone-else".into();
    let foreign = wire::encode(&foreign).unwrap();
    for b in [
        &bytes[..5],
        &truncated[..],
        &garbage[..],
        &bad_magic[..],
        &wrong_version[..],
        &foreign[..],
    ] {
        agent.send_encoded(b).await.expect("stream accepted");
    }
    // The same connection still delivers a good batch afterwards.
    agent.send_encoded(&bytes).await.expect("good batch");
    // Then rank 1's process exits (rank 0 keeps running).
    let exit = slowrank_shared::wire::Batch {
        host: good.host.clone(),
        agent_id: good.agent_id.clone(),
        seq: good.seq + 1,
        mono_ns: slowrank_agent::clock::mono_ns(),
        exits: vec![slowrank_shared::wire::RankExit {
            pid: good.ranks[1].pid,
            rank: 1,
            exit_ns: slowrank_agent::clock::mono_ns(),
        }],
        ..Default::default()
    };
    agent
        .send_encoded(&wire::encode(&exit).unwrap())
        .await
        .expect("exit batch");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stats.batches_ok.load(std::sync::atomic::Ordering::Relaxed) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "good batch never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rejected: std::collections::BTreeMap<String, u64> = stats
        .rejected
        .iter()
        .map(|e| (e.key().clone(), *e.value()))
        .collect();
    for reason in [
        "truncated",
        "length_mismatch",
        "invalid_archive",
        "bad_magic",
        "wrong_version",
        "agent_id_mismatch",
    ] {
        assert_eq!(rejected.get(reason), Some(&1), "{reason}: {rejected:?}");
    }
    let body = scrape(metrics);
    assert!(
        body.contains("slowrank_batches_rejected_total{reason=\"truncated\"} 1"),
        "{body}"
    );
    assert!(body.contains("slowrank_agents_refused_total 1"), "{body}");
    assert!(body.contains("slowrank_agents_connected 1"), "{body}");
    assert!(
        body.contains("slowrank_ingest_total{what=\"batches\"}"),
        "{body}"
    );

    agent.close().await;
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(20), serve)
        .await
        .expect("serve stops on shutdown")
        .expect("serve thread")
        .expect("serve");
    assert_eq!(summary.batches, 2);
    assert_eq!(summary.batches_rejected, 6);
    assert_eq!(summary.agents_refused, 1);
    let r = &summary.report;
    assert_eq!(r.ingest.counters.batches, 2);
    assert!(r.ingest.counters.records_accepted > 0);
    assert_eq!(r.ingest.transport_rejected.values().sum::<u64>(), 6);
    assert_eq!(r.ingest.agents_refused, 1);
    assert_eq!(analyzer.report().ingest.counters.batches, 2);
    // The dead rank and the rank left unobserved when its agent went away
    // are both in the report, not silently lost.
    assert_eq!(r.job.exited_ranks, [1]);
    assert_eq!(r.agents.len(), 1);
    let a = &r.agents[0];
    assert!(!a.connected && a.reason.is_some(), "{a:?}");
    assert_eq!(a.ranks_unobserved, [0]);
    let table = slowrank_coordinator::render_human(r);
    assert!(table.contains("EXIT  rank 1 exited"), "{table}");
    assert!(table.contains("rank 0 no longer observed"), "{table}");
    assert!(table.contains("6 batches rejected"), "{table}");
}
