//! Scenario specs: the TOML a scenario is written in, parsed strictly
//! (unknown keys, bad values and out-of-range ranks are errors with reasons)
//! and validated against itself. Every key is documented in `README.md`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use slowrank_sim::{control::MAX_LOCAL, model::Model};

use crate::layout::Layout;

/// Why a spec was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
    #[error("invalid scenario: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> SpecError {
    SpecError::Invalid(msg.into())
}

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    pub iterations: u64,
    pub hosts: u32,
    pub ranks_per_host: u32,
    pub parallel: Parallel,
    #[serde(default)]
    pub step: Step,
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub clock: ClockSpec,
    #[serde(default)]
    pub model: Model,
    #[serde(default)]
    pub run: RunSpec,
}

/// Parallel layout; `tp * pp * dp` must equal the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallel {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
}

/// The modelled training step of every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Step {
    pub forward_kernels: u32,
    pub backward_kernels: u32,
    pub kernel_us: f64,
    pub grad_buckets: u32,
    pub bucket_bytes: u64,
    pub jitter: f64,
    pub layers: u32,
    pub microbatches: u32,
    pub activation_bytes: u64,
    pub optimizer_kernels: u32,
    pub optimizer_graph: bool,
    pub data_loader_us: f64,
    pub host_us_per_layer: f64,
    pub batch_bytes: u64,
}

impl Default for Step {
    fn default() -> Self {
        Self {
            forward_kernels: 40,
            backward_kernels: 80,
            kernel_us: 200.0,
            grad_buckets: 4,
            bucket_bytes: 25 << 20,
            jitter: 0.02,
            layers: 4,
            microbatches: 1,
            activation_bytes: 4 << 20,
            optimizer_kernels: 10,
            optimizer_graph: false,
            data_loader_us: 500.0,
            host_us_per_layer: 50.0,
            batch_bytes: 4 << 20,
        }
    }
}

/// Fault kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    Compute,
    Host,
    Communication,
    Link,
    Hang,
    /// Structural: one pipeline stage has more work on every replica
    /// (partition imbalance; `stage`, `factor`): every rank of that stage
    /// runs its kernels `factor` times longer.
    StageImbalance,
    /// Structural: per-iteration work that moves between ranks (sequence
    /// lengths): each targeted rank's kernels take `1 + (factor − 1)·u²`
    /// times longer in each iteration, `u` uniform in [0, 1) drawn per
    /// (seed, rank, iteration) — most batches short, a few long.
    WorkImbalance,
}

impl FaultKind {
    /// Structural causes: no single rank is at fault.
    pub fn is_structural(self) -> bool {
        matches!(self, FaultKind::StageImbalance | FaultKind::WorkImbalance)
    }
}

/// How a host fault slows the rank's CPU side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostMode {
    /// Modelled extra time in one named host function.
    #[default]
    Delay,
    /// Real CPU contention: busy threads pinned to the rank's CPU while
    /// its host work runs on the CPU instead of sleeping.
    Contention,
}

/// Host-side functions of the trainer a host fault can slow down.
pub const HOST_FUNCTIONS: &[&str] = &["load_batch", "forward", "backward", "optimizer_step"];

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub kind: FaultKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_latency_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<HostMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// stage_imbalance: the slower pipeline stage (0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<u32>,
    pub start_iteration: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_iteration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duty: Option<f64>,
}

impl Fault {
    /// The ranks the fault applies to (`rank` and/or `ranks`).
    pub fn targets(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.rank.into_iter().collect();
        if let Some(r) = &self.ranks {
            v.extend(r);
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether the fault is on during `iteration` (0-based).
    pub fn active_at(&self, iteration: u64) -> bool {
        if iteration < self.start_iteration || self.end_iteration.is_some_and(|e| iteration >= e) {
            return false;
        }
        match self.period {
            Some(p) if p > 0 => {
                let on = ((self.duty.unwrap_or(0.5) * p as f64).ceil() as u64).clamp(1, p);
                (iteration - self.start_iteration) % p < on
            }
            _ => true,
        }
    }

    /// Slowdown factor of compute / host faults (default 1.5).
    pub fn slowdown(&self) -> f64 {
        self.factor.unwrap_or(1.5)
    }

    /// (extra latency ns, bandwidth fraction) of communication / link faults.
    pub fn network(&self) -> (u64, f64) {
        let bw = self
            .bandwidth_factor
            .or(self.factor.map(|f| 1.0 / f))
            .unwrap_or(if self.extra_latency_us.is_some() {
                1.0
            } else {
                0.5
            });
        ((self.extra_latency_us.unwrap_or(0.0) * 1e3) as u64, bw)
    }

    pub fn host_function(&self) -> &str {
        self.function.as_deref().unwrap_or("load_batch")
    }
}

/// Per-host clock skew given to that host's agent (test-only setting).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockSpec {
    pub offset_us: Vec<i64>,
    pub drift_ppm: Vec<f64>,
}

impl ClockSpec {
    pub fn offset_us(&self, host: u32) -> i64 {
        self.offset_us.get(host as usize).copied().unwrap_or(0)
    }
    pub fn drift_ppm(&self, host: u32) -> f64 {
        self.drift_ppm.get(host as usize).copied().unwrap_or(0.0)
    }
}

/// How the launcher runs the scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSpec {
    /// Whole-run limit; the run is stopped and marked `timeout` after it.
    pub timeout_s: f64,
    /// After a hang starts, keep the job hung this long, then stop it.
    pub hang_hold_s: f64,
    /// No rank finishing an iteration for this long (and no hang injected)
    /// stops the run as `stalled`.
    pub stall_s: f64,
    /// A test seam: past `iterations`, the job goes on until the file
    /// `sim/release` appears in the run directory ([`RELEASE_FILE`]).
    /// Every rank looks for it every [`RELEASE_EVERY`] iterations and the
    /// ranks agree through the hub, so all of them end at the same
    /// iteration; `timeout_s` still bounds the run. A fault test whose
    /// premise is "the job still runs when X happens" (a restarted agent
    /// attached, which waits for the kernel to tear the killed one's
    /// probes down: seconds idle, a minute beside a CPU hog) ends the job
    /// once X was seen instead of guessing a length.
    pub end_on_release: bool,
}

/// The file (under the run directory's `sim/`) that ends a job run with
/// [`RunSpec::end_on_release`].
pub const RELEASE_FILE: &str = "release";
/// How often (iterations) the ranks of such a job look for it.
pub const RELEASE_EVERY: u64 = 10;

impl Default for RunSpec {
    fn default() -> Self {
        Self {
            timeout_s: 600.0,
            hang_hold_s: 5.0,
            stall_s: 60.0,
            end_on_release: false,
        }
    }
}

impl Spec {
    /// Parses and validates a spec from TOML text.
    pub fn parse(text: &str) -> Result<Spec, SpecError> {
        let spec: Spec = toml::from_str(text).map_err(|e| SpecError::Parse(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Reads, parses and validates a spec file.
    pub fn load(path: &Path) -> Result<Spec, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            SpecError::Parse(m) => SpecError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// The ranks fault `f` acts on: its `rank`/`ranks`; for a
    /// `stage_imbalance` every rank of its stage; for a `work_imbalance`
    /// without ranks, every rank.
    pub fn fault_ranks(&self, f: &Fault) -> Vec<u32> {
        match (f.kind, f.stage) {
            (FaultKind::StageImbalance, Some(stage)) => {
                let l = self.layout();
                (0..self.world_size())
                    .filter(|r| l.coords(*r).pp == stage)
                    .collect()
            }
            (FaultKind::WorkImbalance, _) if f.targets().is_empty() => {
                (0..self.world_size()).collect()
            }
            _ => f.targets(),
        }
    }

    pub fn world_size(&self) -> u32 {
        self.hosts * self.ranks_per_host
    }

    pub fn layout(&self) -> Layout {
        Layout {
            tp: self.parallel.tp,
            pp: self.parallel.pp,
            dp: self.parallel.dp,
            hosts: self.hosts,
            ranks_per_host: self.ranks_per_host,
        }
    }

    /// Model given to the stand-ins: the spec's, with the step jitter and
    /// seed applied to transfers too.
    pub fn sim_model(&self) -> Model {
        let mut m = self.model.clone();
        if m.jitter == 0.0 {
            m.jitter = self.step.jitter;
        }
        if m.seed == 0 {
            m.seed = self.seed;
        }
        m
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        if self.name.trim().is_empty() {
            return Err(invalid("`name` is empty"));
        }
        if self.iterations == 0 {
            return Err(invalid("`iterations` must be at least 1"));
        }
        if self.hosts == 0 || self.hosts > 32 {
            return Err(invalid(format!(
                "`hosts` = {} is not in 1..=32",
                self.hosts
            )));
        }
        if self.ranks_per_host == 0 || self.ranks_per_host > MAX_LOCAL {
            return Err(invalid(format!(
                "`ranks_per_host` = {} is not in 1..={MAX_LOCAL}",
                self.ranks_per_host
            )));
        }
        let p = self.parallel;
        let world = self.world_size();
        // Checked: tp * pp * dp of a hostile spec can overflow u32.
        let covered = p.tp.checked_mul(p.pp).and_then(|x| x.checked_mul(p.dp));
        if p.tp == 0 || p.pp == 0 || p.dp == 0 || covered != Some(world) {
            return Err(invalid(format!(
                "parallel layout tp={} x pp={} x dp={} does not cover the {world} ranks (hosts={} x ranks_per_host={})",
                p.tp, p.pp, p.dp, self.hosts, self.ranks_per_host
            )));
        }
        self.validate_step()?;
        for (i, f) in self.faults.iter().enumerate() {
            self.validate_fault(f)
                .map_err(|e| invalid(format!("fault #{i} ({:?}): {e}", f.kind)))?;
        }
        for (key, len) in [
            ("clock.offset_us", self.clock.offset_us.len()),
            ("clock.drift_ppm", self.clock.drift_ppm.len()),
        ] {
            if len != 0 && len != self.hosts as usize {
                return Err(invalid(format!(
                    "`{key}` has {len} entries; give one per host ({}) or none",
                    self.hosts
                )));
            }
        }
        let m = &self.model;
        if !(m.nvlink_gbps > 0.0 && m.nic_gbps > 0.0 && m.pcie_gbps > 0.0) {
            return Err(invalid("model bandwidths must be positive"));
        }
        if m.nvlink_latency_us < 0.0 || m.nic_latency_us < 0.0 || !(0.0..0.5).contains(&m.jitter) {
            return Err(invalid(
                "model latencies must be >= 0 and jitter in [0, 0.5)",
            ));
        }
        let r = &self.run;
        if !(r.timeout_s > 0.0 && r.hang_hold_s >= 0.0 && r.stall_s > 0.0) {
            return Err(invalid(
                "run.timeout_s and run.stall_s must be > 0, run.hang_hold_s >= 0",
            ));
        }
        Ok(())
    }

    fn validate_step(&self) -> Result<(), SpecError> {
        let s = &self.step;
        if s.forward_kernels == 0 || s.backward_kernels == 0 {
            return Err(invalid(
                "step: forward_kernels and backward_kernels must be >= 1",
            ));
        }
        if s.kernel_us.is_nan() || s.kernel_us <= 0.0 {
            return Err(invalid(format!(
                "step.kernel_us = {} must be > 0",
                s.kernel_us
            )));
        }
        if s.grad_buckets == 0 || s.grad_buckets > s.backward_kernels {
            return Err(invalid(format!(
                "step.grad_buckets = {} must be in 1..=backward_kernels ({})",
                s.grad_buckets, s.backward_kernels
            )));
        }
        if s.layers == 0 || s.microbatches == 0 {
            return Err(invalid("step: layers and microbatches must be >= 1"));
        }
        if !(0.0..0.5).contains(&s.jitter) {
            return Err(invalid(format!(
                "step.jitter = {} must be in [0, 0.5)",
                s.jitter
            )));
        }
        if s.data_loader_us < 0.0 || s.host_us_per_layer < 0.0 {
            return Err(invalid("step: host times must be >= 0"));
        }
        Ok(())
    }

    fn validate_fault(&self, f: &Fault) -> Result<(), String> {
        let world = self.world_size();
        match (f.kind, f.stage) {
            (FaultKind::StageImbalance, None) => {
                return Err("a stage_imbalance fault needs `stage`".into())
            }
            (FaultKind::StageImbalance, Some(s)) if self.parallel.pp < 2 || s >= self.parallel.pp => {
                return Err(format!(
                    "stage = {s} is not a pipeline stage (pp = {}; a stage imbalance needs pp >= 2)",
                    self.parallel.pp
                ))
            }
            (FaultKind::StageImbalance, _) if f.rank.is_some() || f.ranks.is_some() => {
                return Err("a stage_imbalance fault names its `stage`, not ranks".into())
            }
            (FaultKind::StageImbalance, _) => {}
            (_, Some(_)) => return Err("`stage` applies only to a stage_imbalance fault".into()),
            _ => {}
        }
        let targets = self.fault_ranks(f);
        if targets.is_empty() {
            return Err("needs `rank` (or `ranks`)".into());
        }
        if let Some(r) = targets.iter().find(|r| **r >= world) {
            return Err(format!("rank {r} is out of range (world size {world})"));
        }
        let layout = self.layout();
        match f.kind {
            FaultKind::Link => {
                let pair = f.ranks.as_deref().unwrap_or(&[]);
                if f.rank.is_some() || pair.len() != 2 || pair[0] == pair[1] {
                    return Err("a link fault needs `ranks = [a, b]`, two different ranks".into());
                }
                if layout.host_of(pair[0]) == layout.host_of(pair[1]) {
                    return Err(format!(
                        "ranks {} and {} share host {}: intra-host traffic is NVLink; a link fault needs ranks on different hosts",
                        pair[0],
                        pair[1],
                        layout.host_of(pair[0])
                    ));
                }
            }
            FaultKind::Communication if self.hosts < 2 => {
                return Err("a communication fault slows the NIC; it needs hosts >= 2".into());
            }
            _ => {}
        }
        if let Some(x) = f.factor {
            if !(x >= 1.0 && x.is_finite()) {
                return Err(format!("factor = {x} must be a slowdown >= 1"));
            }
        }
        if let Some(b) = f.bandwidth_factor {
            if !(b > 0.0 && b <= 1.0) {
                return Err(format!("bandwidth_factor = {b} must be in (0, 1]"));
            }
        }
        if f.extra_latency_us.is_some_and(|l| l < 0.0) || f.delay_us.is_some_and(|d| d < 0.0) {
            return Err("extra_latency_us and delay_us must be >= 0".into());
        }
        let only_for = |key: &str, set: bool, kinds: &[FaultKind]| {
            if set && !kinds.contains(&f.kind) {
                Err(format!("`{key}` does not apply to a {:?} fault", f.kind))
            } else {
                Ok(())
            }
        };
        use FaultKind::*;
        only_for(
            "extra_latency_us",
            f.extra_latency_us.is_some(),
            &[Communication, Link],
        )?;
        only_for(
            "bandwidth_factor",
            f.bandwidth_factor.is_some(),
            &[Communication, Link],
        )?;
        only_for("function", f.function.is_some(), &[Host])?;
        only_for("delay_us", f.delay_us.is_some(), &[Host])?;
        only_for("mode", f.mode.is_some(), &[Host])?;
        only_for("threads", f.threads.is_some(), &[Host])?;
        only_for(
            "factor",
            f.factor.is_some(),
            &[
                Compute,
                Host,
                Communication,
                Link,
                StageImbalance,
                WorkImbalance,
            ],
        )?;
        if let Some(func) = &f.function {
            if !HOST_FUNCTIONS.contains(&func.as_str()) {
                return Err(format!(
                    "function = {func:?} is not one of {HOST_FUNCTIONS:?}"
                ));
            }
        }
        if f.start_iteration >= self.iterations {
            return Err(format!(
                "start_iteration = {} is past the last iteration ({})",
                f.start_iteration,
                self.iterations - 1
            ));
        }
        if let Some(e) = f.end_iteration {
            if e <= f.start_iteration {
                return Err(format!(
                    "end_iteration = {e} must be after start_iteration = {}",
                    f.start_iteration
                ));
            }
            if f.kind == Hang {
                return Err("a hang has no end_iteration: the rank never comes back".into());
            }
        }
        if f.period == Some(0) {
            return Err("period must be >= 1".into());
        }
        if let Some(d) = f.duty {
            if !(d > 0.0 && d <= 1.0) {
                return Err(format!("duty = {d} must be in (0, 1]"));
            }
            if f.period.is_none() {
                return Err("duty needs a period".into());
            }
        }
        if f.kind == Hang && f.period.is_some() {
            return Err("a hang cannot be intermittent".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name = "t"
seed = 7
iterations = 300
hosts = 2
ranks_per_host = 4
[parallel]
tp = 1
pp = 1
dp = 8
[step]
forward_kernels = 40
backward_kernels = 80
kernel_us = 200
grad_buckets = 4
bucket_bytes = 26214400
jitter = 0.05
"#;

    fn with(extra: &str) -> Result<Spec, SpecError> {
        Spec::parse(&format!("{BASE}{extra}"))
    }

    #[test]
    fn the_issue_example_parses() {
        let s = with(
            r#"
[[fault]]
kind = "compute"
rank = 5
factor = 1.3
start_iteration = 100
end_iteration = 250
[clock]
offset_us = [0, 2500]
drift_ppm = [0, 30]
"#,
        )
        .unwrap();
        assert_eq!(s.faults[0].targets(), vec![5]);
        assert!(s.faults[0].active_at(100) && s.faults[0].active_at(249));
        assert!(!s.faults[0].active_at(99) && !s.faults[0].active_at(250));
        assert_eq!(s.clock.offset_us(1), 2500);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("colour = 1\n", "unknown field `colour`"),
            (
                "[[fault]]\nkind = \"compute\"\nrank = 8\nstart_iteration = 1\n",
                "rank 8 is out of range",
            ),
            (
                "[[fault]]\nkind = \"slow\"\nrank = 1\nstart_iteration = 1\n",
                "unknown variant `slow`",
            ),
            (
                "[[fault]]\nkind = \"link\"\nranks = [0, 1]\nstart_iteration = 1\n",
                "share host 0",
            ),
            (
                "[[fault]]\nkind = \"compute\"\nrank = 1\nfactor = 0.5\nstart_iteration = 1\n",
                "slowdown >= 1",
            ),
            (
                "[[fault]]\nkind = \"host\"\nrank = 1\nfunction = \"load\"\nstart_iteration = 1\n",
                "is not one of",
            ),
            (
                "[[fault]]\nkind = \"hang\"\nrank = 1\nstart_iteration = 5\nend_iteration = 9\n",
                "no end_iteration",
            ),
            (
                "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 300\n",
                "past the last iteration",
            ),
            (
                "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = \"x\"\n",
                "invalid type",
            ),
        ];
        for (extra, want) in cases {
            let err = with(extra).unwrap_err().to_string();
            assert!(err.contains(want), "{extra:?}: {err}");
        }
        let bad_layout = BASE.replace("dp = 8", "dp = 4");
        let err = Spec::parse(&bad_layout).unwrap_err().to_string();
        assert!(err.contains("does not cover the 8 ranks"), "{err}");
    }

    #[test]
    fn overflowing_layout_is_an_error_not_a_panic() {
        // 65536 * 65536 wraps to 0 in u32; the check must not overflow.
        let spec = BASE
            .replace("tp = 1", "tp = 65536")
            .replace("pp = 1", "pp = 65536");
        let err = Spec::parse(&spec).unwrap_err().to_string();
        assert!(err.contains("does not cover the 8 ranks"), "{err}");
    }

    #[test]
    fn intermittent_faults_follow_period_and_duty() {
        let s = with(
            "[[fault]]\nkind = \"compute\"\nrank = 1\nstart_iteration = 10\nperiod = 10\nduty = 0.3\n",
        )
        .unwrap();
        let on: Vec<u64> = (0..40).filter(|i| s.faults[0].active_at(*i)).collect();
        assert_eq!(on, vec![10, 11, 12, 20, 21, 22, 30, 31, 32]);
    }

    #[test]
    fn structural_faults_name_a_stage_or_every_rank() {
        let pp = BASE.replace("pp = 1", "pp = 2").replace("dp = 8", "dp = 4");
        let s = Spec::parse(&format!(
            "{pp}[[fault]]\nkind = \"stage_imbalance\"\nstage = 1\nfactor = 1.2\nstart_iteration = 3\n[[fault]]\nkind = \"work_imbalance\"\nfactor = 2\nstart_iteration = 0\n"
        ))
        .unwrap();
        // Megatron order: rank = pp*(dp*tp) + dp*tp + tp → stage 1 is 4..8.
        assert_eq!(s.fault_ranks(&s.faults[0]), vec![4, 5, 6, 7]);
        assert_eq!(s.fault_ranks(&s.faults[1]), (0..8).collect::<Vec<_>>());
        for (extra, want) in [
            (
                "kind = \"stage_imbalance\"\nstart_iteration = 1\n",
                "needs `stage`",
            ),
            (
                "kind = \"stage_imbalance\"\nstage = 2\nstart_iteration = 1\n",
                "not a pipeline stage",
            ),
            (
                "kind = \"stage_imbalance\"\nstage = 0\nrank = 1\nstart_iteration = 1\n",
                "not ranks",
            ),
            (
                "kind = \"compute\"\nstage = 0\nrank = 1\nstart_iteration = 1\n",
                "only to a stage_imbalance",
            ),
        ] {
            let err = Spec::parse(&format!("{pp}[[fault]]\n{extra}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{extra:?}: {err}");
        }
        let err = with("[[fault]]\nkind = \"stage_imbalance\"\nstage = 0\nstart_iteration = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs pp >= 2"), "{err}");
    }

    #[test]
    fn network_parameters_default_sensibly() {
        let s = with(
            "[[fault]]\nkind = \"communication\"\nrank = 1\nfactor = 4\nstart_iteration = 1\n[[fault]]\nkind = \"link\"\nranks = [3, 4]\nextra_latency_us = 50\nstart_iteration = 1\n",
        )
        .unwrap();
        assert_eq!(s.faults[0].network(), (0, 0.25));
        assert_eq!(s.faults[1].network(), (50_000, 1.0));
    }
}
