//! Helpers shared by the scenario tests: run a small spec with traces on and
//! read the traces back.

#![allow(dead_code)]

use std::{collections::HashMap, ops::Deref, path::Path, path::PathBuf};

use slowrank_scenarios::{
    run::{run, RunOptions, RunSummary},
    scratch::ScratchDir,
    spec::Spec,
};

/// A finished run; its output directory goes when this drops after a pass.
pub struct Ran {
    summary: RunSummary,
    _dir: ScratchDir,
}

impl Deref for Ran {
    type Target = RunSummary;
    fn deref(&self) -> &RunSummary {
        &self.summary
    }
}

/// Runs `toml` with traces on.
pub fn run_spec(name: &str, toml: &str) -> Ran {
    run_spec_beside(name, toml, |_| {})
}

/// Runs `toml` with traces on while `beside` runs on another thread with
/// the run directory.
pub fn run_spec_beside(
    name: &str,
    toml: &str,
    beside: impl FnOnce(PathBuf) + Send + 'static,
) -> Ran {
    let spec = Spec::parse(toml).expect("test spec is valid");
    let dir = ScratchDir::new(&format!("test-{name}")).expect("scratch dir");
    let mut opts = RunOptions::job_only(dir.path());
    opts.trainer = Some(PathBuf::from(env!("CARGO_BIN_EXE_slowrank-trainer")));
    opts.trace = true;
    let path = dir.path().to_path_buf();
    let side = std::thread::spawn(move || beside(path));
    let summary = run(&spec, &opts).expect("scenario runs");
    side.join().expect("the thread beside the run");
    Ran { summary, _dir: dir }
}

/// One line of `coll-rank-N.log`.
#[derive(Debug, Clone)]
pub struct Coll {
    pub key: String,
    pub host: u64,
    pub arrive: u64,
    pub release: u64,
    pub done: u64,
}

impl Coll {
    /// Communicator id part of the key.
    pub fn comm(&self) -> &str {
        self.key.split('/').nth(1).unwrap_or("")
    }
    /// Sequence number of a collective key.
    pub fn seq(&self) -> u64 {
        self.key
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
    pub fn wait(&self) -> u64 {
        self.release.saturating_sub(self.arrive)
    }
    pub fn transfer(&self) -> u64 {
        self.done.saturating_sub(self.release)
    }
}

pub fn colls(out: &Path, rank: u32) -> HashMap<String, Coll> {
    let text = std::fs::read_to_string(out.join("sim").join(format!("coll-rank-{rank}.log")))
        .expect("collective trace");
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let n = |i: usize| f[i].parse::<u64>().expect("number");
            let c = Coll {
                key: f[0].to_string(),
                host: n(1),
                arrive: n(2),
                release: n(3),
                done: n(4),
            };
            (c.key.clone(), c)
        })
        .collect()
}

/// (posted, completed) ns of every NIC completion of `rank`.
pub fn nic(out: &Path, rank: u32) -> Vec<(u64, u64)> {
    let path = out.join("sim").join(format!("nic-rank-{rank}.log"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<u64> = l.split(' ').map(|x| x.parse().expect("number")).collect();
            (f[3], f[4])
        })
        .collect()
}

pub fn median(mut v: Vec<u64>) -> u64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_unstable();
    v[v.len() / 2]
}

/// A one-host data-parallel job of `n` ranks, `iterations` long.
pub fn dp_spec(name: &str, hosts: u32, per_host: u32, iterations: u64, faults: &str) -> String {
    format!(
        r#"
name = "{name}"
seed = 3
iterations = {iterations}
hosts = {hosts}
ranks_per_host = {per_host}
[parallel]
tp = 1
pp = 1
dp = {dp}
[step]
forward_kernels = 20
backward_kernels = 40
kernel_us = 500
grad_buckets = 4
bucket_bytes = 4194304
jitter = 0.02
optimizer_kernels = 4
[run]
timeout_s = 120
hang_hold_s = 1.0
stall_s = 30
{faults}
"#,
        dp = hosts * per_host
    )
}
