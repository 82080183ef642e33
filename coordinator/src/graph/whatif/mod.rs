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
    /// When the rank issued the call (ns, same clock), where known: a
    /// rank's chain is in the order it issued its calls, which is the
    /// program's and the same on its peers. Arrivals on the GPU interleave
    /// across streams (a pipeline send and an all-reduce bucket) in a
    /// different order on a rank that runs late, which made a straggler
    /// the only rank of its role, with no peers to be replayed at.
    pub issued: Option<f64>,
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

/// A role's per-position own work when nobody is slow
/// ([`crate::graph::reference`]), the floor of a what-if's replacement.
#[derive(Debug, Clone, PartialEq)]
pub struct Floor {
    pub work: Vec<f64>,
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
        // Once per rank: both the role's blocking and the graph read them.
        let preds: BTreeMap<u32, Vec<Option<usize>>> = chains
            .iter()
            .map(|(r, seq)| (*r, time_predecessors(seq)))
            .collect();
        let blocking = blocking_by_role(it, &chains, &preds);
        let (g, built) = build_graph(it, &chains, &preds, &busy, &blocking);
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
        self.length_with_floor(fixed, &|_| None)
    }

    /// [`WhatIf::length_with`], with each fixed rank's peers' median raised
    /// to `floor(its chain's shapes)` (per position; never above the rank's
    /// own work): where its peers' work is censored. Peers that waited for
    /// the rank at a stream-ordered collective (gradient buckets) arrive
    /// at its next one right after the late one completes, their own work
    /// done meanwhile, so their work there reads near 0; the rank's own
    /// work there (its next bucket's compute) is the job's, not its
    /// slowness. The floor is what the role's work is when nobody is slow
    /// ([`crate::graph::reference`]).
    pub fn length_with_floor(
        &self,
        fixed: &[u32],
        floor: &dyn Fn(&[u64]) -> Option<Floor>,
    ) -> Option<f64> {
        let mut replaced = BTreeMap::new();
        for &r in fixed {
            let Some(c) = self.chains.get(&r) else {
                continue;
            };
            let mut w = self.peer_work(r)?;
            if let Some(f) = floor(&c.shapes).filter(|f| f.work.len() == w.len()) {
                for ((w, f), own) in w.iter_mut().zip(&f.work).zip(&c.work) {
                    *w = w.max(f.min(*own));
                }
            }
            replaced.insert(r, w);
        }
        Some(self.replay(&replaced))
    }

    /// Each role's chain shapes, with its per-position median own work.
    pub fn role_work(&self) -> Vec<(&[u64], Floor)> {
        self.roles
            .iter()
            .enumerate()
            .map(|(i, rs)| {
                let shapes = &self.chains[&rs[0]].shapes[..];
                let per_position = |f: &dyn Fn(&Chain, usize) -> f64| -> Vec<f64> {
                    (0..shapes.len())
                        .map(|j| {
                            let mut v: Vec<f64> =
                                rs.iter().map(|r| f(&self.chains[r], j)).collect();
                            median(&mut v)
                        })
                        .collect()
                };
                let work = self
                    .role_median
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| per_position(&|c, j| c.work[j]));
                (shapes, Floor { work })
            })
            .collect()
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
    let mut chains: BTreeMap<u32, Vec<(f64, usize, u64, f64)>> = BTreeMap::new();
    let mut busy: BTreeMap<(u32, usize), f64> = BTreeMap::new();
    for (e, ev) in it.events.iter().enumerate() {
        for a in &ev.arrivals {
            chains
                .entry(a.rank)
                .or_default()
                .push((a.at, e, a.shape, a.issued.unwrap_or(a.at)));
            if let Some(b) = a.busy {
                busy.insert((a.rank, e), b);
            }
        }
    }
    let chains = chains
        .into_iter()
        .map(|(r, mut seq)| {
            seq.sort_by(|a, b| a.3.total_cmp(&b.3).then(a.1.cmp(&b.1)));
            (
                r,
                seq.into_iter()
                    .map(|(at, e, shape, _)| (at, e, shape))
                    .collect(),
            )
        })
        .collect();
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
    preds: &BTreeMap<u32, Vec<Option<usize>>>,
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
                    .filter_map(|r| {
                        let seq = &chains[r];
                        let p = preds[r][j]?;
                        Some(seq[j].0 - it.events[seq[p].1].end)
                    })
                    .collect();
                !d.is_empty() && median(&mut d) >= 0.0
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
    preds: &BTreeMap<u32, Vec<Option<usize>>>,
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
        let nodes: Vec<NodeIndex> = (0..seq.len())
            .map(|j| g.add_node(NodeKind::Arrive { rank, j }))
            .collect();
        for (j, &(at, e, shape)) in seq.iter().enumerate() {
            let n = nodes[j];
            g.add_edge(n, complete[e], ());
            let ready = match preds[&rank][j] {
                None => it.start,
                Some(p) => {
                    let (pat, pe) = (seq[p].0, seq[p].1);
                    g.add_edge(nodes[p], n, ());
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
        }
        built.insert(rank, chain);
    }
    (g, built)
}

/// Per position of a rank's chain (issue order), the position it follows
/// in time: its latest arrival before this one. A chain is kept in issue
/// order so that peers line up, but on GPU-side times a rank's streams
/// interleave (a tensor-parallel all-reduce and a data-parallel bucket run
/// side by side), and an arrival issued later can come first. Chained in
/// issue order, such an arrival was replayed after its predecessor: random
/// 4421-12's GPU-side iterations (tp2 × dp4) replayed to 2.46 s against
/// 690 ms steps, and a 2.15× GPU was costed 25 % against 52 % measured.
/// Where issue and time order agree (every host-side chain), it is the
/// previous position.
fn time_predecessors(seq: &[(f64, usize, u64)]) -> Vec<Option<usize>> {
    let mut by_time: Vec<usize> = (0..seq.len()).collect();
    by_time.sort_by(|&a, &b| seq[a].0.total_cmp(&seq[b].0).then(a.cmp(&b)));
    let mut pred = vec![None; seq.len()];
    for w in by_time.windows(2) {
        pred[w[1]] = Some(w[0]);
    }
    pred
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
mod tests;
