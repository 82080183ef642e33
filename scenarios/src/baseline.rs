//! Naive straggler rules other tools ship, computed from a run's own data so
//! they can be scored side by side with slowrank on the same runs:
//!
//! - *longest step*: the rank with the longest step time (`steps.csv`);
//! - *shortest collective*: the rank with the shortest collective call
//!   (host exit − entry, from the agents' records `agent-host-N.jsonl`) —
//!   the last arriver waits least.
//!
//! Both flag a rank when it is the extreme in `need` of the last `window`
//! iterations (instances), the same 4-of-5 hysteresis slowrank uses, and
//! report it as `compute` (what "this GPU is slow" means to such a tool);
//! they say nothing about hosts, links or hangs.

use std::{collections::BTreeMap, path::Path};

use crate::{
    score::{ReportView, VerdictView},
    steps::StepLog,
};

pub const LONGEST_STEP: &str = "longest-step";
pub const SHORTEST_COLLECTIVE: &str = "shortest-collective";
pub const WINDOW: usize = 5;
pub const NEED: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: not an agent record")]
    Json {
        path: String,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// One collective call of one rank.
#[derive(Debug, Clone, PartialEq)]
pub struct Coll {
    pub rank: u32,
    pub comm: String,
    pub seq: u64,
    pub duration_ns: u64,
}

/// Flags ranks from a sequence of (position, extreme rank) with the
/// `need`-of-`window` rule; one verdict per rank, at its first flag.
fn flag(seq: impl Iterator<Item = (u64, u32)>, window: usize, need: usize) -> ReportView {
    let mut recent: std::collections::VecDeque<u32> = Default::default();
    let mut opened: BTreeMap<u32, u64> = BTreeMap::new();
    for (pos, rank) in seq {
        recent.push_back(rank);
        if recent.len() > window {
            recent.pop_front();
        }
        if recent.iter().filter(|r| **r == rank).count() >= need {
            opened.entry(rank).or_insert(pos);
        }
    }
    ReportView {
        schema: crate::score::REPORT_SCHEMA.into(),
        verdicts: opened
            .into_iter()
            .map(|(rank, it)| VerdictView {
                id: None,
                rank,
                host: String::new(),
                kind: "compute".into(),
                confidence: 1.0,
                first_seen_iteration: Some(it),
                active: true,
                link: None,
                opened_iteration: Some(it),
                first_opened_iteration: Some(it),
                cost_fraction: None,
                cost_iterations: None,
                cost_estimate: None,
                closed_iteration: None,
                structural: None,
            })
            .collect(),
        hangs: Vec::new(),
        job: None,
        slow_stretches: Vec::new(),
    }
}

/// "The rank with the longest step time", per iteration.
pub fn longest_step(steps: &StepLog, window: usize, need: usize) -> ReportView {
    let mut best: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
    for s in steps.steps.values() {
        let d = s.duration_ns();
        let e = best.entry(s.iteration).or_insert((d, s.rank));
        if d > e.0 {
            *e = (d, s.rank);
        }
    }
    flag(best.into_iter().map(|(it, (_, r))| (it, r)), window, need)
}

/// Collective calls from `DIR/agent-host-*.jsonl`.
pub fn read_agent_collectives(dir: &Path) -> Result<Vec<Coll>, BaselineError> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        rank: u32,
        #[serde(default)]
        comm_id: String,
        #[serde(default)]
        seq: u64,
        #[serde(default)]
        host_entry_ns: u64,
        #[serde(default)]
        host_exit_ns: u64,
    }
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|source| BaselineError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    let mut files: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("agent-host-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).map_err(|source| BaselineError::Io {
            path: p.display().to_string(),
            source,
        })?;
        for (i, l) in text.lines().enumerate() {
            if !l.contains("\"collective\"") {
                continue;
            }
            let r: Line = serde_json::from_str(l).map_err(|source| BaselineError::Json {
                path: p.display().to_string(),
                line: i + 1,
                source,
            })?;
            if r.kind == "collective" && r.host_exit_ns >= r.host_entry_ns {
                out.push(Coll {
                    rank: r.rank,
                    comm: r.comm_id,
                    seq: r.seq,
                    duration_ns: r.host_exit_ns - r.host_entry_ns,
                });
            }
        }
    }
    Ok(out)
}

/// The communicator with the most calls (the data-parallel one).
fn reference_comm(colls: &[Coll]) -> Option<String> {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for c in colls {
        *n.entry(&c.comm).or_default() += 1;
    }
    n.into_iter()
        .max_by_key(|(_, k)| *k)
        .map(|(c, _)| c.to_string())
}

/// Instances of the reference communicator per training iteration.
pub fn instances_per_iteration(colls: &[Coll], iterations: u64) -> u64 {
    let Some(comm) = reference_comm(colls) else {
        return 1;
    };
    let seqs: std::collections::BTreeSet<u64> = colls
        .iter()
        .filter(|c| c.comm == comm)
        .map(|c| c.seq)
        .collect();
    (seqs.len() as u64 / iterations.max(1)).max(1)
}

/// "The rank with the shortest collective", per instance of the reference
/// communicator; verdict iterations are `seq / per_iteration`.
pub fn shortest_collective(
    colls: &[Coll],
    per_iteration: u64,
    window: usize,
    need: usize,
) -> ReportView {
    let comm = reference_comm(colls).unwrap_or_default();
    let mut best: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
    for c in colls.iter().filter(|c| c.comm == comm) {
        let e = best.entry(c.seq).or_insert((c.duration_ns, c.rank));
        if c.duration_ns < e.0 {
            *e = (c.duration_ns, c.rank);
        }
    }
    flag(
        best.into_iter()
            .map(|(seq, (_, r))| (seq / per_iteration.max(1), r)),
        window,
        need,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::StepTime;

    #[test]
    fn longest_step_flags_a_persistent_maximum_only() {
        let mut s = StepLog::default();
        for it in 0..20u64 {
            for r in 0..4u32 {
                // Rank (it % 4) is a little slower each iteration (jitter),
                // rank 2 much slower from iteration 10.
                let mut d = 100 + u64::from(r == (it % 4) as u32) * 5;
                if r == 2 && it >= 10 {
                    d = 200;
                }
                s.add(StepTime {
                    rank: r,
                    iteration: it,
                    start_ns: it * 1000,
                    end_ns: it * 1000 + d,
                    wall_ns: 0,
                });
            }
        }
        let v = longest_step(&s, 5, 4);
        assert_eq!(v.verdicts.len(), 1, "{:?}", v.verdicts);
        assert_eq!(v.verdicts[0].rank, 2);
        assert_eq!(v.verdicts[0].opened_iteration, Some(13));
        assert_eq!(v.verdicts[0].kind, "compute");
    }

    #[test]
    fn shortest_collective_uses_the_reference_comm() {
        let mut c = Vec::new();
        for seq in 0..16u64 {
            for r in 0..4u32 {
                let d = if r == 3 && seq >= 8 {
                    10
                } else {
                    100 + u64::from(r)
                };
                c.push(Coll {
                    rank: r,
                    comm: "a".into(),
                    seq,
                    duration_ns: d,
                });
            }
        }
        // A small other communicator where rank 1 is always shortest.
        for seq in 0..6u64 {
            c.push(Coll {
                rank: 1,
                comm: "b".into(),
                seq,
                duration_ns: 1,
            });
        }
        assert_eq!(instances_per_iteration(&c, 4), 4);
        let v = shortest_collective(&c, 4, 5, 4);
        let ranks: Vec<u32> = v.verdicts.iter().map(|v| v.rank).collect();
        // Rank 0 (shortest by 1 ns before the fault) and rank 3 after it.
        assert_eq!(ranks, vec![0, 3]);
        assert_eq!(v.verdicts[1].opened_iteration, Some(11 / 4));
    }

    #[test]
    fn reads_agent_jsonl_collectives() {
        let dir = std::env::temp_dir().join(format!("slowrank-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("agent-host-0.jsonl"),
            "{\"type\":\"rank\",\"rank\":0}\n{\"type\":\"collective\",\"rank\":1,\"comm_id\":\"ab\",\"seq\":3,\"host_entry_ns\":10,\"host_exit_ns\":25}\n",
        )
        .unwrap();
        let c = read_agent_collectives(&dir).unwrap();
        assert_eq!(
            c,
            vec![Coll {
                rank: 1,
                comm: "ab".into(),
                seq: 3,
                duration_ns: 15
            }]
        );
        std::fs::write(
            dir.join("agent-host-1.jsonl"),
            "{\"type\":\"collective\",\"rank\":\"x\"}\n",
        )
        .unwrap();
        assert!(matches!(
            read_agent_collectives(&dir),
            Err(BaselineError::Json { line: 1, .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
