//! What-if cost: how much shorter an iteration would have been had a rank
//! done its own work as fast as its peers of the same role.
//!
//! In: one iteration as plain data ([`IterGraph`]: the collective instances
//! with each member's arrival and the instance's completion, on one clock).
//! Out: per rank, the time the iteration would have saved ([`WhatIf::cost`]),
//! and the saving "once rank X is fixed" ([`WhatIf::cost_once_fixed`]) for a
//! rank a bigger straggler hides. Pure: no clock, no IO, no state across
//! iterations.
//!
//! The model (DESIGN.md §5, "cost is a what-if"): every rank is a chain of
//! arrivals. Between two arrivals a rank does its *own work* `w`, which
//! starts when the rank is *ready*: after its previous arrival, and, when it
//! was seen to wait for it (it arrived after that instance completed), after
//! the previous instance completed. An instance completes `x` after its last
//! member arrives (`x`, the transfer, is measured: completion − last
//! arrival). These are the edges of a dependency graph (petgraph); the
//! iteration's length is its longest path. The what-if replaces one rank's
//! `w` by the median `w` of its peers — the ranks whose chain has the same
//! shape (same sequence of operations and sizes: the same role, e.g. the
//! other data-parallel replicas of a pipeline stage) — and takes the longest
//! path again. Each delay counts once, however many instances it makes late,
//! and a delay that a pipeline bubble or a bigger straggler absorbs costs
//! nothing.

use std::collections::BTreeMap;

use petgraph::algo::toposort;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::Direction;

use crate::robust::midpoint_median as median;

/// One member's arrival at an instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub rank: u32,
    /// ns, on the iteration's clock.
    pub at: f64,
    /// What the instance is to this member, for matching roles: e.g. a
    /// hash of (operation, communicator size, which end of a send/recv).
    /// Ranks whose chains have the same sequence of shapes are peers.
    pub shape: u64,
    /// The rank's GPU busy time since its previous arrival, when the source
    /// recorded its kernels: its own work is at most this much, and the
    /// rest of the gap an idle GPU waiting on something not observed.
    pub busy: Option<f64>,
}

/// One collective instance of the iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Each member that was observed.
    pub arrivals: Vec<Arrival>,
    /// Completion (ns); at least the last arrival.
    pub end: f64,
}

/// One iteration, ready for the what-if.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IterGraph {
    /// When the iteration began (the previous one's end), ns.
    pub start: f64,
    pub events: Vec<Event>,
    /// Pipeline stage of each rank that sends or receives between stages
    /// (its position in the pipeline communicator); empty without one.
    pub stages: BTreeMap<u32, u32>,
}

#[derive(Debug, Clone, Copy)]
enum NodeKind {
    /// Arrival of a rank at its `j`-th instance (index into `Chain::work`).
    Arrive { rank: u32, j: usize },
    /// Completion of event `e`.
    Complete { e: usize },
}

/// One rank's chain through the iteration.
#[derive(Debug, Clone, Default)]
struct Chain {
    /// Events in the order this rank arrived at them.
    events: Vec<usize>,
    /// Own work before each arrival (ns, ≥ 0).
    work: Vec<f64>,
    shapes: Vec<u64>,
}

/// The replayable model of one iteration.
#[derive(Debug)]
pub struct WhatIf {
    g: DiGraph<NodeKind, ()>,
    order: Vec<NodeIndex>,
    /// Per node, the arriving rank's own work before it (0 for
    /// completions): a replay reads it by index, not through `chains`.
    node_work: Vec<f64>,
    start: f64,
    transfer: Vec<f64>,
    chains: BTreeMap<u32, Chain>,
    /// Ranks with the same chain shape, each group sorted.
    roles: Vec<Vec<u32>>,
    /// rank → index into `roles`.
    role_of: BTreeMap<u32, usize>,
    /// Per role of more than [`EXACT_PEERS`] ranks, the per-position median
    /// work over the whole role.
    role_median: BTreeMap<usize, Vec<f64>>,
    /// Per event, its last arriver and its lead over the next-to-last.
    last: Vec<Option<(u32, f64)>>,
    /// Per event, its observed members.
    members: Vec<Vec<u32>>,
    stages: BTreeMap<u32, u32>,
    observed: f64,
}

impl WhatIf {
    /// Builds the model; `None` for an iteration with no instance.
    pub fn new(it: &IterGraph) -> Option<Self> {
        if it.events.is_empty() {
            return None;
        }
        let (chains, busy) = arrival_chains(it);
        let transfer = transfer_times(it);
        let blocking = blocking_by_role(it, &chains);
        let (g, built) = build_graph(it, &chains, &busy, &blocking);
        let order = match toposort(&g, None) {
            Ok(o) => o,
            Err(_) => {
                tracing::debug!(
                    events = it.events.len(),
                    "what-if: the iteration's graph has a cycle"
                );
                return None;
            }
        };
        let (roles, role_of, role_median) = roles_of(&built);
        let node_work = g
            .node_indices()
            .map(|n| match g[n] {
                NodeKind::Arrive { rank, j } => built[&rank].work[j],
                NodeKind::Complete { .. } => 0.0,
            })
            .collect();
        let last = last_arrivers(it);
        let members = it
            .events
            .iter()
            .map(|ev| ev.arrivals.iter().map(|a| a.rank).collect())
            .collect();
        let mut m = Self {
            last,
            members,
            stages: it.stages.clone(),
            g,
            order,
            node_work,
            start: it.start,
            transfer,
            chains: built,
            roles,
            role_of,
            role_median,
            observed: 0.0,
        };
        m.observed = m.replay(&BTreeMap::new());
        Some(m)
    }

    /// The iteration's length as the model replays it (ns).
    pub fn length(&self) -> f64 {
        self.observed
    }

    /// Ranks in the iteration.
    pub fn ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.chains.keys().copied()
    }

    /// Ranks that arrived last at some instance, with how far behind the
    /// next-to-last they were there (ns, the largest over instances): only
    /// they can be on the critical path, so only they can cost anything.
    pub fn last_arrivers(&self) -> BTreeMap<u32, f64> {
        let mut out: BTreeMap<u32, f64> = BTreeMap::new();
        for (r, gap) in self.last.iter().flatten() {
            let g = out.entry(*r).or_insert(0.0);
            *g = g.max(*gap);
        }
        out
    }

    /// The peers `rank` is compared with (same role, itself excluded).
    pub fn peers(&self, rank: u32) -> Vec<u32> {
        self.role_of.get(&rank).map_or(Vec::new(), |i| {
            self.roles[*i]
                .iter()
                .copied()
                .filter(|q| *q != rank)
                .collect()
        })
    }

    /// `rank`'s own work per arrival, as its peers' median; `None` without
    /// a peer of the same role. In a role of more than [`EXACT_PEERS`]
    /// ranks the role's median stands for its peers' (one rank moves a
    /// median of that many by at most one neighbour's gap), which keeps a
    /// replay of a 10,000-rank data-parallel job linear.
    fn peer_work(&self, rank: u32) -> Option<Vec<f64>> {
        let role = *self.role_of.get(&rank)?;
        if let Some(m) = self.role_median.get(&role) {
            return Some(m.clone());
        }
        let peers = self.peers(rank);
        if peers.is_empty() {
            return None;
        }
        let n = self.chains[&rank].work.len();
        Some(
            (0..n)
                .map(|j| {
                    let mut v: Vec<f64> = peers.iter().map(|p| self.chains[p].work[j]).collect();
                    median(&mut v)
                })
                .collect(),
        )
    }

    /// A rank's pipeline stage, when the job has a pipeline.
    pub fn stage_of(&self, rank: u32) -> Option<u32> {
        self.stages.get(&rank).copied()
    }

    /// Groups of ranks with the same role (same chain shape).
    pub fn roles(&self) -> &[Vec<u32>] {
        &self.roles
    }

    /// A rank's own work over the iteration (ns).
    pub fn work_total(&self, rank: u32) -> Option<f64> {
        self.chains.get(&rank).map(|c| c.work.iter().sum())
    }

    /// Replay with the work of `ranks` scaled by `factor`.
    pub fn length_scaled(&self, ranks: &[u32], factor: f64) -> f64 {
        let replaced: BTreeMap<u32, Vec<f64>> = ranks
            .iter()
            .filter_map(|r| {
                self.chains
                    .get(r)
                    .map(|c| (*r, c.work.iter().map(|w| w * factor).collect()))
            })
            .collect();
        self.replay(&replaced)
    }

    /// Replay with every rank that has peers at its peers' median: the
    /// iteration with its work balanced across each role.
    pub fn length_balanced(&self) -> f64 {
        let replaced: BTreeMap<u32, Vec<f64>> = self
            .chains
            .keys()
            .filter_map(|r| self.peer_work(*r).map(|w| (*r, w)))
            .collect();
        self.replay(&replaced)
    }

    /// How much shorter the iteration would have been (ns, ≥ 0) had the
    /// transfers of every instance with all of `ends` as members taken
    /// `factor` of their time: a slow NIC (one end) or link (two) at its
    /// peers' rate. A transfer the ranks' own work overlaps (a gradient
    /// bucket during the backward pass) costs nothing; the one the step
    /// waits for costs its excess, once. `None` when no instance has them.
    pub fn transfer_cost(&self, ends: &[u32], factor: f64) -> Option<f64> {
        let mut transfer = self.transfer.clone();
        let mut any = false;
        for (e, m) in self.members.iter().enumerate() {
            if !ends.is_empty() && ends.iter().all(|r| m.contains(r)) {
                transfer[e] *= factor.clamp(0.0, 1.0);
                any = true;
            }
        }
        any.then(|| (self.observed - self.replay_with(&BTreeMap::new(), &transfer)).max(0.0))
    }

    /// Longest path with some ranks' work replaced.
    fn replay(&self, replaced: &BTreeMap<u32, Vec<f64>>) -> f64 {
        self.replay_with(replaced, &self.transfer)
    }

    /// Longest path with some ranks' work and the transfers replaced.
    fn replay_with(&self, replaced: &BTreeMap<u32, Vec<f64>>, transfer: &[f64]) -> f64 {
        let mut t = vec![f64::NEG_INFINITY; self.g.node_count()];
        let mut end = self.start;
        for &n in &self.order {
            let ready = self
                .g
                .neighbors_directed(n, Direction::Incoming)
                .map(|p| t[p.index()])
                .fold(f64::NEG_INFINITY, f64::max);
            t[n.index()] = match self.g[n] {
                NodeKind::Arrive { rank, j } => {
                    let w = match replaced.is_empty() {
                        true => self.node_work[n.index()],
                        false => replaced
                            .get(&rank)
                            .map_or(self.node_work[n.index()], |w| w[j]),
                    };
                    let from = if ready.is_finite() { ready } else { self.start };
                    from + w
                }
                NodeKind::Complete { e } => {
                    if ready.is_finite() {
                        ready + transfer[e]
                    } else {
                        f64::NEG_INFINITY
                    }
                }
            };
            if t[n.index()].is_finite() {
                end = end.max(t[n.index()]);
            }
        }
        end - self.start
    }

    /// Replay with every rank of `fixed` at its peers' median; `None` if a
    /// rank of `fixed` has no peer of its role.
    pub fn length_with(&self, fixed: &[u32]) -> Option<f64> {
        let mut replaced = BTreeMap::new();
        for &r in fixed {
            if self.chains.contains_key(&r) {
                replaced.insert(r, self.peer_work(r)?);
            }
        }
        Some(self.replay(&replaced))
    }

    /// How much shorter the iteration would have been (ns, ≥ 0) had `rank`
    /// worked at its peers' median; `None` when it has no peer of its role
    /// or was not in the iteration.
    pub fn cost(&self, rank: u32) -> Option<f64> {
        if !self.chains.contains_key(&rank) {
            return None;
        }
        Some((self.observed - self.length_with(&[rank])?).max(0.0))
    }

    /// The saving from `rank` once every rank of `fixed` is at its peers'
    /// median: for a rank a bigger straggler hides.
    pub fn cost_once_fixed(&self, rank: u32, fixed: &[u32]) -> Option<f64> {
        if !self.chains.contains_key(&rank) {
            return None;
        }
        let base = self.length_with(fixed)?;
        let mut both = fixed.to_vec();
        both.push(rank);
        Some((base - self.length_with(&both)?).max(0.0))
    }
}

/// Roles up to this size compare a rank with its peers exactly (itself
/// excluded); larger ones with the role's median.
const EXACT_PEERS: usize = 16;

/// Per rank, its arrivals `(at, event, shape)` in arrival order, and the
/// GPU busy time of each `(rank, event)` where it is known.
#[allow(clippy::type_complexity)]
fn arrival_chains(
    it: &IterGraph,
) -> (
    BTreeMap<u32, Vec<(f64, usize, u64)>>,
    BTreeMap<(u32, usize), f64>,
) {
    let mut chains: BTreeMap<u32, Vec<(f64, usize, u64)>> = BTreeMap::new();
    let mut busy: BTreeMap<(u32, usize), f64> = BTreeMap::new();
    for (e, ev) in it.events.iter().enumerate() {
        for a in &ev.arrivals {
            chains.entry(a.rank).or_default().push((a.at, e, a.shape));
            if let Some(b) = a.busy {
                busy.insert((a.rank, e), b);
            }
        }
    }
    for seq in chains.values_mut() {
        seq.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    }
    (chains, busy)
}

/// Per event, its transfer: from its last arrival to its end.
fn transfer_times(it: &IterGraph) -> Vec<f64> {
    it.events
        .iter()
        .map(|ev| {
            let last = ev
                .arrivals
                .iter()
                .map(|a| a.at)
                .fold(f64::NEG_INFINITY, f64::max);
            if last.is_finite() {
                (ev.end - last).max(0.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// Per rank, whether each of its arrivals waits for its previous instance
/// to complete. Whether a role waits for its previous instance before its
/// next arrival is a property of the program (a synchronous collective),
/// not of one rank: decided by the role's median. A straggler arrives after
/// its previous instance completed because it was late, not because it
/// waited; its on-time peers show what the program does.
fn blocking_by_role(
    it: &IterGraph,
    chains: &BTreeMap<u32, Vec<(f64, usize, u64)>>,
) -> BTreeMap<u32, std::rc::Rc<Vec<bool>>> {
    let shapes_of = |seq: &[(f64, usize, u64)]| -> Vec<u64> { seq.iter().map(|a| a.2).collect() };
    let mut roles: BTreeMap<Vec<u64>, Vec<u32>> = BTreeMap::new();
    for (r, seq) in chains {
        roles.entry(shapes_of(seq)).or_default().push(*r);
    }
    let mut blocking: BTreeMap<u32, std::rc::Rc<Vec<bool>>> = BTreeMap::new();
    for members in roles.values() {
        let n = chains[&members[0]].len();
        let waits: Vec<bool> = (0..n)
            .map(|j| {
                if j == 0 {
                    return false;
                }
                let mut d: Vec<f64> = members
                    .iter()
                    .map(|r| {
                        let seq = &chains[r];
                        seq[j].0 - it.events[seq[j - 1].1].end
                    })
                    .collect();
                median(&mut d) >= 0.0
            })
            .collect();
        // Shared by the role: a copy per rank was 16,384 vectors an
        // iteration at that many ranks.
        let waits = std::rc::Rc::new(waits);
        for r in members {
            blocking.insert(*r, waits.clone());
        }
    }
    blocking
}

/// The dependency graph (each arrival after its rank's previous one, and
/// after its previous instance's completion where the role waits; each
/// instance complete after its arrivals) and each rank's chain of work.
fn build_graph(
    it: &IterGraph,
    chains: &BTreeMap<u32, Vec<(f64, usize, u64)>>,
    busy: &BTreeMap<(u32, usize), f64>,
    blocking: &BTreeMap<u32, std::rc::Rc<Vec<bool>>>,
) -> (DiGraph<NodeKind, ()>, BTreeMap<u32, Chain>) {
    let mut g: DiGraph<NodeKind, ()> = DiGraph::new();
    let complete: Vec<NodeIndex> = (0..it.events.len())
        .map(|e| g.add_node(NodeKind::Complete { e }))
        .collect();
    let mut built: BTreeMap<u32, Chain> = BTreeMap::new();
    for (&rank, seq) in chains {
        let waits = &blocking[&rank];
        let mut chain = Chain::default();
        let mut prev: Option<(NodeIndex, f64, usize)> = None;
        for (j, &(at, e, shape)) in seq.iter().enumerate() {
            let n = g.add_node(NodeKind::Arrive { rank, j });
            g.add_edge(n, complete[e], ());
            let ready = match prev {
                None => it.start,
                Some((pn, pat, pe)) => {
                    g.add_edge(pn, n, ());
                    if waits[j] {
                        g.add_edge(complete[pe], n, ());
                        pat.max(it.events[pe].end)
                    } else {
                        pat
                    }
                }
            };
            chain.events.push(e);
            let gap = (at - ready).max(0.0);
            chain
                .work
                .push(busy.get(&(rank, e)).map_or(gap, |b| gap.min(*b)));
            chain.shapes.push(shape);
            prev = Some((n, at, e));
        }
        built.insert(rank, chain);
    }
    (g, built)
}

/// Ranks grouped by the shape of their chains (a role), each rank's role,
/// and per role of more than [`EXACT_PEERS`] ranks its per-position median
/// work.
#[allow(clippy::type_complexity)]
fn roles_of(
    built: &BTreeMap<u32, Chain>,
) -> (
    Vec<Vec<u32>>,
    BTreeMap<u32, usize>,
    BTreeMap<usize, Vec<f64>>,
) {
    let mut by_shape: BTreeMap<&[u64], Vec<u32>> = BTreeMap::new();
    for (r, c) in built {
        by_shape.entry(&c.shapes).or_default().push(*r);
    }
    let roles: Vec<Vec<u32>> = by_shape.into_values().collect();
    let role_of: BTreeMap<u32, usize> = roles
        .iter()
        .enumerate()
        .flat_map(|(i, rs)| rs.iter().map(move |r| (*r, i)))
        .collect();
    let role_median = roles
        .iter()
        .enumerate()
        .filter(|(_, rs)| rs.len() > EXACT_PEERS)
        .map(|(i, rs)| {
            let n = built[&rs[0]].work.len();
            let med = (0..n)
                .map(|j| {
                    let mut v: Vec<f64> = rs.iter().map(|r| built[r].work[j]).collect();
                    median(&mut v)
                })
                .collect();
            (i, med)
        })
        .collect();
    (roles, role_of, role_median)
}

/// Per event, its last arriver and its lead over the next-to-last.
fn last_arrivers(it: &IterGraph) -> Vec<Option<(u32, f64)>> {
    it.events
        .iter()
        .map(|ev| {
            let mut a: Vec<&Arrival> = ev.arrivals.iter().collect();
            a.sort_by(|x, y| y.at.total_cmp(&x.at));
            let first = a.first()?;
            let gap = a.get(1).map_or(0.0, |second| first.at - second.at);
            Some((first.rank, gap))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1e6;

    fn at(rank: u32, t: f64, shape: u64) -> Arrival {
        Arrival {
            rank,
            at: t,
            shape,
            busy: None,
        }
    }

    /// A data-parallel iteration: `n` ranks, `k` synchronous all-reduces;
    /// rank `r` works `work(r, j)` before its `j`-th, each all-reduce
    /// takes `x` after the last arrival.
    fn sync_dp(n: u32, k: usize, x: f64, work: impl Fn(u32, usize) -> f64) -> IterGraph {
        let mut events = Vec::new();
        let mut ready = vec![0.0; n as usize];
        for j in 0..k {
            let arrivals: Vec<Arrival> = (0..n)
                .map(|r| at(r, ready[r as usize] + work(r, j), 1))
                .collect();
            let last = arrivals.iter().map(|a| a.at).fold(0.0, f64::max);
            let end = last + x;
            ready.fill(end);
            events.push(Event { arrivals, end });
        }
        IterGraph {
            start: 0.0,
            stages: Default::default(),
            events,
        }
    }

    #[test]
    fn a_late_rank_costs_its_lateness_once_not_per_collective() {
        // Rank 2 is 6 ms late at the first of 5 buckets only (data loading);
        // everybody waits once. A sum of waits would say 7 × 6 ms.
        let it = sync_dp(8, 5, 1.0 * MS, |r, j| {
            8.0 * MS + if r == 2 && j == 0 { 6.0 * MS } else { 0.0 }
        });
        let w = WhatIf::new(&it).unwrap();
        assert!((w.length() - (5.0 * 9.0 + 6.0) * MS).abs() < 1.0);
        assert!((w.cost(2).unwrap() - 6.0 * MS).abs() < 1.0);
        assert_eq!(w.cost(3).unwrap(), 0.0);
    }

    #[test]
    fn a_slow_gpu_costs_its_excess_at_every_sync() {
        // Rank 5 is 25% slower at every bucket: 2 ms × 4.
        let it = sync_dp(
            8,
            4,
            0.5 * MS,
            |r, _| if r == 5 { 10.0 * MS } else { 8.0 * MS },
        );
        let w = WhatIf::new(&it).unwrap();
        assert!((w.cost(5).unwrap() - 8.0 * MS).abs() < 1.0);
    }

    #[test]
    fn noise_among_the_rest_is_not_saved_by_fixing_the_straggler() {
        // Rank 1 is 3 ms late, rank 4 is 1 ms late: fixing 1 saves 2 ms
        // (4 becomes the last), fixing both saves 3.
        let it = sync_dp(6, 1, 0.0, |r, _| {
            10.0 * MS
                + match r {
                    1 => 3.0 * MS,
                    4 => 1.0 * MS,
                    _ => 0.0,
                }
        });
        let w = WhatIf::new(&it).unwrap();
        assert!((w.cost(1).unwrap() - 2.0 * MS).abs() < 1.0);
        assert_eq!(w.cost(4).unwrap(), 0.0, "hidden behind rank 1");
        assert!((w.cost_once_fixed(4, &[1]).unwrap() - 1.0 * MS).abs() < 1.0);
    }

    #[test]
    fn a_delay_absorbed_by_slack_costs_nothing() {
        // Two independent pairs (two communicators); the iteration ends
        // when the slower pair finishes. Rank 0 is 2 ms slower, but its
        // pair finishes 5 ms before the other pair: no cost now.
        let ev = |shape, a: (u32, f64), b: (u32, f64)| Event {
            end: a.1.max(b.1),
            arrivals: vec![at(a.0, a.1, shape), at(b.0, b.1, shape)],
        };
        let it = IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![
                ev(1, (0, 12.0 * MS), (1, 10.0 * MS)),
                ev(1, (2, 17.0 * MS), (3, 17.0 * MS)),
            ],
        };
        let w = WhatIf::new(&it).unwrap();
        assert_eq!(w.peers(0), vec![1, 2, 3]);
        assert_eq!(w.cost(0).unwrap(), 0.0);
        // Ranks 2 and 3 are both slower than the median: fixing one alone
        // saves nothing, fixing both does.
        assert_eq!(w.cost(2).unwrap(), 0.0);
        assert!(w.length_with(&[2, 3]).unwrap() < w.length());
    }

    #[test]
    fn a_pipeline_stage_is_compared_with_its_own_replicas_only() {
        // pp2 × dp2: stage 0 (ranks 0, 2) sends to stage 1 (ranks 1, 3);
        // stage 1 does twice the work of stage 0 on every replica. Nobody
        // is slower than its peers: no rank costs anything.
        // The two ends of a send/recv are different roles.
        let send = |s: u32, r: u32, ts: f64, tr: f64| Event {
            end: ts.max(tr),
            arrivals: vec![at(s, ts, 7), at(r, tr, 8)],
        };
        let ar = |a: (u32, f64), b: (u32, f64), shape| Event {
            end: a.1.max(b.1) + MS,
            arrivals: vec![at(a.0, a.1, shape), at(b.0, b.1, shape)],
        };
        let it = IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![
                send(0, 1, 5.0 * MS, 0.0),
                send(2, 3, 5.0 * MS, 0.0),
                ar((0, 6.0 * MS), (2, 6.0 * MS), 2),
                ar((1, 15.0 * MS), (3, 15.0 * MS), 3),
            ],
        };
        let w = WhatIf::new(&it).unwrap();
        assert_eq!(w.peers(1), vec![3]);
        assert_eq!(w.peers(0), vec![2]);
        for r in 0..4 {
            assert_eq!(w.cost(r).unwrap(), 0.0, "rank {r}");
        }
    }

    #[test]
    fn a_rank_without_a_peer_of_its_role_has_no_cost() {
        let it = IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![Event {
                arrivals: vec![at(0, 1.0, 1)],
                end: 2.0,
            }],
        };
        let w = WhatIf::new(&it).unwrap();
        assert_eq!(w.cost(0), None);
        assert_eq!(w.cost(9), None);
        assert!(WhatIf::new(&IterGraph::default()).is_none());
    }

    #[test]
    fn asynchronous_buckets_keep_their_overlap() {
        // A rank that arrives at bucket j+1 before bucket j completed did
        // not wait for it; its own work runs from its previous arrival.
        // Rank 0's second bucket is 4 ms late; bucket 1's transfer (3 ms)
        // overlaps its work, so the saving is 4 ms, not 4 + 3.
        let it = IterGraph {
            start: 0.0,
            stages: Default::default(),
            events: vec![
                Event {
                    arrivals: vec![at(0, 2.0 * MS, 1), at(1, 2.0 * MS, 1), at(2, 2.0 * MS, 1)],
                    end: 5.0 * MS,
                },
                Event {
                    arrivals: vec![at(0, 8.0 * MS, 1), at(1, 4.0 * MS, 1), at(2, 4.0 * MS, 1)],
                    end: 11.0 * MS,
                },
            ],
        };
        let w = WhatIf::new(&it).unwrap();
        assert!((w.length() - 11.0 * MS).abs() < 1.0);
        // Its peers arrived before bucket 0 completed: the role does not
        // wait for it, so rank 0's lateness is its own work.
        assert!((w.cost(0).unwrap() - 4.0 * MS).abs() < 1.0);
    }

    /// A slow NIC on rank 2 makes every all-reduce's transfer 3× longer.
    /// Synchronous (3 ms instead of 1), each of the 4 is waited for:
    /// 4 × 2 ms. When the ranks work on while the transfers run (gradient
    /// buckets overlapping the backward pass: 6 ms instead of 2, a bucket
    /// every 5 ms), only the last one is waited for: 4 ms.
    #[test]
    fn a_slow_transfer_costs_what_the_step_waits_for() {
        let sync = WhatIf::new(&sync_dp(4, 4, 3.0 * MS, |_, _| 5.0 * MS)).unwrap();
        let c = sync.transfer_cost(&[2], 1.0 / 3.0).unwrap();
        assert!((c - 8.0 * MS).abs() < 1.0, "{c}");
        // A link: only instances with both ends; none has rank 9.
        assert!((sync.transfer_cost(&[1, 2], 1.0 / 3.0).unwrap() - 8.0 * MS).abs() < 1.0);
        assert_eq!(sync.transfer_cost(&[2, 9], 0.5), None);

        // Overlapped: each rank arrives 5 ms after its previous arrival,
        // not after the previous transfer ended.
        let mut events = Vec::new();
        for j in 0..4 {
            let t = 5.0 * MS * (j as f64 + 1.0);
            let arrivals = (0..4).map(|r| at(r, t, 1)).collect();
            events.push(Event {
                arrivals,
                end: t + 6.0 * MS,
            });
        }
        let overlap = WhatIf::new(&IterGraph {
            start: 0.0,
            stages: Default::default(),
            events,
        })
        .unwrap();
        assert!((overlap.length() - 26.0 * MS).abs() < 1.0);
        let c = overlap.transfer_cost(&[2], 1.0 / 3.0).unwrap();
        assert!((c - 4.0 * MS).abs() < 1.0, "{c}");
    }
}
