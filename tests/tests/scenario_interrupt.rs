//! A launcher that is stopped leaves nothing behind: `slowrank-scenario run`
//! in agent mode, stopped with SIGTERM (at whatever point it has reached:
//! agents attaching, ranks running) or killed outright with SIGKILL, takes
//! its coordinator, its agents and its ranks down with it. Before, a SIGTERM
//! while an agent attached killed the launcher alone, and its coordinator
//! and agent ran on for nobody.

mod faultkit;

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// `slowrank-scenario`, next to this test binary's directory (cargo builds
/// the bins of a package whose integration tests it builds).
fn scenario_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("slowrank-scenario");
    assert!(
        bin.exists(),
        "{} missing: cargo build -p slowrank-scenarios --bins",
        bin.display()
    );
    bin
}

/// `(ppid, flags)` of `pid` from /proc, or None once it is gone.
fn stat(pid: u32) -> Option<(u32, u64, char)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces: fields start after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    Some((f.get(1)?.parse().ok()?, f.get(6)?.parse().ok()?, state))
}

/// Every descendant of `root` alive now.
fn descendants(root: u32) -> BTreeSet<u32> {
    let mut parent = Vec::new();
    for e in fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() {
            if let Some((ppid, _, _)) = stat(pid) {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (c, pp) in &parent {
            if *pp == p && out.insert(*c) {
                frontier.push(*c);
            }
        }
    }
    out
}

fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Gone, a zombie, or on its way out (PF_EXITING): a SIGKILLed agent may
/// spend many seconds detaching its uprobes, but it no longer runs.
fn ended(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    match stat(pid) {
        None => true,
        Some((_, flags, state)) => state == 'Z' || state == 'X' || flags & PF_EXITING != 0,
    }
}

struct Launcher {
    child: Child,
    dir: PathBuf,
}

impl Launcher {
    fn start(name: &str) -> Launcher {
        let dir = std::env::temp_dir().join(format!("slowrank-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/tp2-pp2-dp2-small.toml");
        let log = fs::File::create(std::env::temp_dir().join(format!("{name}.log"))).expect("log");
        let child = Command::new(scenario_bin())
            .arg("run")
            .arg(&spec)
            .arg("--out")
            .arg(&dir)
            // Long enough that the signal always lands mid-run.
            .args(["--iterations", "100000", "--timeout", "300"])
            .stdout(Stdio::from(log.try_clone().expect("dup")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start slowrank-scenario");
        Launcher { child, dir }
    }

    /// Waits until a process named `name` runs below the launcher.
    /// A launcher whose ranks run, and every process under it then (its
    /// services and ranks, once the ranks are up).
    fn running(name: &str) -> (Launcher, BTreeSet<u32>) {
        let mut l = Launcher::start(name);
        l.wait_for("slowrank-traine");
        std::thread::sleep(Duration::from_secs(1));
        let seen = descendants(l.child.id());
        (l, seen)
    }

    fn wait_for(&mut self, name: &str) -> BTreeSet<u32> {
        let t0 = Instant::now();
        loop {
            let d = descendants(self.child.id());
            if d.iter().any(|p| comm(*p).starts_with(name)) {
                return d;
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!(
                    "the launcher exited ({s}) before {name} started; see {}",
                    self.dir.display()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(240),
                "{name} never started below the launcher"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Signals the launcher; returns how long it took to exit.
    fn signal_and_wait(&mut self, sig: i32, limit: Duration) -> Duration {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < limit,
                "the launcher did not exit after signal {sig}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Asserts every process in `seen` has ended, allowing the kernel `limit`
/// to deliver the parent-death signal on a loaded machine.
fn assert_all_ended(seen: &BTreeSet<u32>, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let left: Vec<String> = seen
            .iter()
            .filter(|p| !ended(**p))
            .map(|p| format!("{p} ({})", comm(*p)))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "left running after the launcher ended: {}",
            left.join(", ")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_while_an_agent_attaches_stops_every_service() {
    if !faultkit::root_or_skip("sigterm_while_an_agent_attaches_stops_every_service") {
        return;
    }
    let mut l = Launcher::start("interrupt-attach");
    // The coordinator starts first, then each agent (attaching takes
    // seconds): signal as soon as the first agent exists.
    let seen = l.wait_for("slowrank-agent");
    assert!(
        seen.iter().any(|p| comm(*p) == "slowrank"),
        "no coordinator below the launcher: {seen:?}"
    );
    // Agents flush their spool (≤ 20 s), the coordinator gets 10 s.
    l.signal_and_wait(libc::SIGTERM, Duration::from_secs(90));
    assert_all_ended(&seen, Duration::from_secs(30));
}

#[test]
fn sigterm_while_ranks_run_stops_every_service() {
    if !faultkit::root_or_skip("sigterm_while_ranks_run_stops_every_service") {
        return;
    }
    let (mut l, seen) = Launcher::running("interrupt-ranks");
    l.signal_and_wait(libc::SIGTERM, Duration::from_secs(90));
    assert!(
        l.dir.join("truth.json").exists(),
        "an interrupted run still writes its truth"
    );
    assert_all_ended(&seen, Duration::from_secs(30));
}

#[test]
fn sigkill_of_the_launcher_takes_its_services_down() {
    if !faultkit::root_or_skip("sigkill_of_the_launcher_takes_its_services_down") {
        return;
    }
    let (mut l, seen) = Launcher::running("interrupt-kill");
    l.signal_and_wait(libc::SIGKILL, Duration::from_secs(10));
    // Nothing flushes here: the kernel's parent-death signal does it all.
    assert_all_ended(&seen, Duration::from_secs(30));
}
