//! Rank discovery on real processes: a rank found from its environment, its
//! exit noticed, and an elastic restart (new pid, new restart count) seen as
//! an exit plus a new rank. No eBPF, no root needed.

use std::{
    process::{Child, Command},
    time::{Duration, Instant},
};

use slowrank_agent::discover::{Changes, Scanner};

fn rank_proc(marker: &str, restart: u32) -> Child {
    Command::new("sleep")
        .arg("30")
        .env("RANK", "5")
        .env("LOCAL_RANK", "1")
        .env("WORLD_SIZE", "8")
        .env("GROUP_RANK", "1")
        .env("TORCHELASTIC_RUN_ID", "job-x")
        .env("TORCHELASTIC_RESTART_COUNT", restart.to_string())
        .env("SLOWRANK_TEST_MARKER", marker)
        .spawn()
        .expect("spawn sleep")
}

/// Scans until `done` says the changes so far are complete (or 5 s).
fn scan_until(s: &mut Scanner, done: impl Fn(&Changes) -> bool) -> Changes {
    let mut all = Changes::default();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let c = s.scan(1).expect("scan");
        all.new.extend(c.new);
        all.gone.extend(c.gone);
        all.foreign.extend(c.foreign);
        if done(&all) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    all
}

#[test]
fn rank_found_exit_noticed_and_restart_is_a_new_rank() {
    let marker = format!("restart-{}", std::process::id());
    let mut s = Scanner::new(&[format!("SLOWRANK_TEST_MARKER={marker}")], None).unwrap();
    let mut first = rank_proc(&marker, 0);
    let c = scan_until(&mut s, |c| !c.new.is_empty());
    assert_eq!(c.new.len(), 1);
    let id = &c.new[0].identity;
    assert_eq!(id.pid, first.id());
    assert_eq!(
        (id.rank, id.local_rank, id.world_size, id.group_rank),
        (5, 1, 8, 1)
    );
    assert_eq!((id.restart_count, id.job_id.as_str()), (0, "job-x"));

    // The elastic agent kills the worker and starts a new one.
    first.kill().unwrap();
    first.wait().unwrap();
    let mut second = rank_proc(&marker, 1);
    let c = scan_until(&mut s, |c| !c.gone.is_empty() && !c.new.is_empty());
    assert_eq!(c.gone.len(), 1);
    assert_eq!(c.gone[0].identity.pid, first.id());
    assert_eq!(c.new.len(), 1);
    assert_eq!(c.new[0].identity.pid, second.id());
    assert_eq!(c.new[0].identity.restart_count, 1);
    second.kill().unwrap();
    second.wait().unwrap();
    let c = scan_until(&mut s, |c| !c.gone.is_empty());
    assert_eq!(c.gone.len(), 1);
    assert_eq!(s.ranks().count(), 0);
}

#[test]
fn only_descendants_of_the_wrapped_command() {
    let marker = format!("tree-{}", std::process::id());
    // Root = our parent's pid 1? Use a pid that is not an ancestor of the
    // child: the child of this test is not a descendant of pid 2 (kthreadd).
    let mut s = Scanner::new(&[format!("SLOWRANK_TEST_MARKER={marker}")], Some(2)).unwrap();
    let mut p = rank_proc(&marker, 0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        s.scan(1).unwrap().new.is_empty(),
        "a process outside the wrapped tree was taken"
    );
    s.set_root(std::process::id());
    // The verdict for (pid, start) was remembered; the periodic full
    // re-check picks the process up once it is in the tree.
    let c = scan_until(&mut s, |c| !c.new.is_empty());
    assert_eq!(c.new.len(), 1);
    p.kill().unwrap();
    p.wait().unwrap();
}
