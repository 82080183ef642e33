//! **Stage: graph.** In: joined instances. Out: iterations and what each
//! rank costs in them. [`iteration`] tells where a training step begins and
//! ends; [`itergraph`] turns one sealed iteration into a plain graph;
//! [`whatif`] replays it with a rank at its peers' speed (the cost);
//! [`cost`] applies that to each subject, with [`reference`] (the roles'
//! work when nobody is slow) as the floor of its peers; [`structure`] reads stage and
//! work imbalance from it, [`spread`] whether imbalance explains a
//! slowdown; this module keeps the wait graph of who waited
//! for whom.
//!
//! The dependency graph of waiting, and what each root costs.
//!
//! Nodes are ranks and slow links; an edge `A → B` weighs how long A waited
//! for B (B arrived last in an instance A was in, summed over an iteration).
//! Pipeline, tensor and data-parallel communicators all add edges, so a slow
//! stage-1 rank shows as stage-2 ranks waiting for it (p2p), and stage-2's
//! data-parallel peers waiting for stage 2.
//!
//! Blame starts where it is inflicted (the edge's target) and flows on to
//! whoever *that* rank waited for, in proportion to how much of its own
//! lateness its waiting explains (`pass_through`, 0 for a root, 1 for a pure
//! victim). After a few rounds blame rests on the ranks where waiting starts;
//! the sum is the GPU time lost to each, since every waiting ns idles one GPU.

pub mod cost;
pub mod iteration;
pub mod itergraph;
pub mod reference;
pub mod spread;
pub mod structure;
pub mod whatif;

use foldhash::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Node {
    Rank(u32),
    /// A slow link between two ranks (lower rank first).
    Link(u32, u32),
}

#[derive(Debug, Default)]
pub struct WaitGraph {
    g: DiGraph<Node, f64>,
    idx: HashMap<Node, NodeIndex>,
}

impl WaitGraph {
    pub fn new() -> Self {
        Self::default()
    }

    fn node(&mut self, n: Node) -> NodeIndex {
        *self.idx.entry(n).or_insert_with(|| self.g.add_node(n))
    }

    /// Adds `w` ns of `from` waiting for `to` (parallel edges merge).
    pub fn add_wait(&mut self, from: Node, to: Node, w: f64) {
        if w <= 0.0 || from == to {
            return;
        }
        let (a, b) = (self.node(from), self.node(to));
        match self.g.find_edge(a, b) {
            Some(e) => self.g[e] += w,
            None => {
                self.g.add_edge(a, b, w);
            }
        }
    }

    /// Builds the graph of one iteration's rank-to-rank waits.
    pub fn from_edges(edges: &HashMap<(u32, u32), f64>) -> Self {
        let mut g = Self::new();
        let mut sorted: Vec<(&(u32, u32), &f64)> = edges.iter().collect();
        sorted.sort_by_key(|(k, _)| **k);
        for ((a, b), w) in sorted {
            g.add_wait(Node::Rank(*a), Node::Rank(*b), *w);
        }
        g
    }

    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    /// Total wait others spent on `n` directly (ns).
    pub fn inflicted(&self, n: Node) -> f64 {
        self.idx.get(&n).map_or(0.0, |i| {
            self.g
                .edges_directed(*i, Direction::Incoming)
                .map(|e| *e.weight())
                .sum()
        })
    }

    /// Total wait `n` spent on others (ns).
    pub fn suffered(&self, n: Node) -> f64 {
        self.idx.get(&n).map_or(0.0, |i| {
            self.g
                .edges_directed(*i, Direction::Outgoing)
                .map(|e| *e.weight())
                .sum()
        })
    }

    /// Where blame comes to rest. `pass_through[n]` in [0, 1] is the share of
    /// the blame a node receives that it hands on to those it waited for
    /// (missing: 0, i.e. a root). Returns ns of waiting attributed to each node.
    pub fn blame(&self, pass_through: &HashMap<Node, f64>, rounds: usize) -> HashMap<Node, f64> {
        let n = self.g.node_count();
        let mut flow = vec![0.0; n];
        let mut rest = vec![0.0; n];
        for e in self.g.edge_references() {
            flow[e.target().index()] += *e.weight();
        }
        for _ in 0..rounds {
            let mut next = vec![0.0; n];
            for i in self.g.node_indices() {
                let f = flow[i.index()];
                if f <= 0.0 {
                    continue;
                }
                let p = pass_through
                    .get(&self.g[i])
                    .copied()
                    .unwrap_or(0.0)
                    .clamp(0.0, 1.0);
                let out: f64 = self
                    .g
                    .edges_directed(i, Direction::Outgoing)
                    .map(|e| *e.weight())
                    .sum();
                if p <= 0.0 || out <= 0.0 {
                    rest[i.index()] += f;
                    continue;
                }
                rest[i.index()] += f * (1.0 - p);
                for e in self.g.edges_directed(i, Direction::Outgoing) {
                    next[e.target().index()] += f * p * *e.weight() / out;
                }
            }
            flow = next;
        }
        for i in 0..n {
            rest[i] += flow[i];
        }
        self.g
            .node_indices()
            .filter(|i| rest[i.index()] > 0.0)
            .map(|i| (self.g[i], rest[i.index()]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foldhash::HashMapExt;

    /// Stage-1 rank 1 is slow; stage-2 rank 2 waits for it (p2p) and is then
    /// late for its DP peers 3, 4. Blame rests on 1, not on the victim 2.
    #[test]
    fn blame_flows_from_victim_to_root() {
        let mut edges = HashMap::new();
        edges.insert((2, 1), 10.0);
        edges.insert((0, 1), 8.0); // rank 1's own DP peer
        edges.insert((3, 2), 9.0);
        edges.insert((4, 2), 9.0);
        let g = WaitGraph::from_edges(&edges);
        assert_eq!(g.inflicted(Node::Rank(2)), 18.0);
        assert_eq!(g.suffered(Node::Rank(2)), 10.0);
        let mut pass = HashMap::new();
        pass.insert(Node::Rank(2), 1.0);
        let b = g.blame(&pass, 4);
        assert_eq!(b.get(&Node::Rank(1)).copied(), Some(36.0));
        assert!(!b.contains_key(&Node::Rank(2)));
        // Half a victim keeps half.
        pass.insert(Node::Rank(2), 0.5);
        let b = g.blame(&pass, 4);
        assert_eq!(b.get(&Node::Rank(2)).copied(), Some(9.0));
        assert_eq!(b.get(&Node::Rank(1)).copied(), Some(27.0));
    }

    #[test]
    fn cycles_terminate_and_conserve_blame() {
        let mut edges = HashMap::new();
        edges.insert((0, 1), 5.0);
        edges.insert((1, 0), 5.0);
        let g = WaitGraph::from_edges(&edges);
        let pass: HashMap<Node, f64> = [(Node::Rank(0), 1.0), (Node::Rank(1), 1.0)]
            .into_iter()
            .collect();
        let b = g.blame(&pass, 7);
        let total: f64 = b.values().sum();
        assert!((total - 10.0).abs() < 1e-9);
    }
}
