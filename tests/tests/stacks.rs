//! Issue 6 acceptance: real eBPF stack sampling of a running scenario, folded
//! per rank, diffed against the median healthy rank of the same role.
//!
//! Needs root (skips loudly without; panics under CI=true). Builds the
//! scenario binaries, and the trainer with frame pointers in its own target
//! directory (`target/fp`) so the workspace is not rebuilt.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use slowrank_agent::{stack_collector::StackCollector, stacks::StackConfig};
use slowrank_coordinator::verdict::flame::{self, DiffRequest, FlameRef, Threads};
use slowrank_shared::wire::{StackView, StackWindow};

fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI must run as root so the eBPF stack programs are really exercised");
    }
    eprintln!("\n*** SKIPPED {test}: not root, cannot load eBPF. Run as root to exercise stack sampling. ***\n");
    false
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Builds `slowrank-scenario` (normal target dir) and a frame-pointer
/// trainer (`target/fp`); returns their paths.
fn build() -> (PathBuf, PathBuf) {
    let ws = workspace();
    let cargo = env!("CARGO");
    let st = Command::new(cargo)
        .current_dir(&ws)
        .args(["build", "-q", "-p", "slowrank-scenarios"])
        .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback")
        .status()
        .expect("run cargo");
    assert!(st.success(), "cargo build -p slowrank-scenarios failed");
    let st = Command::new(ws.join("scenarios/build-fp-trainer.sh"))
        .current_dir(&ws)
        .env("CARGO", cargo)
        .status()
        .expect("run scenarios/build-fp-trainer.sh");
    assert!(st.success(), "building the frame-pointer trainer failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| ws.join("target"));
    (
        target.join("debug/slowrank-scenario"),
        target.join("fp/debug/slowrank-trainer"),
    )
}

/// Rank processes of the run whose libraries live in `lib_dir`: RANK from
/// /proc/PID/environ, as the agent finds them.
fn rank_pids(lib_dir: &str) -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let mut rank = None;
        let mut ours = false;
        for kv in env.split(|&b| b == 0) {
            let kv = String::from_utf8_lossy(kv);
            if let Some(v) = kv.strip_prefix("RANK=") {
                rank = v.parse().ok();
            }
            if kv.starts_with("LD_LIBRARY_PATH=") && kv.contains(lib_dir) {
                ours = true;
            }
        }
        if let (Some(r), true) = (rank, ours) {
            out.insert(r, pid);
        }
    }
    out
}

/// The mapped file whose name ends with `suffix`, from /proc/PID/maps.
fn mapped(pid: u32, suffix: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with(suffix))
        .map(PathBuf::from)
}

struct Sampled {
    windows: Vec<StackWindow>,
    onset_ns: u64,
    end_ns: u64,
    ranks: BTreeMap<u32, u32>,
}

/// One scenario at a time: two 4-rank jobs plus two symbolizers on a small
/// machine starve each other (ring-buffer drops, distorted steps).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `spec` with the stack sampler attached to every rank. With `trace`,
/// the run logs every collective's GPU-side arrival and completion, which
/// stand in for the agent's verbs fold (first send / last completion) as
/// the launch view's collective progress marks; then everything is folded
/// into one window at the end.
fn sample(name: &str, spec: &str, config: StackConfig, trace: bool) -> Sampled {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let world = spec
        .lines()
        .find_map(|l| l.strip_prefix("dp = "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .expect("dp-only spec: dp = N");
    let (scenario, trainer) = build();
    let out = workspace().join("target/stacks-test").join(name);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let spec_path = out.join("spec.in.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let run_dir = out.join("run");
    let lib_dir = run_dir.join("lib").display().to_string();

    let mut stacks =
        StackCollector::start(config, true, mono_ns()).expect("load and attach the stack programs");
    let mut cmd = Command::new(&scenario);
    cmd.args([
        "run",
        spec_path.to_str().unwrap(),
        "--no-agent",
        "--timeout",
        "120",
    ]);
    if trace {
        cmd.arg("--trace");
    }
    let mut child: Child = cmd
        .arg("--out")
        .arg(&run_dir)
        .arg("--trainer")
        .arg(&trainer)
        .spawn()
        .expect("start slowrank-scenario");
    let mut followed: HashMap<u32, u32> = HashMap::new();
    let mut windows = Vec::new();
    let mut last_cut = Instant::now();
    let mut max_off_threads = 0;
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let done = child.try_wait().expect("wait for scenario").is_some();
        for (rank, pid) in rank_pids(&lib_dir) {
            if followed.contains_key(&pid) {
                continue;
            }
            // Follow once the CUDA runtime is mapped (dlopen'ed at start), so
            // the symbolizer caches the maps with it.
            let Some(cudart) = mapped(pid, "libcudart.so.12") else {
                continue;
            };
            match stacks.follow(pid, rank, Some(&cudart)) {
                Ok(()) => {
                    followed.insert(pid, rank);
                }
                Err(e) => eprintln!("rank {rank} pid {pid} not followed yet: {e}"),
            }
        }
        // Find every rank before the first (cold, slow) symbolization so
        // none starts unobserved.
        if followed.len() < world {
            std::thread::sleep(Duration::from_millis(5));
            if !done {
                assert!(Instant::now() < deadline, "ranks not found");
                continue;
            }
        }
        stacks.poll();
        max_off_threads = max_off_threads.max(stacks.off_cpu_threads().unwrap());
        if !trace && last_cut.elapsed() > Duration::from_secs(1) {
            let now = mono_ns();
            windows.extend(stacks.cut(now, now));
            last_cut = Instant::now();
        }
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "scenario did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    stacks.poll();
    if trace {
        for (&pid, &rank) in &followed {
            let log = std::fs::read_to_string(run_dir.join(format!("sim/coll-rank-{rank}.log")))
                .expect("collective trace");
            let mut marks = 0;
            for l in log.lines() {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                // `key host arrive release done [finished]`: later columns
                // may be added; the first four are fixed.
                if let [host, arrive, _release, done, ..] = v[..] {
                    stacks.gpu_collective(pid, host, arrive, Some(done));
                    marks += 1;
                }
            }
            assert!(
                marks > 0,
                "rank {rank}: no collective line parsed from the trace"
            );
        }
    }
    windows.extend(stacks.cut(mono_ns(), u64::MAX));
    let c = stacks.counters().unwrap();
    eprintln!(
        "{name}: counters {c:?}; followed {followed:?}; unknown-pid records {}; bad records {}",
        stacks.unknown_pid_records(),
        stacks.bad_records
    );
    assert_eq!(stacks.bad_records, 0);
    assert_eq!(c.ringbuf_drops, 0, "ring buffer drops: {c:?}");
    assert_eq!(c.queue_drops, 0, "drain queue drops: {c:?}");
    assert!(c.on_cpu > 0 && c.off_cpu > 0, "no samples: {c:?}");
    assert!(
        max_off_threads >= 4,
        "off-CPU state of running threads: {max_off_threads}; {c:?}; followed {followed:?}"
    );
    // Every rank thread exited; their off-CPU slots must be gone too.
    assert_eq!(stacks.off_cpu_threads().unwrap(), 0, "off-CPU state leaked");

    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("truth.json")).expect("truth.json"))
            .unwrap();
    let w = &truth["faults"][0]["windows"][0];
    let onset_ns = w["onset_mono_ns"].as_u64().expect("fault onset");
    let end_ns = w["end_mono_ns"].as_u64().unwrap_or(u64::MAX);
    let ranks = followed.into_iter().map(|(p, r)| (r, p)).collect();
    Sampled {
        windows,
        onset_ns,
        end_ns,
        ranks,
    }
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn diff(s: &Sampled, flagged: u32, view: StackView, threads: Threads, name: &str) -> FlameRef {
    let cands = flame::same_role(flagged, 1, 1, s.ranks.len() as u32);
    let out_dir = workspace()
        .join("target/stacks-test")
        .join(name)
        .join("flame");
    let f = flame::diff(&DiffRequest {
        windows: &s.windows,
        flagged,
        candidates: &cands,
        view,
        start_ns: s.onset_ns,
        end_ns: s.end_ns,
        out_dir: &out_dir,
        top: 8,
        threads,
    })
    .expect("diff flame graph");
    eprintln!("{name}: {}", serde_json::to_string_pretty(&f).unwrap());
    f
}

const DATALOADER: &str = r#"
name = "stacks-host-slow-dataloader"
description = "dp4: rank 2's data loader takes 8 ms longer from iteration 5"
seed = 21
iterations = 70
hosts = 2
ranks_per_host = 2

[parallel]
tp = 1
pp = 1
dp = 4

[step]
jitter = 0.05

[[fault]]
kind = "host"
rank = 2
function = "load_batch"
delay_us = 8000
start_iteration = 5
"#;

#[test]
fn host_slow_dataloader_top_differing_frame_is_load_batch() {
    if !root_or_skip("host_slow_dataloader_top_differing_frame_is_load_batch") {
        return;
    }
    let s = sample("dataloader", DATALOADER, StackConfig::DEEP, false);
    assert_eq!(s.ranks.len(), 4, "all ranks followed: {:?}", s.ranks);
    let f = diff(&s, 2, StackView::Cpu, Threads::Main, "dataloader");
    let top = &f.top_frames[0];
    assert!(
        top.frame.contains("load_batch"),
        "top differing frame should name the data loader, got {top:#?}"
    );
    assert!(top.flagged_share > top.reference_share);
    // Frame pointers (scenarios/build-fp-trainer.sh) carry the walk above
    // the leaf into the training loop.
    assert!(
        top.path.contains("train_step"),
        "shallow stack: {}",
        top.path
    );
    for svg in [&f.diff_svg, &f.flagged_svg, &f.reference_svg] {
        let text = std::fs::read_to_string(svg).unwrap();
        assert!(
            text.starts_with("<?xml") && text.contains("<svg"),
            "{svg} is not an SVG"
        );
    }
    // The healthy side may have no sample in its 0.5 ms data loader at all.
    for svg in [&f.diff_svg, &f.flagged_svg] {
        let text = std::fs::read_to_string(svg).unwrap();
        assert!(
            text.contains("load_batch"),
            "{svg} does not show load_batch"
        );
    }
}

const COMPUTE: &str = r#"
name = "stacks-compute-slow"
description = "dp4: rank 1's GPU runs 1.5x slower from iteration 5"
seed = 7
iterations = 70
hosts = 2
ranks_per_host = 2

[parallel]
tp = 1
pp = 1
dp = 4

[step]
jitter = 0.05

[[fault]]
kind = "compute"
rank = 1
factor = 1.5
start_iteration = 5
"#;

#[test]
fn compute_slow_launch_view_shows_gpu_frames_growing_not_cpu_frames() {
    if !root_or_skip("compute_slow_launch_view_shows_gpu_frames_growing_not_cpu_frames") {
        return;
    }
    let s = sample("compute", COMPUTE, StackConfig::DEEP, true);
    assert_eq!(s.ranks.len(), 4, "all ranks followed: {:?}", s.ranks);
    let launch = diff(&s, 1, StackView::Launch, Threads::All, "compute");
    let cpu = diff(&s, 1, StackView::Cpu, Threads::Main, "compute");
    let gpu = &launch.top_frames[0];
    assert!(
        gpu.frame.starts_with("GPU:"),
        "launch view top frame: {gpu:#?}"
    );
    assert!(
        gpu.flagged_share > 1.2 * gpu.reference_share,
        "the slow GPU's kernels should take a larger share of the window: {gpu:#?}"
    );
    // The launching code (CPU frames) is the same on both sides: every launch
    // site has the same number of launches, so the CPU view of the main
    // thread differs far less than the GPU time does.
    let cpu_gain = cpu.top_frames.first().map_or(0.0, |t| t.gain);
    assert!(
        cpu_gain < gpu.gain,
        "CPU frames should not grow like the GPU frames: cpu {:#?} vs gpu {gpu:#?}",
        cpu.top_frames.first()
    );
}
