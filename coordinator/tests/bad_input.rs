//! Bad input from broken or hostile agents, fed in the same run as a good
//! job: every impossible batch or record is refused with a reason, counted
//! by that reason, nothing panics, and what the coordinator concludes about
//! the good job (verdicts, hangs, clocks, joined instances) is exactly what it
//! concludes without the garbage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::pki_types::{pem::PemObject, CertificateDer};
use serde_json::Value;
use slowrank_coordinator::net::ingest::{Ingest, IngestEvent};
use slowrank_coordinator::net::tls::{Identity, SERVER_NAME};
use slowrank_coordinator::{Analyzer, AnalyzerConfig, IngestSummary, Report};
use slowrank_shared::wire::{
    self, Batch, CollectiveRecord, CommRecord, Hello, RankExit, RankIdentity,
};
use slowrank_synth::{Fault, FaultKind, Generator, SynthSpec};

const ITERATIONS: u64 = 60;

/// dp 2×4 with rank 5 compute-slow from iteration 30: a job with a verdict,
/// so "unchanged" compares something that matters.
fn spec() -> SynthSpec {
    let mut s = SynthSpec::dp(2, 4);
    s.faults.push(Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.3,
        },
        30,
    ));
    s
}

/// Where in the stream a hook runs: after good batch `index` of an iteration.
struct At<'a> {
    index: usize,
    recv: u64,
    good: &'a Batch,
}

/// Runs the good job through one analyzer, calling `bad` after every good
/// batch. Good batches must never be refused, garbage or not.
fn drive(mut bad: impl FnMut(&Analyzer, &At)) -> (Analyzer, Vec<String>) {
    let a = Analyzer::new(AnalyzerConfig::default());
    let mut g = Generator::new(spec());
    for (h, s) in g.initial_samples() {
        a.add_clock_sample(&h, s).unwrap();
    }
    let mut lines = Vec::new();
    for _ in 0..ITERATIONS {
        let out = g.next_iteration();
        for (h, s) in &out.samples {
            a.add_clock_sample(h, *s).unwrap();
        }
        for (index, (recv, b)) in out.batches.iter().enumerate() {
            let sum = a.ingest(b, *recv);
            assert_eq!(
                (sum.rejected, sum.batch_rejected),
                (0, None),
                "good batch refused: {:?}",
                a.report().ingest.counters
            );
            bad(
                &a,
                &At {
                    index,
                    recv: *recv,
                    good: b,
                },
            );
        }
        let now = out.end_ns as i64 + 3_000_000;
        lines.extend(a.tick(now).into_iter().map(|e| e.line));
    }
    (a, lines)
}

/// What the coordinator concluded about the job, without the ingest
/// counters (which must differ: they count the garbage) and wall times.
fn conclusions(r: &Report) -> Value {
    let mut v = serde_json::to_value(r).unwrap();
    for verdict in v["verdicts"].as_array_mut().unwrap() {
        verdict.as_object_mut().unwrap().remove("first_seen");
    }
    for hang in v["hangs"].as_array_mut().unwrap() {
        hang.as_object_mut().unwrap().remove("first_seen");
    }
    v["job"].as_object_mut().unwrap().remove("started");
    let ingest = &v["ingest"];
    serde_json::json!({
        "job": v["job"],
        "clock": v["clock"],
        "verdicts": v["verdicts"],
        "hangs": v["hangs"],
        "instances": [
            ingest["instances_completed"],
            ingest["instances_evicted"],
            ingest["instances_incomplete"],
            ingest["dropped_late_for_stats"],
            ingest["open_instances"],
        ],
    })
}

fn rogue(agent: &str, host: &str, seq: u64, at: &At) -> Batch {
    Batch {
        host: host.into(),
        agent_id: agent.into(),
        seq,
        mono_ns: at.good.mono_ns,
        ..Default::default()
    }
}

fn coll(at: &At) -> CollectiveRecord {
    at.good.collectives[0].clone()
}

/// Sends `b` and returns what the analyzer said.
fn send(a: &Analyzer, b: &Batch, at: &At) -> IngestSummary {
    a.ingest(b, at.recv)
}

#[test]
fn impossible_batches_are_refused_by_reason_and_change_nothing_for_good_agents() {
    let (clean, clean_lines) = drive(|_, _| {});
    let baseline = clean.report();
    assert!(
        baseline.verdicts.iter().any(|v| v.rank == 5 && v.active),
        "the good job must yield its verdict: {:?}",
        baseline.verdicts
    );

    // A buggy second agent on node-0 ("rogue") and an intruder that says it
    // is node-9; each sends a different kind of garbage after each good batch.
    let mut rogue_seq = 0;
    let mut intruder_seq = 0;
    let mut first_iteration_record: Option<CollectiveRecord> = None;
    let mut expected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut expected_batches: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut duplicates = 0;
    let mut parked = 0;
    let mut kind = 0usize;
    let (dirty, dirty_lines) = drive(|a, at| {
        if at.index != 0 {
            // node-0's batch is in but node-1's is not: its instances are
            // open. Exact copies of its records are harmless duplicates.
            return;
        }
        if first_iteration_record.is_none() {
            first_iteration_record = Some(coll(at));
        }
        let mut expect = |label: &'static str, sum: IngestSummary, n: u64| {
            assert_eq!(sum.rejected, n, "{label}: {sum:?}");
            assert_eq!(sum.batch_rejected, None, "{label}");
            *expected.entry(label).or_default() += n;
        };
        let mut expect_batch = |label: &'static str, sum: IngestSummary| {
            assert_eq!(sum.batch_rejected, Some(label), "{sum:?}");
            *expected_batches.entry(label).or_default() += 1;
        };
        rogue_seq += 1;
        let mut b = rogue("rogue", "node-0", rogue_seq, at);
        match kind % 14 {
            0 => {
                let mut r = coll(at);
                r.comm_id = 0xdead_beef; // never announced by anyone
                b.collectives.push(r);
                // Not refused: it may only be early (its membership still to
                // come); parked, and counted lost if that never happens.
                let sum = send(a, &b, at);
                assert_eq!((sum.rejected, sum.accepted), (0, 0), "{sum:?}");
                parked += 1;
            }
            1 => {
                // An instance completed in iteration 0.
                b.collectives.push(first_iteration_record.clone().unwrap());
                expect("sequence_backwards", send(a, &b, at), 1);
            }
            2 => {
                let mut r = coll(at);
                r.host_entry_ns = at.good.mono_ns + 3_600_000_000_000; // an hour on
                r.host_exit_ns = r.host_entry_ns + 1;
                r.gpu_arrive_ns = 0;
                r.gpu_done_ns = 0;
                b.collectives.push(r);
                expect("time_in_future", send(a, &b, at), 1);
            }
            3 => {
                let mut r = coll(at);
                r.host_exit_ns = r.host_entry_ns - 1_000; // left before it entered
                b.collectives.push(r);
                expect("time_order", send(a, &b, at), 1);
            }
            4 => {
                // Duplicate records: the good agent's records again, twice.
                b.collectives.extend(at.good.collectives.iter().cloned());
                b.collectives.extend(at.good.collectives.iter().cloned());
                let sum = send(a, &b, at);
                assert_eq!(sum.rejected, 0, "{sum:?}");
                assert_eq!(sum.duplicates as usize, 2 * at.good.collectives.len());
                duplicates += sum.duplicates;
            }
            5 => {
                // Absurd counts: a 10^9-rank communicator and world.
                let mut c = comm_template();
                c.nranks = 1_000_000_000;
                b.comms.push(c.clone());
                expect("comm_too_large", send(a, &b, at), 1);
                rogue_seq += 1;
                let mut b = rogue("rogue", "node-0", rogue_seq, at);
                c.nranks = 4096; // fits the cap, not this 8-rank world
                b.comms.push(c);
                expect("comm_larger_than_world", send(a, &b, at), 1);
                rogue_seq += 1;
                let mut b = rogue("rogue", "node-0", rogue_seq, at);
                b.ranks.push(identity(3, 1_000_000_000));
                expect("world_too_large", send(a, &b, at), 1);
                rogue_seq += 1;
                let mut b = rogue("rogue", "node-0", rogue_seq, at);
                b.ranks.push(identity(3, 16)); // another world than the job's
                expect("world_size_conflict", send(a, &b, at), 1);
            }
            6 => {
                let mut r = coll(at);
                r.rank = 1_000_000_000;
                b.collectives.push(r);
                expect("rank_out_of_range", send(a, &b, at), 1);
            }
            7 => {
                // An exit for rank 1 from a process that is not rank 1's.
                b.exits.push(RankExit {
                    pid: 999_999,
                    rank: 1,
                    exit_ns: at.good.mono_ns,
                });
                expect("exit_of_other_process", send(a, &b, at), 1);
            }
            8 => {
                // The rogue agent suddenly claims to run on node-1.
                b.host = "node-1".into();
                b.collectives.push(coll(at));
                expect_batch("host_changed", send(a, &b, at));
            }
            9 => {
                // Cut a day after it arrived, on node-0's probed clock.
                b.mono_ns = at.good.mono_ns + 86_400_000_000_000;
                b.wall_ns = 1;
                b.collectives.push(coll(at));
                expect_batch("batch_in_future", send(a, &b, at));
            }
            10 => {
                // A sequence number already seen is a resend.
                let mut b = rogue("rogue", "node-0", 1, at);
                b.collectives.push(coll(at));
                assert!(send(a, &b, at).duplicate_batch);
            }
            _ => {
                // The intruder replays node-0's records and identities as its
                // own host's: none of those ranks run on node-9.
                intruder_seq += 1;
                let mut b = at.good.clone();
                b.agent_id = "intruder".into();
                b.host = "node-9".into();
                b.seq = intruder_seq;
                b.ranks.push(identity(2, 8));
                b.exits.push(RankExit {
                    pid: 0,
                    rank: 0,
                    exit_ns: at.good.mono_ns,
                });
                let n = (b.ranks.len()
                    + b.exits.len()
                    + b.comms.len()
                    + b.collectives.len()
                    + b.intervals.len()
                    + b.links.len()) as u64;
                expect("wrong_host", send(a, &b, at), n);
            }
        }
        kind += 1;
    });
    let rep = dirty.report();
    let counters = &rep.ingest.counters;
    for (label, n) in &expected {
        assert_eq!(
            counters.records_rejected.get(*label),
            Some(n),
            "records rejected as {label}: {:?}",
            counters.records_rejected
        );
    }
    assert_eq!(
        counters.records_rejected.values().sum::<u64>(),
        expected.values().sum::<u64>(),
        "every rejection is one of the expected: {:?}",
        counters.records_rejected
    );
    assert_eq!(
        counters.batches_rejected,
        expected_batches
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<BTreeMap<String, u64>>(),
        "batch rejections by reason"
    );
    assert!(!counters.recent_rejections.is_empty());
    assert!(parked > 0);
    assert_eq!(counters.parking.parked, parked, "{:?}", counters.parking);
    assert!(duplicates > 0);
    assert!(counters.duplicate_batches > 0);
    // The reasons reach /metrics too.
    let prom = dirty.metrics().to_prometheus();
    assert!(prom.contains("slowrank_records_rejected_total{reason=\"wrong_host\"}"));
    assert!(prom.contains("slowrank_batches_rejected_total{reason=\"host_changed\"}"));

    assert_eq!(
        conclusions(&rep),
        conclusions(&baseline),
        "garbage changed what the coordinator concluded about the good job"
    );
    assert_eq!(dirty_lines, clean_lines, "alerts differ");
}

fn identity(rank: u32, world_size: u32) -> RankIdentity {
    RankIdentity {
        pid: 4242,
        rank,
        world_size,
        local_rank: rank,
        local_world_size: 4,
        group_rank: 0,
        restart_count: 0,
        job_id: "job".into(),
        seen_ns: 1,
    }
}

fn comm_template() -> CommRecord {
    CommRecord {
        pid: 1,
        rank: 0,
        comm_id: 0x5eed,
        parent_id: 0,
        color: 0,
        nranks: 8,
        rank_in_comm: 0,
        created_ns: 1,
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    }
}

// --- wire level, over a real QUIC connection ------------------------------

const TOKEN: &str = "bad-input-token";

fn client_config(ca_pem: &str) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()))
}

/// A bare agent: says hello, then writes raw bytes on one stream each.
struct RawAgent {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl RawAgent {
    async fn connect(addr: std::net::SocketAddr, ca: &str, agent_id: &str, host: &str) -> Self {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(client_config(ca));
        let conn = endpoint.connect(addr, SERVER_NAME).unwrap().await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let hello = Hello {
            token: TOKEN.into(),
            host: host.into(),
            agent_id: agent_id.into(),
            mono_ns: 1,
            wall_ns: 1,
        };
        send.write_all(&wire::encode(&hello).unwrap())
            .await
            .unwrap();
        send.finish().unwrap();
        let reply: wire::HelloReply = wire::decode(&recv.read_to_end(4096).await.unwrap()).unwrap();
        assert!(reply.accepted, "{}", reply.reason);
        Self { endpoint, conn }
    }

    /// Sends a batch that will be rejected and waits for the rejection.
    async fn send(&self, bytes: &[u8]) {
        let mut answer = self.send_only(bytes).await;
        let got = answer.read_to_end(8).await.unwrap_or_default();
        assert_eq!(
            got,
            [wire::BATCH_REJECTED],
            "a bad batch must be answered as rejected"
        );
    }

    /// Sends a batch without waiting for the answer (a good one is answered
    /// only once the events below are taken and acknowledged).
    async fn send_only(&self, bytes: &[u8]) -> quinn::RecvStream {
        let (mut s, r) = self.conn.open_bi().await.unwrap();
        // The server may stop reading an oversized stream early.
        let _ = s.write_all(bytes).await;
        let _ = s.finish();
        r
    }

    async fn close(self) {
        self.conn.close(0u32.into(), b"done");
        self.endpoint.wait_idle().await;
    }
}

#[tokio::test]
async fn wire_faults_are_rejected_by_reason_while_a_good_agent_keeps_being_served() {
    let identity = Identity::generate().unwrap();
    let ingest = Arc::new(Ingest::bind("127.0.0.1:0".parse().unwrap(), &identity, TOKEN).unwrap());
    let addr = ingest.local_addr().unwrap();
    let (tx, mut events) = tokio::sync::mpsc::channel(256);
    let runner = ingest.clone();
    tokio::spawn(async move { runner.run(tx).await });

    let good = RawAgent::connect(addr, &identity.cert_pem, "good-0", "node-0").await;
    let bad = RawAgent::connect(addr, &identity.cert_pem, "bad-0", "node-1").await;

    let mut g = Generator::new(spec());
    let _ = g.initial_samples();
    let mut sent = Vec::new();
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for it in 0..4 {
        let out = g.next_iteration();
        let (_, mut b) = out.batches[0].clone();
        b.agent_id = "good-0".into();
        let bytes = wire::encode(&b).unwrap();
        good.send_only(&bytes).await;
        sent.push(b.clone());

        // One of each wire fault per iteration, interleaved with good data.
        let mut v = bytes.clone();
        v[4..6].copy_from_slice(&(wire::SCHEMA_VERSION + 1).to_le_bytes());
        bad.send(&v).await;
        *expected.entry("wrong_version").or_default() += 1;
        bad.send(&bytes[..bytes.len() - 1 - it]).await;
        *expected.entry("length_mismatch").or_default() += 1;
        bad.send(&bytes[..5]).await;
        *expected.entry("truncated").or_default() += 1;
        bad.send(b"\x00\x01garbage that is not a slowrank message")
            .await;
        *expected.entry("bad_magic").or_default() += 1;
        let mut v = bytes.clone();
        v[8..12].copy_from_slice(&((wire::MAX_MESSAGE_BYTES as u32) + 1).to_le_bytes());
        bad.send(&v).await;
        *expected.entry("oversized").or_default() += 1;
        let mut v = bytes.clone();
        for x in v[wire::HEADER_LEN..].iter_mut().step_by(7) {
            *x = x.wrapping_mul(31) ^ 0x5a;
        }
        bad.send(&v).await;
        *expected.entry("invalid_archive").or_default() += 1;
        let hello = wire::encode(&Hello {
            token: TOKEN.into(),
            host: "x".into(),
            agent_id: "x".into(),
            mono_ns: 0,
            wall_ns: 0,
        })
        .unwrap();
        bad.send(&hello).await;
        *expected.entry("wrong_kind").or_default() += 1;
        // A valid batch claiming to come from the good agent.
        bad.send(&bytes).await;
        *expected.entry("agent_id_mismatch").or_default() += 1;
    }
    // Really larger than the cap: refused unread.
    let mut huge = wire::encode(&sent[0]).unwrap();
    huge.resize(wire::HEADER_LEN + wire::MAX_MESSAGE_BYTES + 1, 0);
    bad.send(&huge).await;
    *expected.entry("oversized").or_default() += 1;
    // The good agent is still served after all that.
    let mut last = sent[3].clone();
    last.seq += 100;
    good.send_only(&wire::encode(&last).unwrap()).await;
    sent.push(last);

    let mut received = Vec::new();
    while received.len() < sent.len() {
        match tokio::time::timeout(Duration::from_secs(20), events.recv())
            .await
            .expect("event within 20 s")
            .expect("channel open")
        {
            IngestEvent::Batch {
                agent_id,
                batch,
                ack,
            } => {
                ack.done();
                assert_eq!(agent_id, "good-0", "only the good agent's batches pass");
                received.push(*batch);
            }
            IngestEvent::AgentUp { .. }
            | IngestEvent::AgentDown { .. }
            | IngestEvent::Clock { .. } => {}
        }
    }
    assert_eq!(received, sent, "good batches arrive intact and in order");

    let stats = ingest.stats();
    let got: BTreeMap<String, u64> = stats
        .rejected
        .iter()
        .map(|e| (e.key().clone(), *e.value()))
        .collect();
    let want: BTreeMap<String, u64> = expected.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(got, want, "rejections by reason");
    assert_eq!(
        stats.agents.get("bad-0").unwrap().rejected,
        want.values().sum::<u64>()
    );
    assert_eq!(stats.agents.get("good-0").unwrap().rejected, 0);

    // And the analyzer takes the good agent's batches as if nothing happened.
    let a = Analyzer::new(AnalyzerConfig::default());
    for b in &received {
        let sum = a.ingest(b, b.mono_ns);
        assert_eq!((sum.rejected, sum.batch_rejected), (0, None));
    }
    good.close().await;
    bad.close().await;
    ingest.close();
}
