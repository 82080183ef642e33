//! GPU time per launch site, estimated from host-visible progress marks.
//!
//! A launch returns at once (the GPU runs it later), so a launch's cost on
//! the GPU is not visible at the call. What is visible is when the GPU
//! provably got past a point in its queue:
//! - a CUDA sync call returned → everything enqueued before the call is done;
//! - a collective's GPU-side arrival (the proxy's first send, from the verbs
//!   fold) → everything enqueued on the compute stream before the collective
//!   call is done ([`GpuTimer::collective`]).
//!
//! Between two consecutive marks the GPU was busy with the launches the
//! later mark covers; that interval is split evenly over them. The interval
//! starts no earlier than the previous mark, the first covered launch and
//! the completion of the last collective done before the mark (time spent
//! waiting for peers in a collective is not compute). A slower GPU thus
//! shows as larger `GPU:<kernel>` weights under unchanged launch sites.
//! Launches no mark covers yet stay pending (bounded) until one does.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

/// Pending launches kept per process before the oldest are dropped.
pub const MAX_PENDING: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    /// When the GPU was known to be past `before_ns`.
    reached_ns: u64,
    /// Launches enqueued before this time are done.
    before_ns: u64,
    /// Collective marks: when the collective completed, if known.
    done_ns: Option<u64>,
}

struct Pending {
    ts_ns: u64,
    frames: Vec<Arc<str>>,
}

#[derive(Default)]
struct PidState {
    launches: VecDeque<Pending>,
    marks: Vec<Mark>,
    sync_calls: HashMap<u32, u64>,
    last_reached_ns: u64,
    last_done_ns: u64,
}

/// A settled launch: its frames and estimated GPU time (µs).
pub struct Settled {
    pub pid: u32,
    pub frames: Vec<Arc<str>>,
    pub gpu_us: f64,
}

#[derive(Default)]
pub struct GpuTimer {
    pids: HashMap<u32, PidState>,
    /// Launches dropped because their process had too many pending.
    pub dropped: u64,
}

impl GpuTimer {
    pub fn launch(&mut self, pid: u32, ts_ns: u64, frames: Vec<Arc<str>>) {
        let st = self.pids.entry(pid).or_default();
        if st.launches.len() >= MAX_PENDING {
            st.launches.pop_front();
            self.dropped += 1;
        }
        st.launches.push_back(Pending { ts_ns, frames });
    }

    pub fn sync_call(&mut self, pid: u32, tid: u32, ts_ns: u64) {
        self.pids
            .entry(pid)
            .or_default()
            .sync_calls
            .insert(tid, ts_ns);
    }

    pub fn sync_return(&mut self, pid: u32, tid: u32, ts_ns: u64) {
        let st = self.pids.entry(pid).or_default();
        if let Some(call) = st.sync_calls.remove(&tid) {
            st.marks.push(Mark {
                reached_ns: ts_ns,
                before_ns: call,
                done_ns: None,
            });
        }
    }

    /// The GPU of `pid` reached a collective enqueued at `enqueued_ns` at
    /// `reached_ns` (GPU-side arrival) and completed it at `done_ns`.
    pub fn collective(
        &mut self,
        pid: u32,
        enqueued_ns: u64,
        reached_ns: u64,
        done_ns: Option<u64>,
    ) {
        self.pids.entry(pid).or_default().marks.push(Mark {
            reached_ns,
            before_ns: enqueued_ns,
            done_ns,
        });
    }

    /// Splits the GPU time of every mark reached by `upto_ns` over the
    /// launches it covers.
    pub fn settle(&mut self, upto_ns: u64) -> Vec<Settled> {
        let mut out = Vec::new();
        for (&pid, st) in &mut self.pids {
            st.marks.sort_by_key(|m| m.reached_ns);
            let ready = st.marks.partition_point(|m| m.reached_ns <= upto_ns);
            let marks: Vec<Mark> = st.marks.drain(..ready).collect();
            for m in marks {
                let n = st
                    .launches
                    .iter()
                    .take_while(|l| l.ts_ns < m.before_ns)
                    .count();
                if n > 0 {
                    let first = st.launches[0].ts_ns;
                    let start = st.last_reached_ns.max(first).max(st.last_done_ns);
                    let per = m.reached_ns.saturating_sub(start) as f64 / 1e3 / n as f64;
                    for l in st.launches.drain(..n) {
                        out.push(Settled {
                            pid,
                            frames: l.frames,
                            gpu_us: per,
                        });
                    }
                    st.last_reached_ns = st.last_reached_ns.max(m.reached_ns);
                }
                if let Some(d) = m.done_ns {
                    st.last_done_ns = st.last_done_ns.max(d);
                }
            }
        }
        out
    }

    /// Forgets a process (exited and settled).
    pub fn forget(&mut self, pid: u32) {
        self.pids.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Vec<Arc<str>> {
        vec![Arc::from(s)]
    }

    #[test]
    fn splits_busy_time_between_marks() {
        let mut g = GpuTimer::default();
        // Two kernels launched at 0 and 1; the GPU reaches a collective
        // enqueued at 2 at time 100: 50 each. Then one more at 3, a sync
        // called at 4 returns at 130: it ran from 100 to 130.
        g.launch(1, 0, f("a"));
        g.launch(1, 1_000, f("a"));
        g.launch(1, 3_000, f("b"));
        g.collective(1, 2_000, 100_000, None);
        g.sync_call(1, 7, 4_000);
        g.sync_return(1, 7, 130_000);
        let s = g.settle(u64::MAX);
        let us: Vec<(String, f64)> = s
            .iter()
            .map(|x| (x.frames[0].to_string(), x.gpu_us))
            .collect();
        assert_eq!(
            us,
            vec![("a".into(), 50.0), ("a".into(), 50.0), ("b".into(), 30.0)]
        );
    }

    #[test]
    fn waits_in_collectives_are_not_compute_and_unmarked_launches_wait() {
        let mut g = GpuTimer::default();
        g.launch(1, 0, f("a"));
        g.collective(1, 1_000, 10_000, Some(50_000));
        g.launch(1, 2_000, f("opt"));
        g.launch(1, 3_000, f("late"));
        g.sync_call(1, 7, 2_500);
        g.sync_return(1, 7, 60_000);
        let s = g.settle(u64::MAX);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].frames[0].as_ref(), "opt");
        assert_eq!(
            s[1].gpu_us, 10.0,
            "from the collective's completion, not its arrival"
        );
        // "late" was enqueued after the sync call: still pending.
        assert!(g.settle(u64::MAX).is_empty());
        g.sync_call(1, 7, 4_000);
        g.sync_return(1, 7, 70_000);
        assert_eq!(g.settle(u64::MAX).len(), 1);
    }
}
