//! Finding 6 of issue 27, the report's side: a hang on a communicator of
//! 2^20 ranks (the most a job may declare) once wrote a 206 MB
//! `report.json`, naming every one of its 1,048,575 missing ranks, every 3 s.
//! Here one agent owns ranks 0–3 of a 2^20-rank world, all four join the
//! world communicator, ranks 0 and 1 enter an all-reduce that nobody else
//! enters. The hang is reported as a count with ranges — 1,048,574 missing,
//! ranks 2–3 known, the rest never announced — with only the first few
//! listed, and the report stays small.

mod hostile;

use std::time::{Duration, Instant};

use hostile::*;
use slowrank_agent::clock;
use slowrank_coordinator::join::HANG_LIST_MAX;
use slowrank_shared::wire::{self, CollOp, CollectiveRecord, CommRecord};

const WORLD: u32 = 1 << 20;
const COMM: u64 = 0xbeef;
/// What `report.json` may weigh with this hang in it (it was 206 MB).
const MAX_REPORT: u64 = 256 << 10;
/// RSS the coordinator may gain: walking the hang's 2^20 positions takes a
/// few MiB for a moment; nothing is kept per absent member.
const MAX_RSS_GROWTH: u64 = 128 << 20;

fn comm(rank: u32) -> CommRecord {
    CommRecord {
        pid: 1000 + rank,
        rank,
        comm_id: COMM,
        parent_id: 0,
        color: 0,
        nranks: WORLD,
        rank_in_comm: rank,
        created_ns: clock::mono_ns(),
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    }
}

fn coll(rank: u32) -> CollectiveRecord {
    let now = clock::mono_ns();
    CollectiveRecord {
        pid: 1000 + rank,
        rank,
        comm_id: COMM,
        seq: 1,
        op: CollOp::AllReduce,
        bytes: 1 << 20,
        peer: -1,
        host_entry_ns: now - 1_000_000,
        host_exit_ns: 0,
        gpu_arrive_ns: 0,
        gpu_done_ns: 0,
        launches_before: 0,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: None,
        ret: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_of_a_million_ranks_makes_a_small_report() {
    for rep in 0..repetitions() {
        let coord = Coord::start("hang");
        let agent = connect(&coord, "node-0", "agent-0")
            .await
            .expect("the agent is accepted");
        let rss0 = coord.rss();
        let watch = RssWatch::start(coord.child.id());
        let mut first = batch(
            "node-0",
            "agent-0",
            1,
            (0..4).map(|r| identity(r, WORLD, 0)).collect(),
        );
        first.comms = (0..4).map(comm).collect();
        first.collectives = (0..2).map(coll).collect();
        let send = |b: &wire::Batch| {
            let bytes = wire::encode(b).unwrap();
            let agent = &agent;
            async move {
                agent
                    .begin_send(&bytes)
                    .await
                    .expect("sent")
                    .answer()
                    .await
                    .expect("answered")
            }
        };
        send(&first).await;
        // The agent keeps sending (empty batches), as a live one would, so
        // its ranks stay current; the never-announced members make the
        // instance wait for the stale bound (30 s) before it is a hang.
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut seq = 1;
        let r = loop {
            seq += 1;
            send(&batch("node-0", "agent-0", seq, Vec::new())).await;
            let r = coord.report();
            if r["hangs"].as_array().is_some_and(|h| !h.is_empty()) {
                break r;
            }
            assert!(Instant::now() < deadline, "no hang reported: {r:#}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        // One more rewrite with the hang in it, then measure the files.
        std::thread::sleep(Duration::from_millis(1500));
        let peak = watch.stop();
        let out = coord.dir.join("out");
        let json_bytes = std::fs::metadata(out.join("report.json")).unwrap().len();
        let text = std::fs::read_to_string(out.join("report.txt")).unwrap();
        let h = &r["hangs"][0];
        eprintln!(
            "rep {rep}: report.json {json_bytes} B, report.txt {} B, RSS {:.1} MiB before, peak {:.1} MiB; \
             missing_count {} ranges {} unlisted {}",
            text.len(),
            mib(rss0),
            mib(peak),
            h["missing_count"],
            h["missing_ranges"],
            h["missing_unlisted"]
        );
        assert_eq!(h["missing_count"], u64::from(WORLD - 2), "{h:#}");
        assert_eq!(h["missing_ranges"], serde_json::json!([[2, 3]]), "{h:#}");
        assert_eq!(h["missing_unlisted"], u64::from(WORLD - 4), "{h:#}");
        assert_eq!(h["present_ranks"], serde_json::json!([0, 1]), "{h:#}");
        for list in ["missing_ranks", "missing"] {
            let n = h[list].as_array().map_or(usize::MAX, Vec::len);
            assert!(n <= HANG_LIST_MAX, "{list} lists {n}");
        }
        assert!(json_bytes <= MAX_REPORT, "report.json of {json_bytes} B");
        assert!(
            (text.len() as u64) <= MAX_REPORT,
            "report.txt of {} B",
            text.len()
        );
        assert!(
            text.contains("HANG  1048574 members, ranks 2-3 (1048572 not in the ranges"),
            "{text}"
        );
        assert!(
            peak.saturating_sub(rss0) <= MAX_RSS_GROWTH,
            "RSS grew {:.1} MiB",
            mib(peak.saturating_sub(rss0))
        );
        agent.close().await;
    }
}
