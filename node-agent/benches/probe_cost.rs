//! Cost per probed call and the agent's own CPU use, printed as JSON.
//!
//! A tight loop calls the stand-in `ncclAllReduce` (with an invalid
//! reduction op, so the call itself returns at once and the loop measures
//! the probes, not NCCL) under, in one run:
//!   - no probes;
//!   - bpftrace with empty uprobe + uretprobe bodies (the kernel's floor);
//!   - bpftrace timestamping entry and return into its output buffer;
//!   - slowrank's own NCCL collective probe pair (entry with stack words +
//!     return), followed via the FOLLOWED map, drained by a thread.
//!
//! Then a paced load of 10,000 collectives/s and 100,000 `cudaLaunchKernel`
//! calls/s (counted in-kernel) for a few seconds, measuring the CPU time of
//! the thread that drains and folds (the agent's user-space work).
//!
//! Run as root: `cargo bench -p slowrank-agent --bench probe_cost`
//! (needs the stand-ins built: `cargo build -p slowrank-scenarios`).

use std::{
    ffi::{c_void, CString},
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use slowrank_agent::{
    catalog::{default_set, Role},
    clock::{mono_ns, HostClock},
    discover::LibKind,
    fold::{Folder, Limits},
    probes::{Attach, Probes, RawEvent},
};
use slowrank_shared::{probe::cuda_count, wire::RankIdentity};

type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    i32,
    i32,
    *mut c_void,
    *mut c_void,
) -> i32;
#[repr(C)]
#[derive(Clone, Copy)]
struct Dim3 {
    x: u32,
    y: u32,
    z: u32,
}
type LaunchKernel =
    unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, *mut c_void) -> i32;

const CALLS: usize = 200_000;
const REPS: usize = 5;

fn find_lib(artifact: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let mut dirs: Vec<PathBuf> = std::env::var_os("SLOWRANK_STANDIN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    for a in exe.ancestors().skip(1).take(3) {
        dirs.push(a.to_path_buf());
        dirs.push(a.join("debug"));
        dirs.push(a.join("release"));
    }
    dirs.into_iter()
        .map(|d| d.join(artifact))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{artifact} not found: cargo build -p slowrank-scenarios"))
}

unsafe fn sym<T: Copy>(lib: &std::path::Path, name: &str) -> T {
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a stand-in library; RTLD_NOW resolves everything up front.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "dlopen {}", lib.display());
    let n = CString::new(name).unwrap();
    // SAFETY: symbol lookup in a live handle.
    let p = unsafe { libc::dlsym(h, n.as_ptr()) };
    assert!(!p.is_null(), "{name} not in {}", lib.display());
    // SAFETY: the caller names the right function type.
    unsafe { std::mem::transmute_copy(&p) }
}

/// Median ns per call over REPS loops of CALLS calls.
fn per_call(f: AllReduce) -> f64 {
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                // SAFETY: op -1 is rejected before any pointer is used.
                std::hint::black_box(unsafe {
                    f(
                        std::ptr::null(),
                        std::ptr::null_mut(),
                        1,
                        7,
                        -1,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                });
            }
            t.elapsed().as_nanos() as f64 / CALLS as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[REPS / 2]
}

/// Runs `f` while a bpftrace script is attached.
fn with_bpftrace(script: &str, f: impl FnOnce() -> f64) -> Option<f64> {
    let mut child = Command::new("bpftrace")
        .arg("-e")
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Drain bpftrace's output so it never blocks; say when it attached.
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let mut told = false;
        while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if !told && line.starts_with("Attaching") {
                let _ = tx.send(());
                told = true;
            }
            line.clear();
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        return None;
    }
    std::thread::sleep(Duration::from_millis(200));
    let r = f();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
    Some(r)
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid clock id and out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("{{\"skipped\": \"needs root to load eBPF\"}}");
        return;
    }
    let nccl = std::fs::canonicalize(find_lib("libslowrank_standin_nccl.so")).unwrap();
    let cudart = std::fs::canonicalize(find_lib("libslowrank_standin_cudart.so")).unwrap();
    // SAFETY: exported C functions with these signatures.
    let allreduce: AllReduce = unsafe { sym(&nccl, "ncclAllReduce") };
    // SAFETY: as above.
    let launch: LaunchKernel = unsafe { sym(&cudart, "cudaLaunchKernel") };
    let pid = std::process::id();
    let lib = nccl.display().to_string();

    let plain = per_call(allreduce);
    let bpf_empty = with_bpftrace(
        &format!("uprobe:{lib}:ncclAllReduce {{ }} uretprobe:{lib}:ncclAllReduce {{ }}"),
        || per_call(allreduce),
    );
    let bpf_ts = with_bpftrace(
        &format!(
            "uprobe:{lib}:ncclAllReduce /pid == {pid}/ {{ printf(\"E %d %llu\\n\", tid, nsecs); }} \
             uretprobe:{lib}:ncclAllReduce /pid == {pid}/ {{ printf(\"R %d %llu %d\\n\", tid, nsecs, retval); }}"
        ),
        || per_call(allreduce),
    );

    // slowrank: the agent's collective probe pair, drained by a thread.
    let mut probes = Probes::load().expect("load eBPF");
    let spec = default_set(LibKind::Nccl)
        .iter()
        .find(|s| s.symbol == "ncclAllReduce")
        .unwrap();
    let ar_id = probes.attach_as(&nccl, "ncclAllReduce", spec.how).unwrap();
    let lk_id = probes
        .attach_as(
            &cudart,
            "cudaLaunchKernel",
            Attach::Count {
                class: cuda_count::LAUNCH,
            },
        )
        .unwrap();
    probes.follow(pid, Some(0)).unwrap();
    let probes = Arc::new(Mutex::new(probes));
    let stop = Arc::new(AtomicBool::new(false));
    let drained = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let spawn_drainer = |fold: bool| {
        let (probes, stop, drained) = (probes.clone(), stop.clone(), drained.clone());
        std::thread::spawn(move || {
            let mut folder = Folder::new(HostClock::real(), Limits::default());
            folder.set_role(ar_id, spec.role);
            folder.set_role(lk_id, Role::Count);
            folder.add_rank(
                RankIdentity {
                    pid,
                    rank: 0,
                    world_size: 1,
                    local_rank: 0,
                    local_world_size: 1,
                    group_rank: 0,
                    restart_count: 0,
                    job_id: String::new(),
                    seen_ns: 0,
                },
                mono_ns(),
            );
            let mut ev: Vec<RawEvent> = Vec::new();
            let t0 = thread_cpu_ns();
            let mut last_counts = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                {
                    let mut p = probes.lock().unwrap();
                    let n = p.drain_raw(&mut ev).records;
                    drained.fetch_add(n as u64, Ordering::Relaxed);
                    if fold && last_counts.elapsed() >= Duration::from_millis(200) {
                        last_counts = Instant::now();
                        let c = p.cuda_counts().unwrap();
                        folder.launch_counts(&c);
                        folder.close_intervals(mono_ns(), |pid| {
                            slowrank_agent::sched::SchedStat::read(pid).ok()
                        });
                    }
                }
                if fold {
                    folder.feed(&mut ev);
                    let _ = folder.take();
                }
                ev.clear();
                std::thread::sleep(Duration::from_millis(5));
            }
            thread_cpu_ns() - t0
        })
    };
    let drainer = spawn_drainer(false);
    let slowrank = per_call(allreduce);
    stop.store(true, Ordering::Relaxed);
    drainer.join().unwrap();
    let drops = probes.lock().unwrap().counters().unwrap().ringbuf_drops;

    // Agent CPU at 10k collectives/s + 100k launches/s.
    stop.store(false, Ordering::Relaxed);
    drained.store(0, Ordering::Relaxed);
    let drainer = spawn_drainer(true);
    let secs = 3.0;
    let t0 = Instant::now();
    let (mut colls, mut launches) = (0u64, 0u64);
    let dim = Dim3 { x: 1, y: 1, z: 1 };
    while t0.elapsed().as_secs_f64() < secs {
        // One millisecond's worth: 10 collectives, 100 launches.
        let slot = Instant::now();
        for i in 0..100 {
            // SAFETY: a null function is rejected before anything is used.
            std::hint::black_box(unsafe {
                launch(
                    std::ptr::null(),
                    dim,
                    dim,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                )
            });
            launches += 1;
            if i % 10 == 0 {
                // SAFETY: as in per_call.
                std::hint::black_box(unsafe {
                    allreduce(
                        std::ptr::null(),
                        std::ptr::null_mut(),
                        1,
                        7,
                        -1,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                });
                colls += 1;
            }
        }
        while slot.elapsed() < Duration::from_millis(1) {
            std::hint::spin_loop();
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let cpu_ns = drainer.join().unwrap();
    let counted: u64 = probes
        .lock()
        .unwrap()
        .cuda_counts()
        .unwrap()
        .iter()
        .map(|(_, c)| c[0])
        .sum();

    let j = serde_json::json!({
        "calls_per_loop": CALLS,
        "reps": REPS,
        "ns_per_call": {
            "no_probe": plain,
            "bpftrace_empty": bpf_empty,
            "bpftrace_timestamps": bpf_ts,
            "slowrank": slowrank,
        },
        "overhead_ns_per_entry_return_pair": {
            "bpftrace_empty": bpf_empty.map(|v| v - plain),
            "bpftrace_timestamps": bpf_ts.map(|v| v - plain),
            "slowrank": slowrank - plain,
        },
        "slowrank_ringbuf_drops": drops,
        "agent_cpu": {
            "seconds": wall,
            "collectives_per_s": colls as f64 / wall,
            "launches_per_s": launches as f64 / wall,
            "launches_counted_in_kernel": counted,
            "events_drained": drained.load(Ordering::Relaxed),
            "drain_fold_thread_cpu_percent_of_one_core": cpu_ns as f64 / 1e9 / wall * 100.0,
        }
    });
    println!("{}", serde_json::to_string_pretty(&j).unwrap());
}
