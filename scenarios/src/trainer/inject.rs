//! The fault injector. Not part of the modelled job: at the start of every
//! iteration it turns this rank's faults on or off — GPU speed, NIC and link
//! knobs in the control block the stand-ins read, host-side delays and CPU
//! contention in this process, or a hang — and reports each change to the
//! launcher for the ground truth.
//!
//! When the launcher shapes each NIC's port replica with `tc`
//! ([`slowrank_sim::env::WIRE`] set), a communication fault's bandwidth is
//! the launcher's business (it changes the port's htb class, the NIC
//! measures it); only its extra latency is a knob here, because htb and tbf
//! cannot add a fixed delay and this machine has no netem. Link faults are
//! always knobs: one pair of NICs has no link of its own on a host's veth.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use slowrank_sim::{
    clock,
    control::{lid_of, Control},
    env,
    hub::HubClient,
    report::Report,
};

use super::{cpucap::CpuCap, TrainerError};
use crate::{
    layout::Layout,
    spec::{Fault, FaultKind, HostMode, Spec},
};

/// Busy threads pinned to the rank's CPU.
struct Hog {
    stop: Arc<AtomicBool>,
    saved_mask: libc::cpu_set_t,
    /// The rank's share of the machine, which it and the busy threads share
    /// (see [`super::cpucap`]); `None` where no cgroup could be made.
    _cap: Option<super::cpucap::CpuCap>,
}

pub struct Injector {
    rank: u32,
    layout: Layout,
    /// (index in the spec, fault) for faults on this rank.
    faults: Vec<(usize, Fault)>,
    active: Vec<bool>,
    ctl: &'static Control,
    /// Seed of the per-iteration work draws of a `work_imbalance`.
    seed: u64,
    /// Communication bandwidth is shaped by `tc`, not written here.
    wire: bool,
    hog: Option<Hog>,
}

/// Host-side effect of the active faults on one named function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostEffect {
    pub factor: f64,
    pub delay: Duration,
    /// Burn the CPU instead of sleeping (so contention has an effect).
    pub spin: bool,
}

fn set_affinity(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: plain sched_{get,set}affinity on the calling thread.
    unsafe {
        let mut saved: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut saved);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        saved
    }
}

impl Injector {
    pub fn new(spec: &Spec, rank: u32) -> Self {
        let faults: Vec<(usize, Fault)> = spec
            .faults
            .iter()
            .enumerate()
            .filter(|(_, f)| spec.fault_ranks(f).contains(&rank))
            .map(|(i, f)| (i, f.clone()))
            .collect();
        Self {
            rank,
            layout: spec.layout(),
            active: vec![false; faults.len()],
            faults,
            ctl: Control::current(),
            seed: spec.seed,
            wire: std::env::var_os(env::WIRE).is_some(),
            hog: None,
        }
    }

    fn active(&self) -> impl Iterator<Item = &Fault> {
        self.faults
            .iter()
            .zip(&self.active)
            .filter(|(_, a)| **a)
            .map(|((_, f), _)| f)
    }

    /// Applies the faults of `iteration`; never returns if a hang starts.
    pub fn begin_iteration(
        &mut self,
        iteration: u64,
        hub: &mut HubClient,
    ) -> Result<(), TrainerError> {
        let mut changed = false;
        for (k, (idx, f)) in self.faults.iter().enumerate() {
            let on = f.active_at(iteration);
            if on != self.active[k] {
                self.active[k] = on;
                changed = true;
                hub.report(Report::Fault {
                    fault: *idx,
                    rank: self.rank,
                    active: on,
                    iteration,
                    mono_ns: clock::mono_ns(),
                    wall_ns: clock::wall_ns(),
                })?;
            }
        }
        // Work that moves between ranks is drawn anew every iteration.
        let moving = self.active().any(|f| f.kind == FaultKind::WorkImbalance);
        if moving && !changed {
            self.apply_compute(iteration);
        }
        if !changed {
            return Ok(());
        }
        self.apply_compute(iteration);
        self.apply_gpu_and_network();
        self.apply_contention();
        if self.active().any(|f| f.kind == FaultKind::Hang) {
            hang_forever();
        }
        Ok(())
    }

    /// GPU speed: compute faults, a slower pipeline stage and this
    /// iteration's share of moving work, multiplied.
    fn apply_compute(&self, iteration: u64) {
        let compute: f64 = self
            .active()
            .map(|f| match f.kind {
                FaultKind::Compute | FaultKind::StageImbalance => f.slowdown(),
                FaultKind::WorkImbalance => {
                    work_factor(f.slowdown(), self.seed, u64::from(self.rank), iteration)
                }
                _ => 1.0,
            })
            .product();
        self.ctl.set_compute_factor(compute);
    }

    fn apply_gpu_and_network(&self) {
        let (mut lat, mut bw) = (0u64, 1f64);
        for f in self.active().filter(|f| f.kind == FaultKind::Communication) {
            let (l, b) = f.network();
            lat += l;
            bw = bw.min(b);
        }
        self.ctl.set_nic(lat, if self.wire { 1.0 } else { bw });
        // Every link fault's peer: reset, then apply the active ones.
        let peer_lid = |f: &Fault| {
            let peer = f.targets().into_iter().find(|r| *r != self.rank)?;
            Some(lid_of(
                self.layout.host_of(peer),
                self.layout.local_of(peer),
            ))
        };
        for (_, f) in self
            .faults
            .iter()
            .filter(|(_, f)| f.kind == FaultKind::Link)
        {
            if let Some(lid) = peer_lid(f) {
                self.ctl.set_link(lid, 0, 1.0);
            }
        }
        for f in self.active().filter(|f| f.kind == FaultKind::Link) {
            if let Some(lid) = peer_lid(f) {
                let (l0, b0) = self.ctl.link(lid);
                let (l, b) = f.network();
                self.ctl.set_link(lid, l0 + l, b0.min(b));
            }
        }
    }

    fn contention(&self) -> Option<&Fault> {
        self.active()
            .find(|f| f.kind == FaultKind::Host && f.mode == Some(HostMode::Contention))
    }

    fn apply_contention(&mut self) {
        let threads = self.contention().map(|f| f.threads.unwrap_or(2));
        match (threads, self.hog.is_some()) {
            (Some(n), false) => {
                // SAFETY: sysconf is always safe.
                let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
                let cpu = self.rank as usize % cpus;
                let saved_mask = set_affinity(cpu);
                let stop = Arc::new(AtomicBool::new(false));
                let (tx, rx) = std::sync::mpsc::channel();
                for _ in 0..n {
                    let (stop, tx) = (stop.clone(), tx.clone());
                    let _ = std::thread::Builder::new()
                        .name("noisy-neighbour".into())
                        .spawn(move || {
                            set_affinity(cpu);
                            let _ = tx.send(CpuCap::current_thread());
                            while !stop.load(Ordering::Relaxed) {
                                std::hint::spin_loop();
                            }
                        });
                }
                drop(tx);
                let share = cpus as f64 / f64::from(self.layout.world().max(1));
                let cap = self.cap_with(rx.iter().take(n as usize), share.max(0.1));
                self.hog = Some(Hog {
                    stop,
                    saved_mask,
                    _cap: cap,
                });
            }
            (None, true) => {
                if let Some(h) = self.hog.take() {
                    h.stop.store(true, Ordering::Relaxed);
                    // SAFETY: restoring this thread's own mask.
                    unsafe {
                        libc::sched_setaffinity(
                            0,
                            std::mem::size_of::<libc::cpu_set_t>(),
                            &h.saved_mask,
                        )
                    };
                }
            }
            _ => {}
        }
    }

    /// This thread and `neighbours` in one cgroup allowed `cpus` CPUs.
    fn cap_with(&self, neighbours: impl Iterator<Item = i32>, cpus: f64) -> Option<CpuCap> {
        let name = format!("slowrank-{}-rank{}", std::process::id(), self.rank);
        let made = CpuCap::new(&name, cpus).and_then(|mut c| {
            c.add(CpuCap::current_thread())?;
            for tid in neighbours {
                c.add(tid)?;
            }
            Ok(c)
        });
        match made {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "rank {}: contention without a CPU cap ({e}): the busy threads slow every rank on this machine",
                    self.rank
                );
                None
            }
        }
    }

    /// How active host faults change the host time of `function`.
    pub fn host_effect(&self, function: &str) -> HostEffect {
        let mut e = HostEffect {
            factor: 1.0,
            delay: Duration::ZERO,
            spin: self.hog.is_some(),
        };
        for f in self
            .active()
            .filter(|f| f.kind == FaultKind::Host && f.host_function() == function)
        {
            if f.mode != Some(HostMode::Contention) {
                match f.delay_us {
                    Some(d) => e.delay += Duration::from_secs_f64(d / 1e6),
                    None => e.factor *= f.slowdown(),
                }
            }
        }
        e
    }
}

/// A `work_imbalance` rank's work in one iteration: `1 + (max − 1)·u²`
/// with `u` uniform in [0, 1) from (seed, rank, iteration), so the same
/// spec and seed give the same work in every run (the counterfactual
/// compares like with like) while the heaviest rank moves between
/// iterations.
pub fn work_factor(max: f64, seed: u64, rank: u64, iteration: u64) -> f64 {
    // A constant word keeps these draws apart from the kernels' jitter.
    let u = slowrank_sim::rng::unit(slowrank_sim::rng::hash(&[seed, rank, iteration, 0x5e9_1e7]));
    1.0 + (max - 1.0) * u * u
}

/// A rank that stopped issuing collectives: stuck here for ever.
#[inline(never)]
pub fn hang_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::work_factor;

    #[test]
    fn moving_work_is_reproducible_bounded_and_moves() {
        let w: Vec<f64> = (0..8).map(|r| work_factor(3.0, 7, r, 10)).collect();
        assert!(w.iter().all(|x| (1.0..3.0).contains(x)), "{w:?}");
        assert_eq!(work_factor(3.0, 7, 2, 10), w[2], "same seed, same work");
        let heaviest = |it: u64| {
            (0..8u64)
                .max_by(|a, b| work_factor(3.0, 7, *a, it).total_cmp(&work_factor(3.0, 7, *b, it)))
                .unwrap()
        };
        let ranks: std::collections::BTreeSet<u64> = (0..50).map(heaviest).collect();
        assert!(ranks.len() >= 5, "the heaviest rank moves: {ranks:?}");
        assert_eq!(work_factor(1.0, 7, 2, 10), 1.0);
    }
}
