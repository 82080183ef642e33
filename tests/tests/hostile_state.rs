//! Findings 5 and 6 of issue 27: a token holder that owns a rank cannot
//! grow the join without bound. It declares thousands of 4,096-rank
//! communicators and opens instances on each that never complete (nobody
//! else is in them), and tries a communicator of 2^20 ranks; a legitimate
//! agent sends beside it. Open instances stay within the total cap (the
//! excess evicted and counted), each instance holds only the members that
//! arrived, the 2^20 communicator is refused, RSS stays bounded, and the
//! legitimate agent keeps its rate.

mod hostile;

use std::time::Duration;

use hostile::*;
use slowrank_agent::clock;
use slowrank_shared::wire::{self, CollOp, CollectiveRecord, CommRecord};

/// Communicators the attacker declares and instances it opens on each.
const COMMS: u64 = 4_000;
const PER_COMM: u64 = 40;
/// Communicators (and their instances) per batch: 4,000 records, a large
/// but real batch (an agent cuts one every ~100 ms).
const COMMS_PER_BATCH: u64 = 100;
/// RSS the coordinator may gain: 65,536 open instances (the cap) of one
/// member each, 4,000 communicators of 4,096 declared members (stored as
/// seen: one), the closed keys, and the batches in flight.
const MAX_RSS_GROWTH: u64 = 192 << 20;

fn comm(id: u64, nranks: u32) -> CommRecord {
    CommRecord {
        pid: 1001,
        rank: 1,
        comm_id: id,
        parent_id: 0,
        color: 0,
        nranks,
        rank_in_comm: 1,
        created_ns: clock::mono_ns(),
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    }
}

fn coll(id: u64, seq: u64) -> CollectiveRecord {
    let now = clock::mono_ns();
    CollectiveRecord {
        pid: 1001,
        rank: 1,
        comm_id: id,
        seq,
        op: CollOp::AllReduce,
        bytes: 1 << 20,
        peer: -1,
        host_entry_ns: now - 1_000_000,
        host_exit_ns: now,
        gpu_arrive_ns: 0,
        gpu_done_ns: 0,
        launches_before: 0,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: None,
        ret: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_owner_cannot_grow_the_join_without_bound() {
    for rep in 0..repetitions() {
        let coord = Coord::start("state");
        let legit = Legit::start(&coord, "node-0", "agent-0", vec![identity(0, 4096, 0)]).await;
        let normal = legit.rate_over(Duration::from_secs(3)).await;
        let rss0 = coord.rss();
        let watch = RssWatch::start(coord.child.id());

        // Rank 1 is the attacker's; a 2^20-rank communicator is tried first.
        let mut first = batch("node-9", "agent-9", 1, vec![identity(1, 4096, 0)]);
        first.comms.push(comm(0xdead, 1 << 20));
        let mut batches = vec![wire::encode(&first).unwrap()];
        for chunk in 0..COMMS / COMMS_PER_BATCH {
            let mut b = batch("node-9", "agent-9", chunk + 2, Vec::new());
            let ids = (chunk * COMMS_PER_BATCH..(chunk + 1) * COMMS_PER_BATCH).map(|i| 0x1000 + i);
            for id in ids {
                b.comms.push(comm(id, 4096));
                b.collectives.extend((0..PER_COMM).map(|s| coll(id, s)));
            }
            batches.push(wire::encode(&b).unwrap());
        }
        let attack = async {
            let (_ep, attacker) = raw_connect(&coord, "127.0.0.2").await.expect("QUIC");
            let reply = raw_hello(&attacker, &hello("node-9", "agent-9", TOKEN))
                .await
                .unwrap();
            assert!(reply.accepted, "{}", reply.reason);
            for b in &batches {
                assert_eq!(raw_send_bytes(&attacker, b).await, Ok(wire::BATCH_INGESTED));
            }
            attacker
        };
        let (during, attacker) = legit.rate_during(attack).await;
        // Past the hang timeout: every open instance is due now.
        let after = legit.rate_over(Duration::from_secs(5)).await;
        let peak = watch.stop();
        // One rank joins at most MAX_COMMS_PER_RANK communicators; the
        // rest are refused with their instances.
        let cap = u64::from(slowrank_coordinator::join::MAX_COMMS_PER_RANK).min(COMMS);
        let r = coord.wait_report("the memberships past the cap refused", |r| {
            r["ingest"]["records_rejected"]["too_many_communicators_for_rank"].as_u64()
                == Some(COMMS - cap)
        });
        let report_bytes = std::fs::metadata(coord.dir.join("out").join("report.json"))
            .map(|m| m.len())
            .unwrap_or(0);
        let open = r["ingest"]["open_instances"].as_u64().unwrap_or(u64::MAX);
        let evicted = r["ingest"]["instances_evicted"].as_u64().unwrap_or(0);
        eprintln!(
            "rep {rep}: rate {normal:.1}/s normal, {during:.1}/s under attack, {after:.1}/s after; RSS {:.1} MiB before, \
             peak {:.1} MiB; open instances {open}, evicted {evicted}; comm_too_large/larger_than_world {} {}; report {report_bytes} B",
            mib(rss0),
            mib(peak),
            r["ingest"]["records_rejected"]["comm_too_large"],
            r["ingest"]["records_rejected"]["comm_larger_than_world"],
        );
        assert!(
            open <= slowrank_coordinator::join::MAX_OPEN_TOTAL as u64,
            "{open} open instances"
        );
        assert!(
            open + evicted >= cap * PER_COMM - 100,
            "instances neither open nor evicted: {open} + {evicted}"
        );
        assert_eq!(
            r["ingest"]["records_rejected"]["comm_larger_than_world"], 1,
            "the 2^20-rank communicator was not refused"
        );
        assert!(
            peak.saturating_sub(rss0) <= MAX_RSS_GROWTH,
            "RSS grew {:.1} MiB (bound {:.0} MiB)",
            mib(peak.saturating_sub(rss0)),
            mib(MAX_RSS_GROWTH)
        );
        assert!(report_bytes < 4 << 20, "report.json of {report_bytes} B");
        for (when, rate) in [("during", during), ("after", after)] {
            assert!(
                keeps_rate(rate, normal),
                "the legitimate agent fell to {rate:.1}/s from {normal:.1}/s {when} the attack"
            );
        }
        drop(attacker);
        legit.stop();
    }
}
