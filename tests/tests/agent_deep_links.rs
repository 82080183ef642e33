//! The deep probe set against the simulated NIC: with `--deep`, every
//! agent finds the verbs provider's post_send/poll_cq through
//! `ibv_context.ops` (they are not exported; `ibv_post_send` is inline), and
//! its link records must match the NIC trace the stand-in writes
//! (`sim/nic-rank-N.log`: one line per completion, `qp_num dlid bytes ...`):
//! the same QP numbers per rank, each mapped to its remote QP through
//! `ibv_modify_qp`, completions and bytes no more than the NIC did (posts
//! before the late attach are missed) and most of them.
//!
//! Needs root and the trainer and coordinator built (see scenario_records.rs).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde_json::Value;
use slowrank_scenarios::{
    orchestrate::Mode,
    run::{run, RunOptions},
    spec::Spec,
};

mod faultkit;
use faultkit::root_or_skip;

#[test]
fn deep_set_link_records_match_the_nic() {
    if !root_or_skip("deep_set_link_records_match_the_nic") {
        return;
    }
    std::env::set_var("SLOWRANK_AGENT_ARGS", "--deep");
    let mut spec = Spec::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/specs/dp8-healthy.toml"),
    )
    .unwrap();
    // Long enough that the probes attached after the first ibv_open_device
    // (the agent reads the ops table, then attaches) see most of the traffic.
    spec.iterations = 40;
    let out = std::env::temp_dir().join(format!("slowrank-agent-test-deep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut opts = RunOptions::job_only(&out);
    opts.mode = Mode::WithAgents;
    opts.trace = true;
    let summary = run(&spec, &opts).expect("scenario with agents");

    /// (dest qp, posts, completions, bytes, latency sum) of one (rank, qp).
    type Link = (u64, u64, u64, u64, u64);
    let mut mine: BTreeMap<(u64, u64), Link> = BTreeMap::new();
    for h in 0..spec.hosts {
        let text = std::fs::read_to_string(out.join(format!("agent-host-{h}.jsonl"))).unwrap();
        for l in text.lines() {
            let v: Value = serde_json::from_str(l).unwrap();
            if v["type"] != "link" {
                continue;
            }
            let g = |k: &str| v[k].as_u64().unwrap();
            // QPs are announced once without traffic (for the peer join).
            if g("posts") == 0 && g("completions") == 0 {
                continue;
            }
            let e = mine.entry((g("rank"), g("qp_num"))).or_default();
            e.0 = g("dest_qp_num");
            e.1 += g("posts");
            e.2 += g("completions");
            e.3 += g("bytes");
            e.4 += g("post_to_completion_ns");
        }
    }
    assert!(!mine.is_empty(), "no link records");
    for rt in &summary.truth.ranks {
        let nic =
            std::fs::read_to_string(out.join(format!("sim/nic-rank-{}.log", rt.rank))).unwrap();
        let mut qps: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for l in nic.lines() {
            let f: Vec<u64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let e = qps.entry(f[0]).or_default();
            e.0 += 1;
            e.1 += f[2];
        }
        let r = u64::from(rt.rank);
        let my_qps: BTreeSet<u64> = mine.keys().filter(|k| k.0 == r).map(|k| k.1).collect();
        assert_eq!(
            my_qps,
            qps.keys().copied().collect(),
            "rank {}: QP numbers",
            rt.rank
        );
        for (qp, (n, bytes)) in qps {
            let m = mine[&(r, qp)];
            assert!(
                m.2 <= n && m.2 * 2 >= n,
                "rank {} qp {qp}: {} completions seen, NIC did {n}",
                rt.rank,
                m.2
            );
            assert!(
                m.3 <= bytes && m.3 > 0,
                "rank {} qp {qp}: {} bytes posted, NIC moved {bytes}",
                rt.rank,
                m.3
            );
            assert!(m.4 > 0, "no post→completion latency");
            // Mapped to its remote QP through ibv_modify_qp (RTR).
            assert_ne!(m.0, 0, "rank {} qp {qp}: destination QP unknown", rt.rank);
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
