//! Findings 2, 3, 4, 7 and 10 of issue 27: a token holder cannot silence,
//! impersonate or skew another agent, nor plant evidence for its ranks.
//! Each attack runs against a real `slowrank serve` beside a legitimate
//! agent (node-0, ranks 0 and 1 of 2) sending at a steady rate.

mod hostile;

use std::time::Duration;

use hostile::*;
use slowrank_shared::wire::{self, FoldedStack, StackView, StackWindow};

/// RSS the coordinator may gain during the stack flood (finding 7): 40
/// batches of ≈ 12 MB of forged stacks (≈ 0.5 GB) go by; none is kept. What
/// remains is the batches in flight — one connection holds at most its
/// budget (three of the largest batches, read and decoded) — and the
/// allocator's retained arenas.
const MAX_RSS_GROWTH: u64 = 160 << 20;

fn rejected(r: &serde_json::Value, reason: &str) -> u64 {
    r["ingest"]["records_rejected"][reason]
        .as_u64()
        .unwrap_or(0)
}

fn refused(r: &serde_json::Value, reason: &str) -> u64 {
    r["ingest"]["agents_refused_by"][reason]
        .as_u64()
        .unwrap_or(0)
}

fn agent<'a>(r: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    r["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["agent_id"] == id))
        .unwrap_or(&serde_json::Value::Null)
}

/// A window of `n` distinct stacks of 64 frames for `rank` (≈ 200 B a stack).
fn stacks(rank: u32, n: usize) -> StackWindow {
    let now = slowrank_agent::clock::mono_ns();
    StackWindow {
        rank,
        view: StackView::Cpu,
        start_ns: now - 1_000_000_000,
        end_ns: now,
        strings: (0..n)
            .map(|i| format!("forged_frame_{i:08}_{}", "x".repeat(40)))
            .collect(),
        stacks: (0..n)
            .map(|i| FoldedStack {
                frames: (0..64).map(|f| ((i + f) % n) as u32).collect(),
                weight: 1_000,
            })
            .collect(),
        records: n as u64,
        truncated: 0,
        overflow_weight: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_holders_cannot_take_over_impersonate_skew_or_plant_evidence() {
    for rep in 0..repetitions() {
        let coord = Coord::start("identity");
        let ranks = vec![identity(0, 2, 0), identity(1, 2, 0)];
        let legit = Legit::start(&coord, "node-0", "agent-0", ranks).await;
        coord.wait_report("both ranks on node-0", |r| {
            r["job"]["ranks_seen"] == 2 && r["job"]["world_size"] == 2
        });
        let normal = legit.rate_over(Duration::from_secs(3)).await;
        let rss0 = coord.rss();
        let watch = RssWatch::start(coord.child.id());

        // 3 and 4: a second live connection with the agent's id (from its
        // host or another) or with its host is refused; the refusal ends
        // nothing of the legitimate agent's.
        for (host, id, why) in [
            ("node-0", "agent-0", "agent_id_in_use"),
            ("node-7", "agent-0", "agent_id_in_use"),
            ("node-0", "agent-x", "host_in_use"),
        ] {
            let (_ep, conn) = raw_connect(&coord, "127.0.0.2").await.expect("QUIC");
            let reply = raw_hello(&conn, &hello(host, id, TOKEN))
                .await
                .expect("a reply");
            assert!(!reply.accepted, "impostor {id} on {host} accepted");
            assert!(reply.reason.contains("already"), "{why}: {}", reply.reason);
            // Told to try again soon, not to back off: the holder may be a
            // killed agent whose connection is about to time out.
            assert!(
                (1..=5_000).contains(&reply.retry_after_ms),
                "{why}: retry after {} ms",
                reply.retry_after_ms
            );
            // Its batch, had it been let in: seq u64::MAX - 1.
            let b = batch(host, id, u64::MAX - 1, Vec::new());
            assert!(
                raw_send(&conn, &b).await.is_err(),
                "a refused connection still took a batch"
            );
        }

        // 2: a token holder on another host claims rank 1 as an elastic
        // restart, then shrinks the world to 1; 10: counters of u64::MAX;
        // 7: twenty resends of one batch carrying ≈ 12 MB of forged stacks
        // for rank 1 (node-0's), then as many fresh batches with them. All
        // while the legitimate agent's rate is measured.
        let mut seq = 0;
        let mut next = |ranks, f: &dyn Fn(&mut wire::Batch)| {
            seq += 1;
            let mut b = batch("node-9", "agent-9", seq, ranks);
            f(&mut b);
            b
        };
        let claims: Vec<Vec<u8>> = [
            next(vec![identity(1, 2, 1)], &|_| {}),
            next(vec![identity(0, 1, 2)], &|_| {}),
            next(Vec::new(), &|b| {
                b.ringbuf_drops = u64::MAX;
                b.spool_drops = u64::MAX;
            }),
        ]
        .iter()
        .map(|b| wire::encode(b).unwrap())
        .collect();
        let mut forged = next(Vec::new(), &|_| {});
        forged.stacks = (0..8).map(|_| stacks(1, 5_000)).collect();
        let first = forged.seq;
        let forged: Vec<Vec<u8>> = (0..21u64)
            .map(|i| {
                forged.seq = first + i;
                wire::encode(&forged).unwrap()
            })
            .collect();
        let attack = async {
            let (_ep, attacker) = raw_connect(&coord, "127.0.0.2").await.expect("QUIC");
            let reply = raw_hello(&attacker, &hello("node-9", "agent-9", TOKEN))
                .await
                .unwrap();
            assert!(reply.accepted, "{}", reply.reason);
            for b in &claims {
                assert_eq!(raw_send_bytes(&attacker, b).await, Ok(wire::BATCH_INGESTED));
            }
            // The first forged batch, its 19 resends, then 20 fresh ones.
            for i in 0..40usize {
                let b = &forged[i.saturating_sub(19).min(20)];
                assert_eq!(raw_send_bytes(&attacker, b).await, Ok(wire::BATCH_INGESTED));
            }
            attacker.close(0u32.into(), b"done");
        };
        let (during, ()) = legit.rate_during(attack).await;
        let peak = watch.stop();

        let before = coord.wait_report("the attacker's claims rejected", |r| {
            rejected(r, "wrong_host") >= 1 && agent(r, "agent-9").is_object()
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let r = coord.wait_report("a fresh report", |r| {
            r["generated_at"] != before["generated_at"]
        });
        let body = coord.scrape();
        let stacks_refused = metric(&body, "slowrank_stack_windows_refused_total");
        eprintln!(
            "rep {rep}: rate {normal:.1}/s normal, {during:.1}/s under attack; RSS {:.1} MiB before, peak {:.1} MiB; \
             world {} hosts {}; wrong_host {}, world conflicts {}; refused {:?}; stack windows refused {stacks_refused}; \
             ringbuf_drops {}, missing_batches {}",
            mib(rss0),
            mib(peak),
            r["job"]["world_size"],
            r["job"]["hosts"],
            rejected(&r, "wrong_host"),
            rejected(&r, "world_size_conflict"),
            r["ingest"]["agents_refused_by"],
            r["ingest"]["ringbuf_drops"],
            r["ingest"]["missing_batches"],
        );
        // 2: rank 1 stays node-0's, the world stays 2, and the legitimate
        // agent's own announcements keep being accepted.
        assert_eq!(
            r["job"]["world_size"], 2,
            "one agent's claim resized the job"
        );
        assert_eq!(r["job"]["ranks_seen"], 2);
        assert_eq!(
            rejected(&r, "wrong_host"),
            rejected(&before, "wrong_host"),
            "legit records rejected"
        );
        assert!(rejected(&r, "world_size_conflict") >= 1 || rejected(&r, "wrong_host") >= 2);
        // 3 and 4: refused, counted, and the legitimate agent untouched.
        assert_eq!(refused(&r, "agent_id_in_use"), 2);
        assert_eq!(refused(&r, "host_in_use"), 1);
        assert_eq!(agent(&r, "agent-0")["connected"], true, "{r:#}");
        assert!(
            agent(&r, "agent-x").is_null(),
            "a refused impostor is listed"
        );
        assert!(
            r["ingest"]["missing_batches"].as_u64() < Some(5),
            "{}",
            r["ingest"]
        );
        // 10: the job's sums are not poisoned.
        assert_eq!(r["ingest"]["ringbuf_drops"], 0);
        assert_eq!(r["ingest"]["spool_drops"], 0);
        // 7: no forged stack kept, memory bounded.
        // 21 fresh batches × 8 windows; the 19 resends are never read.
        assert_eq!(stacks_refused, 21 * 8, "forged windows refused");
        assert!(
            peak.saturating_sub(rss0) <= MAX_RSS_GROWTH,
            "RSS grew {:.1} MiB (bound {:.0} MiB)",
            mib(peak.saturating_sub(rss0)),
            mib(MAX_RSS_GROWTH)
        );
        assert!(
            keeps_rate(during, normal),
            "the legitimate agent fell to {during:.1}/s from {normal:.1}/s"
        );
        legit.stop();
    }
}
