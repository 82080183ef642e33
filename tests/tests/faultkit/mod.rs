//! Plumbing for the fault tests: a scenario in agent mode (real `slowrank
//! serve`, real agents with eBPF, real rank processes), run on a background
//! thread while the test kills, restarts or cuts off one of its pieces.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use slowrank_scenarios::{
    orchestrate::{Mode, ServiceEntry, ServicesFile, SERVICES_FILE},
    run::{run, RunOptions, RunSummary},
    spec::Spec,
};

/// eBPF needs root: skip loudly, except under CI where it must run.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root for eBPF, and CI=true");
    }
    eprintln!("SKIPPED {test}: needs root (real eBPF uprobes); run as root");
    false
}

/// A spec from the workspace, shortened to `iterations`.
pub fn spec(rel: &str, iterations: u64) -> Spec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let mut s = Spec::load(&path).expect("spec loads");
    s.iterations = iterations;
    s
}

/// A scenario running in agent mode on a background thread.
pub struct Job {
    pub dir: PathBuf,
    handle: Option<JoinHandle<RunSummary>>,
    /// Processes this test started (restarted services); stopped on drop.
    pub extra: Vec<Child>,
}

impl Job {
    /// Starts `spec` with a coordinator and one agent per host; the
    /// coordinator logs one line per ingested batch and writes its report
    /// often, so a killed one leaves an exact account behind.
    pub fn start(name: &str, spec: Spec) -> Job {
        let dir = std::env::temp_dir().join(format!("slowrank-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("run dir");
        // Inherited by the coordinator and the agents this process starts.
        std::env::set_var("RUST_LOG", "info,slowrank_coordinator::serve=debug");
        std::env::set_var("NO_COLOR", "1");
        let mut opts = RunOptions::job_only(&dir);
        opts.mode = Mode::WithAgents;
        opts.timeout = Some(Duration::from_secs(240));
        let handle = std::thread::spawn(move || run(&spec, &opts).expect("scenario runs"));
        Job {
            dir,
            handle: Some(handle),
            extra: Vec::new(),
        }
    }

    /// How the services were started (waits until they are).
    pub fn services(&self) -> ServicesFile {
        let path = self.dir.join("sim").join(SERVICES_FILE);
        let t0 = Instant::now();
        loop {
            if let Ok(text) = fs::read_to_string(&path) {
                if let Ok(s) = serde_json::from_str(&text) {
                    return s;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "services never started; see {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Iterations rank `rank` has finished (one log line each).
    pub fn iterations_done(&self, rank: u32) -> usize {
        fs::read_to_string(self.dir.join("logs").join(format!("rank-{rank}.log")))
            .map(|s| s.lines().filter(|l| l.contains(" iteration ")).count())
            .unwrap_or(0)
    }

    /// Blocks until every one of the job's `world` ranks has finished its
    /// last iteration (its log says `rank N done`), the job's length being
    /// the release's (`run.end_on_release`) rather than a fixed one.
    pub fn wait_ranks_done(&self, world: u32) {
        let done = |r: u32| {
            fs::read_to_string(self.dir.join("logs").join(format!("rank-{r}.log")))
                .is_ok_and(|s| s.lines().any(|l| l == format!("rank {r} done")))
        };
        self.wait_until(
            Duration::from_secs(180),
            "the ranks never finished",
            "every rank finished",
            || (0..world).all(done),
        );
    }

    /// Blocks until rank `rank` has finished `n` iterations.
    pub fn wait_iterations(&self, rank: u32, n: usize) {
        self.wait_until(
            Duration::from_secs(180),
            &format!("rank {rank} never reached iteration {n}"),
            &format!("rank {rank} reached iteration {n}"),
            || self.iterations_done(rank) >= n,
        );
    }

    /// Blocks until the coordinator has ingested a batch with collectives
    /// from `host`'s agent (its log has one "batch ingested" line per batch).
    pub fn wait_host_shipped(&self, host: &str) {
        let log = self.dir.join("logs").join("coordinator.log");
        self.wait_until(
            Duration::from_secs(120),
            &format!("no batch with collectives from {host} reached the coordinator"),
            &format!("{host} shipped a batch"),
            || {
                ingested_batches(&log)
                    .iter()
                    .any(|b| b.host == host && b.collectives > 0)
            },
        );
    }

    /// For a job whose spec has `run.end_on_release`: once `ready` holds
    /// (polled for at most `limit`; `what` names it), lets rank 0 run
    /// `more` iterations, then ends the job (the ranks agree on an
    /// iteration within the next 10). A test whose premise is that the job
    /// still runs when something slow happened (a restarted agent attaches
    /// only after the kernel tore the killed one's probes down: 14-18 s
    /// idle, a minute beside a CPU hog) makes it true this way, instead of
    /// hoping a fixed length is enough: 600 iterations of 36 ms were not,
    /// twice in 40 runs beside the hog (BENCHMARKS.md, stop 49).
    pub fn release_after(
        &self,
        limit: Duration,
        what: &str,
        more: usize,
        ready: impl Fn() -> bool,
    ) {
        self.wait_until(limit, &format!("never {what}"), what, ready);
        let at = self.iterations_done(0);
        eprintln!("{what} at rank 0's iteration {at}; the job ends {more} iterations later");
        self.wait_iterations(0, at + more);
        let file = self
            .dir
            .join("sim")
            .join(slowrank_scenarios::spec::RELEASE_FILE);
        fs::write(&file, b"").expect("release file");
    }

    /// Blocks until `done` holds (polled every 100 ms); fails after
    /// `limit`, or when the job ends first. `what` names it.
    pub fn wait_for(&self, limit: Duration, what: &str, done: impl Fn() -> bool) {
        self.wait_until(limit, &format!("never {what}"), what, done);
    }

    /// Polls `done` every 100 ms; fails with `timeout` after `limit`, or
    /// when the job ends before "`what`".
    fn wait_until(&self, limit: Duration, timeout: &str, what: &str, done: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !done() {
            assert!(
                t0.elapsed() < limit,
                "{timeout}; see {}",
                self.dir.display()
            );
            assert!(
                !self.handle.as_ref().is_some_and(|h| h.is_finished()),
                "the job ended before {what}; see {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of rank `rank` of this job (found by its environment).
    pub fn rank_pid(&self, rank: u32) -> u32 {
        let hub = format!(
            "{}={}",
            "SLOWRANK_SIM_HUB",
            self.dir.join("sim").join("hub.sock").display()
        );
        let want = format!("RANK={rank}");
        for e in fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(env) = fs::read(e.path().join("environ")) else {
                continue;
            };
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            if vars.contains(&hub.as_bytes()) && vars.contains(&want.as_bytes()) {
                return pid;
            }
        }
        panic!("rank {rank} of {} not found in /proc", self.dir.display());
    }

    /// Starts `entry` again the way the launcher did, logging to `log`.
    pub fn respawn(&mut self, token: &str, entry: &ServiceEntry, log: &Path) -> u32 {
        let f = fs::File::create(log).expect("log file");
        let child = Command::new(&entry.program)
            .args(&entry.args)
            .env("SLOWRANK_TOKEN", token)
            .stdout(Stdio::from(f.try_clone().expect("dup")))
            .stderr(Stdio::from(f))
            .spawn()
            .expect("respawn service");
        let pid = child.id();
        self.extra.push(child);
        pid
    }

    /// Waits for the launcher to finish (it stops the agents, then the
    /// coordinator it started).
    pub fn wait(&mut self) -> RunSummary {
        self.handle
            .take()
            .expect("not waited yet")
            .join()
            .expect("scenario thread")
    }

    /// SIGINT to a process this test started, then wait (≤ `grace`) for it.
    pub fn stop_extra(&mut self, pid: u32, grace: Duration) {
        let Some(i) = self.extra.iter().position(|c| c.id() == pid) else {
            return;
        };
        let mut c = self.extra.remove(i);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGINT) };
        let t0 = Instant::now();
        while t0.elapsed() < grace {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Removes the run directory (disk is shared); keeps it if the test failed.
    pub fn cleanup(self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.extra {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test leaves the launcher thread behind, and with it the
        // coordinator and agents it started: stop them (ranks die with
        // their launcher, PR_SET_PDEATHSIG).
        if std::thread::panicking() {
            let path = self.dir.join("sim").join(SERVICES_FILE);
            if let Some(s) = fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_json::from_str::<ServicesFile>(&t).ok())
            {
                for e in std::iter::once(&s.coordinator).chain(&s.agents) {
                    kill9(e.pid);
                }
            }
        }
    }
}

/// SIGKILL, as a crash would.
pub fn kill9(pid: u32) {
    // SAFETY: plain signal to a pid the test identified.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Whether `pid` still exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// One batch as an agent wrote it to its `--output` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentBatch {
    pub seq: u64,
    pub collectives: u64,
    pub ringbuf_drops: u64,
    pub spool_drops: u64,
}

/// The batches in an agent's JSON-lines output, by sequence number.
pub fn agent_batches(path: &Path) -> BTreeMap<u64, AgentBatch> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["type"] != "batch" {
            continue;
        }
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        let b = AgentBatch {
            seq: n("seq"),
            collectives: n("collectives"),
            ringbuf_drops: n("ringbuf_drops"),
            spool_drops: n("spool_drops"),
        };
        out.insert(b.seq, b);
    }
    out
}

/// Records of one kind in an agent's output.
pub fn agent_records(path: &Path, kind: &str) -> Vec<serde_json::Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

/// Batches a coordinator logged as ingested: (host, seq) → collectives.
pub fn coordinator_batches(log: &Path) -> BTreeMap<(String, u64), u64> {
    let text = fs::read_to_string(log).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("batch ingested")) {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .map(|v| v.trim_matches('"').to_owned())
        };
        let (Some(host), Some(seq), Some(colls)) =
            (field("host"), field("seq"), field("collectives"))
        else {
            continue;
        };
        // A reconnection preamble is logged as sequence 0 too, with no
        // collectives, and it comes first when the link went down before
        // the real batch 0 left the spool: the larger count is the batch's.
        let n: u64 = colls.parse().expect("collectives");
        out.entry((host, seq.parse().expect("seq")))
            .and_modify(|c: &mut u64| *c = (*c).max(n))
            .or_insert(n);
    }
    out
}

/// Every life's ingested batches without the agents' reconnection
/// preambles. Sequence 0 is both an agent's first batch and its preamble
/// (no records, replayed on every reconnection, to whichever life is up):
/// a sequence-0 line with collectives is batch 0; the record-less ones are
/// preambles, except the first of an agent whose batch 0 had none.
pub fn without_preambles(lives: &[Vec<Ingested>]) -> Vec<Vec<Ingested>> {
    let real0: std::collections::BTreeSet<&str> = lives
        .iter()
        .flatten()
        .filter(|b| b.seq == 0 && b.collectives > 0)
        .map(|b| b.agent.as_str())
        .collect();
    let mut empty0: std::collections::BTreeSet<String> = Default::default();
    let mut out = Vec::new();
    for life in lives {
        let mut kept = Vec::new();
        for b in life {
            let keep = b.seq != 0
                || b.collectives > 0
                || (!real0.contains(b.agent.as_str()) && empty0.insert(b.agent.clone()));
            if keep {
                kept.push(b.clone());
            }
        }
        out.push(kept);
    }
    out
}

/// One "batch ingested" line of a coordinator log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ingested {
    pub agent: String,
    pub host: String,
    pub seq: u64,
    pub collectives: u64,
}

/// Every batch a coordinator logged as ingested, in log order.
pub fn ingested_batches(log: &Path) -> Vec<Ingested> {
    batch_lines(log, "batch ingested")
}

/// Per coordinator life (their logs in order), the batches it ingested,
/// and those of them that no life logged.
///
/// A life journals a batch, then logs it, then answers it. One SIGKILLed
/// between the journal and the log line ingested a batch its log never
/// names; the agent, unanswered, sends it again, and the next life calls
/// it a duplicate ("duplicate batch ignored") from the dead life's
/// journal. Such a batch is counted once, in the life before the first
/// that called it a duplicate: a batch no life logged can only be known
/// from an earlier life's journal. (2 of 5 chaos runs beside a CPU hog
/// on one VM read it as lost.)
pub fn ingested_by_lives(logs: &[PathBuf]) -> (Vec<Vec<Ingested>>, Vec<Ingested>) {
    let mut lives: Vec<Vec<Ingested>> = logs.iter().map(|l| ingested_batches(l)).collect();
    let logged: std::collections::BTreeSet<(String, u64)> = lives
        .iter()
        .flatten()
        .map(|b| (b.agent.clone(), b.seq))
        .collect();
    let mut unlogged = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for k in 1..logs.len() {
        for d in batch_lines(&logs[k], "duplicate batch ignored") {
            let key = (d.agent.clone(), d.seq);
            if !logged.contains(&key) && seen.insert(key) {
                lives[k - 1].push(d.clone());
                unlogged.push(d);
            }
        }
    }
    (lives, unlogged)
}

/// The batches named by the coordinator log lines that contain `what`.
fn batch_lines(log: &Path, what: &str) -> Vec<Ingested> {
    let text = fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(what))
        .filter_map(|line| {
            let field = |k: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .map(|v| v.trim_matches('"').to_owned())
            };
            Some(Ingested {
                agent: field("agent")?,
                host: field("host")?,
                seq: field("seq")?.parse().ok()?,
                collectives: field("collectives")?.parse().ok()?,
            })
        })
        .collect()
}

/// The coordinator's `report.json` (written on exit and every `--write-every`).
pub fn report(dir: &Path) -> serde_json::Value {
    let text = fs::read_to_string(dir.join("report.json"))
        .unwrap_or_else(|e| panic!("{}/report.json: {e}", dir.display()));
    serde_json::from_str(&text).expect("report.json parses")
}

/// The report, or None while it is not there (or half-read).
pub fn try_report(dir: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&fs::read_to_string(dir.join("report.json")).ok()?).ok()
}

/// (rank, kind) of every verdict of the report.
pub fn verdict_ranks(report: &serde_json::Value) -> Vec<(u64, String)> {
    report["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| {
            let kind = v["kind"].to_string();
            v["rank"].as_u64().map(|r| (r, kind))
        })
        .collect()
}

/// Points of run-queue delay (share of wall time) a rank must have had over
/// its peers for its host verdict to be the load's doing, not the test's.
const CONTENTION_POINTS: f64 = 10.0;

/// (rank, kind) of every verdict of a job run healthy, except a host-slow
/// one whose own evidence shows the kernel kept that rank waiting for a
/// core well beyond its peers: the load these tests run beside (two busy
/// loops on a 2-vCPU host, `scripts/repeat-tests.sh`) can starve one rank
/// for many steps, and then it really is the rank the job waits for (one
/// run: 68% of wall time in the run queue against 49% on its peers, the
/// step 25% slower). Each one left out is printed as a `[fact]`.
pub fn verdicts_not_from_contention(report: &serde_json::Value) -> Vec<(u64, String)> {
    let (kept, starved) = split_contention(report);
    for (rank, x) in starved {
        eprintln!(
            "[fact] rank {rank}'s host verdict is the load beside the test: {x:.1} points more run-queue delay than its peers"
        );
    }
    kept
}

/// (rank, kind) of a verdict.
type Named = Vec<(u64, String)>;

/// The verdicts [`verdicts_not_from_contention`] keeps, and (rank, points
/// of run-queue delay over its peers) of those it leaves out.
fn split_contention(report: &serde_json::Value) -> (Named, Vec<(u64, f64)>) {
    let (mut kept, mut starved) = (Vec::new(), Vec::new());
    for v in report["verdicts"].as_array().into_iter().flatten() {
        let Some(rank) = v["rank"].as_u64() else {
            continue;
        };
        let excess = (v["kind"] == "host")
            .then(|| {
                v["evidence"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| run_queue_excess(e.as_str()?))
                    .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
            })
            .flatten()
            .filter(|x| *x >= CONTENTION_POINTS);
        match excess {
            Some(x) => starved.push((rank, x)),
            None => kept.push((rank, v["kind"].to_string())),
        }
    }
    (kept, starved)
}

/// From "run-queue delay 68.2% of wall time vs 49.1% on peers: …", 19.1.
fn run_queue_excess(line: &str) -> Option<f64> {
    let rest = line.strip_prefix("run-queue delay ")?;
    let (own, rest) = rest.split_once("% of wall time vs ")?;
    let (peers, _) = rest.split_once("% on peers")?;
    Some(own.trim().parse::<f64>().ok()? - peers.trim().parse::<f64>().ok()?)
}

#[test]
fn a_starved_ranks_host_verdict_is_told_from_others() {
    let r = serde_json::json!({"verdicts": [
        {"rank": 2, "kind": "host", "evidence": ["arrives 9 ms late", "run-queue delay 68.2% of wall time vs 49.1% on peers: CPU contention"]},
        {"rank": 3, "kind": "host", "evidence": ["run-queue delay 52.0% of wall time vs 49.1% on peers: CPU contention"]},
        {"rank": 5, "kind": "compute", "evidence": ["run-queue delay 90.0% of wall time vs 10.0% on peers: CPU contention"]},
    ]});
    // The split, not the printing function: a `[fact]` from this test
    // would read as a starved rank in every fault test's run.
    let (kept, starved) = split_contention(&r);
    assert_eq!(
        kept,
        vec![(3, "\"host\"".to_owned()), (5, "\"compute\"".to_owned())]
    );
    assert_eq!(starved.len(), 1);
    assert_eq!(starved[0].0, 2);
    assert!((starved[0].1 - 19.1).abs() < 1e-9, "{starved:?}");
}

/// Blocks until the first life has kept both hosts' clock models and the
/// job's pace (its baseline steps) in `--out`.
pub fn wait_kept_state(job: &Job) {
    let clocks = job.dir.join("clocks.json");
    job.wait_for(
        Duration::from_secs(120),
        "kept both hosts' clock models",
        || fs::read_to_string(&clocks).is_ok_and(|t| t.contains("host-0") && t.contains("host-1")),
    );
    let baselines = job.dir.join("baselines.json");
    job.wait_for(
        Duration::from_secs(120),
        "kept the job's baseline steps",
        || {
            fs::read(&baselines)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .is_some_and(|v| {
                    v["pace"]["baseline"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty())
                })
        },
    );
}
