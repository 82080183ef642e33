//! Agent → coordinator over a real QUIC connection on loopback: a batch
//! arrives intact, bad bytes are rejected with a counted reason (and the
//! connection keeps working), a wrong token is refused, and clock probes
//! take the kernel-stamped clock port when it is on and the control stream
//! when it is off.

use std::time::Duration;

use slowrank_agent::clock::HostClock;
use slowrank_agent::ship::{client_config, ShipError, Shipper};
use slowrank_coordinator::net::control::ProbeSchedule;
use slowrank_coordinator::net::ingest::{Ingest, IngestEvent};
use slowrank_coordinator::net::tls::{Identity, SERVER_NAME};
use slowrank_shared::wire::{self, Batch, CallRecord, Hello, ProbeDesc};
use tokio::sync::mpsc;

const TOKEN: &str = "test-token-7f3a";

struct Server {
    ingest: std::sync::Arc<Ingest>,
    events: mpsc::Receiver<IngestEvent>,
    addr: std::net::SocketAddr,
    ca: String,
}

fn start_server() -> Server {
    start_server_with(ProbeSchedule::default())
}

fn start_server_with(schedule: ProbeSchedule) -> Server {
    let identity = Identity::generate().expect("self-signed identity");
    let ingest = std::sync::Arc::new(
        Ingest::bind_with("127.0.0.1:0".parse().unwrap(), &identity, TOKEN, schedule)
            .expect("bind"),
    );
    let addr = ingest.local_addr().unwrap();
    let (tx, events) = mpsc::channel(64);
    let runner = ingest.clone();
    tokio::spawn(async move { runner.run(tx).await });
    Server {
        ingest,
        events,
        addr,
        ca: identity.cert_pem,
    }
}

fn hello(token: &str) -> Hello {
    Hello {
        token: token.into(),
        host: "node-0".into(),
        agent_id: "agent-0".into(),
        mono_ns: 1,
        wall_ns: 2,
    }
}

fn sample_batch(seq: u64) -> Batch {
    Batch {
        host: "node-0".into(),
        agent_id: "agent-0".into(),
        seq,
        mono_ns: 1_000 + seq,
        wall_ns: 2_000 + seq,
        probes: vec![ProbeDesc {
            id: 7,
            path: "/usr/lib/libnccl.so.2".into(),
            symbol: "ncclAllReduce".into(),
        }],
        calls: (0..100)
            .map(|i| CallRecord {
                ts_ns: 10_000 + i,
                pid: 42,
                tid: 43,
                probe: 7,
                is_return: i % 2 == 1,
                args: [i, 2, 3, 4, 5, 6],
                ret: i * 3,
            })
            .collect(),
        ringbuf_drops: 5,
        ..Default::default()
    }
}

async fn next_event(events: &mut mpsc::Receiver<IngestEvent>) -> IngestEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("coordinator event within 10 s")
        .expect("ingest channel open")
}

async fn connect(server: &Server, token: &str) -> Result<Shipper, ShipError> {
    let config = client_config(server.ca.as_bytes(), SERVER_NAME).expect("client config");
    Shipper::connect(server.addr, SERVER_NAME, config, &hello(token)).await
}

#[tokio::test]
async fn batch_arrives_intact_and_bad_bytes_are_rejected_without_harm() {
    let mut server = start_server();
    let shipper = connect(&server, TOKEN).await.expect("accepted");
    match next_event(&mut server.events).await {
        IngestEvent::AgentUp { agent_id, host, .. } => {
            assert_eq!((agent_id.as_str(), host.as_str()), ("agent-0", "node-0"))
        }
        other => panic!("expected AgentUp, got {other:?}"),
    }

    // `send` returns once the coordinator says it ingested the batch, so
    // take the event (and acknowledge it) while the send waits.
    let sent = sample_batch(1);
    let (res, ev) = tokio::join!(shipper.send(&sent), async {
        let ev = next_event(&mut server.events).await;
        match ev {
            IngestEvent::Batch {
                agent_id,
                batch,
                ack,
            } => {
                ack.done();
                (agent_id, batch)
            }
            other => panic!("expected Batch, got {other:?}"),
        }
    });
    res.expect("send");
    assert_eq!(ev.0, "agent-0");
    assert_eq!(*ev.1, sent, "batch must arrive field for field");

    // Truncated: a valid batch cut in half.
    let good = wire::encode(&sample_batch(2)).unwrap();
    shipper.send_encoded(&good[..good.len() / 2]).await.unwrap();
    // Corrupted: header intact, archive bytes flipped so bytecheck must fail.
    let mut corrupt = good.clone();
    for b in corrupt[wire::HEADER_LEN..].iter_mut().step_by(3) {
        *b ^= 0xA5;
    }
    shipper.send_encoded(&corrupt).await.unwrap();
    // Not ours at all.
    shipper
        .send_encoded(b"GET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();

    // The same connection still delivers the next good batch.
    let after = sample_batch(3);
    let (res, ()) = tokio::join!(shipper.send(&after), async {
        match next_event(&mut server.events).await {
            IngestEvent::Batch { batch, ack, .. } => {
                ack.done();
                assert_eq!(*batch, after)
            }
            other => panic!("expected the good batch after the bad ones, got {other:?}"),
        }
    });
    res.expect("send after garbage");

    let stats = server.ingest.stats();
    assert_eq!(
        stats.rejected_total(),
        3,
        "three bad messages, three rejections"
    );
    let classes: Vec<String> = stats.rejected.iter().map(|e| e.key().clone()).collect();
    assert!(
        classes.iter().any(|c| c == "bad_magic"),
        "garbage counted as bad_magic: {classes:?}"
    );
    assert!(
        classes
            .iter()
            .any(|c| c == "length_mismatch" || c == "truncated"),
        "truncation counted: {classes:?}"
    );
    assert!(
        classes.iter().any(|c| c == "invalid_archive"),
        "corruption caught by bytecheck: {classes:?}"
    );
    assert_eq!(
        stats.batches_ok.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    shipper.close().await;
    server.ingest.close();
}

#[tokio::test]
async fn wrong_token_is_refused_and_counted() {
    let server = start_server();
    match connect(&server, "not-the-token").await {
        Err(ShipError::Refused(reason)) => assert!(!reason.is_empty(), "refusal says why"),
        Err(other) => panic!("expected a refusal, got error {other}"),
        Ok(_) => panic!("a wrong token must not be accepted"),
    }
    assert_eq!(
        server
            .ingest
            .stats()
            .refused_agents
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    server.ingest.close();
}

/// Clock samples from a real agent's answers, until `n` arrived; the true
/// offset (coordinator − agent) is −1 ms.
async fn clock_samples(
    server: &mut Server,
    n: usize,
) -> Vec<slowrank_coordinator::clock::ClockSample> {
    let shipper = connect(server, TOKEN).await.expect("accepted");
    let (tx, _requests) = mpsc::channel(4);
    let control = shipper.spawn_control(HostClock::simulated(1_000_000, 0.0), tx);
    let mut got = Vec::new();
    while got.len() < n {
        match next_event(&mut server.events).await {
            IngestEvent::Clock { sample, .. } => got.push(sample),
            IngestEvent::AgentUp { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    control.abort();
    shipper.close().await;
    server.ingest.close();
    got
}

/// The offset a sample implies lies within half its round trip of the truth.
fn assert_brackets_truth(s: &slowrank_coordinator::clock::ClockSample) {
    let rtt = (s.coord_recv_ns - s.coord_send_ns - s.agent_hold_ns) as f64;
    let theta = (s.coord_send_ns as f64 + s.coord_recv_ns as f64
        - 2.0 * s.agent_mono_ns as f64
        - s.agent_hold_ns as f64)
        / 2.0;
    // Two clock reads apart in the simulated clock: allow a few µs.
    assert!(
        (theta + 1_000_000.0).abs() <= rtt / 2.0 + 5_000.0,
        "offset {theta} ns outside ±{} ns of the truth: {s:?}",
        rtt / 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_probes_move_to_the_clock_port_and_stay_true() {
    let mut server = start_server();
    assert!(server.ingest.clock_port_addr().is_some());
    let samples = clock_samples(&mut server, 60).await;
    let udp: Vec<_> = samples.iter().filter(|s| s.udp).collect();
    assert!(
        udp.len() >= 20,
        "only {} of {} samples through the clock port",
        udp.len(),
        samples.len()
    );
    for s in &samples {
        assert_brackets_truth(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_clock_port_probes_use_the_control_stream() {
    let mut server = start_server_with(ProbeSchedule {
        clock_port: None,
        ..ProbeSchedule::default()
    });
    assert!(server.ingest.clock_port_addr().is_none());
    let samples = clock_samples(&mut server, 20).await;
    assert!(samples.iter().all(|s| !s.udp && s.agent_hold_ns == 0));
    for s in &samples {
        assert_brackets_truth(s);
    }
}
