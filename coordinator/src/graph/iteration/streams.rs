//! Which iteration a non-reference instance belongs to, by its own ordinal.
//!
//! An instance outside the reference communicator (another stage's
//! all-reduce, a tensor-parallel collective, a pipeline send) has no step
//! number of its own; by default it goes to the iteration its start time
//! falls in. That is wrong exactly when it matters: with one rank slow, the
//! fast pipeline replicas start step *k + 1*'s sends before the reference
//! (stage 0's all-reduce, which waits for the slow rank) ends step *k*, so
//! their iteration *k* holds step *k + 1*'s instances while the slow rank's
//! holds step *k*'s. The what-if then finds the slow rank alone in its
//! role, with no peers to be replayed at, and costs it nothing (spec
//! 9241-8: 0.3 % reported against 37.8 % measured).
//!
//! Every rank issues the same instances per step on a stream (a
//! communicator's collectives, or one pipeline pair's point-to-point
//! operations), so each stream's ordinal says the step once its own
//! period is known: `iteration = ⌊(ordinal − origin) / per_step⌋`. Both
//! are learnt from the time-placed instances of a few iterations
//! (`stream_learn_iterations`): `per_step` from how far the median
//! ordinal moves from one iteration to the next, `origin` as the value
//! most instances agree with (`stream_agreement`).
//!
//! A straggler present while a stream is learnt shifts that stream's time
//! placement by a step, which its own samples cannot tell from a stream
//! that starts a step later; its replicas can. The pipeline pairs of one
//! stage boundary on different replicas (the same positions, told apart
//! by their members' stage groups) take the origin most of them learnt,
//! when more than half agree. Collective streams keep their own: the
//! groups of different stages look alike and legitimately start their
//! steps at different points of the reference's.
//!
//! A stream whose count per step varies, or whose time placement agrees
//! with no origin, stays placed by time, as does every stream until it is
//! learnt. A learnt stream that drifts `stream_drift_iterations` or more
//! from the time placement for a whole step's worth of instances in a row
//! (an extra collective every N steps) is learnt again.
//!
//! Off by default (`[iteration] stream_learn_iterations = 0`): each
//! stream learns its own cut, and a rank with two streams (a middle
//! pipeline stage) can have them cut a step apart, which mixes two steps
//! in its chain (see the key's doc in `thresholds.md`).
//!
//! Pure: ordinals and iterations in, iterations out.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::IterationConfig;

/// One stream: a communicator's collectives, or one pair's p2p operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub comm_id: u64,
    /// `(lo, hi)` positions of a point-to-point pair; `None` for collectives.
    pub pair: Option<(u32, u32)>,
}

/// Collective communicators remembered per rank, for telling replicas.
const COMMS_PER_RANK: usize = 8;

#[derive(Debug)]
enum Stream {
    /// (ordinal, iteration by time) of instances whose start fell inside
    /// known iterations, by iteration.
    Learning(BTreeMap<u64, Vec<u64>>),
    Learnt {
        per_step: u64,
        /// What its own samples said.
        own: i64,
        /// What it is placed by: its replicas' majority, or its own.
        origin: i64,
        /// Consecutive placements `drift_iterations` or more off.
        drifting: u64,
    },
    /// Too many instances a step to learn: placed by time.
    ByTime,
}

/// Streams of one role on different replicas: the same pair positions,
/// size and step, and members that belong to the same other
/// communicators (a stage's data-parallel group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Role {
    pair: Option<(u32, u32)>,
    nranks: u32,
    per_step: u64,
    /// Per member, the largest other collective communicator it is in
    /// (lowest id on ties), sorted.
    others: Vec<u64>,
}

/// Per-stream ordinal → iteration rules.
#[derive(Debug)]
pub struct StreamSteps {
    /// [`IterationConfig::stream_learn_iterations`] and its siblings.
    learn_iterations: usize,
    agreement: f64,
    drift_iterations: u64,
    max_samples: usize,
    streams: HashMap<StreamKey, Stream>,
    /// Members (ranks) and size of each stream's communicator.
    members: HashMap<StreamKey, (u32, Vec<u32>)>,
    /// rank → (size, id) of the collective communicators it is in.
    comms_of: HashMap<u32, Vec<(u32, u64)>>,
    comms_seen: HashSet<u64>,
}

impl StreamSteps {
    pub fn new(cfg: &IterationConfig) -> Self {
        Self {
            learn_iterations: cfg.stream_learn_iterations,
            agreement: cfg.stream_agreement,
            drift_iterations: cfg.stream_drift_iterations,
            max_samples: cfg.stream_max_samples,
            streams: HashMap::new(),
            members: HashMap::new(),
            comms_of: HashMap::new(),
            comms_seen: HashSet::new(),
        }
    }

    /// A collective communicator's members (the reference's too): once
    /// per communicator, for telling replicas apart.
    pub fn note_comm(&mut self, comm_id: u64, nranks: u32, ranks: impl Iterator<Item = u32>) {
        if self.learn_iterations == 0 || !self.comms_seen.insert(comm_id) {
            return;
        }
        for r in ranks {
            let v = self.comms_of.entry(r).or_default();
            if v.len() < COMMS_PER_RANK {
                v.push((nranks, comm_id));
            }
        }
    }

    /// The iteration of `ordinal` on `key`. `by_time` is the iteration its
    /// start falls in, `known` whether that start lies inside iterations
    /// already seen (not extrapolated past the last one); `nranks` and
    /// `ranks` are the stream's communicator size and the instance's
    /// members.
    pub fn place(
        &mut self,
        key: StreamKey,
        ordinal: u64,
        by_time: u64,
        known: bool,
        nranks: u32,
        ranks: impl Iterator<Item = u32>,
    ) -> u64 {
        if self.learn_iterations == 0 {
            return by_time;
        }
        self.members.entry(key).or_insert_with(|| {
            let mut v: Vec<u32> = ranks.collect();
            v.sort_unstable();
            (nranks, v)
        });
        let (learn_iterations, agreement) = (self.learn_iterations, self.agreement);
        let (drift_iterations, max_samples) = (self.drift_iterations, self.max_samples);
        let s = self
            .streams
            .entry(key)
            .or_insert_with(|| Stream::Learning(BTreeMap::new()));
        let learnt = match s {
            Stream::ByTime => return by_time,
            Stream::Learnt {
                per_step,
                origin,
                drifting,
                ..
            } => {
                let it = iteration_by(ordinal, *per_step, *origin);
                if known && it.abs_diff(by_time) >= drift_iterations {
                    *drifting += 1;
                    if *drifting >= *per_step {
                        tracing::debug!(?key, "stream drifted from its step: learnt again");
                        *s = Stream::Learning(BTreeMap::new());
                        return by_time;
                    }
                } else {
                    *drifting = 0;
                }
                return it;
            }
            Stream::Learning(samples) => {
                if !known {
                    return by_time;
                }
                samples.entry(by_time).or_default().push(ordinal);
                while samples.len() > learn_iterations {
                    samples.pop_first();
                }
                if samples.values().map(Vec::len).sum::<usize>() > max_samples {
                    *s = Stream::ByTime;
                    return by_time;
                }
                (samples.len() == learn_iterations)
                    .then(|| learn(samples, agreement))
                    .flatten()
            }
        };
        if let Some((per_step, own)) = learnt {
            tracing::debug!(?key, per_step, origin = own, "stream's step learnt");
            *s = Stream::Learnt {
                per_step,
                own,
                origin: own,
                drifting: 0,
            };
            self.agree(key);
        }
        by_time
    }

    /// Streams placed by their own ordinal now.
    pub fn learnt(&self) -> usize {
        self.streams
            .values()
            .filter(|s| matches!(s, Stream::Learnt { .. }))
            .count()
    }

    /// A pipeline pair's role: its positions, size and step, and per
    /// member the largest other collective communicator that holds none of
    /// the pair's other members (its stage's data-parallel group). `None`
    /// for a collective stream: the data-parallel and tensor-parallel
    /// groups of different stages share every such trait, yet their steps
    /// start at different points of the reference's (a pp4 × dp4 job's
    /// stage 2 group took the other stages' origin, and its stage
    /// imbalance was put on stage 3).
    fn role(&self, key: StreamKey, per_step: u64) -> Option<Role> {
        key.pair?;
        let (nranks, ranks) = self.members.get(&key)?;
        let holds = |r: &u32, c: u64| {
            self.comms_of
                .get(r)
                .is_some_and(|v| v.iter().any(|x| x.1 == c))
        };
        let mut others: Vec<u64> = ranks
            .iter()
            .map(|r| {
                self.comms_of
                    .get(r)
                    .and_then(|v| {
                        v.iter()
                            .filter(|c| c.1 != key.comm_id)
                            .filter(|c| !ranks.iter().any(|m| m != r && holds(m, c.1)))
                            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
                    })
                    .map_or(0, |c| c.1)
            })
            .collect();
        others.sort_unstable();
        Some(Role {
            pair: key.pair,
            nranks: *nranks,
            per_step,
            others,
        })
    }

    /// `key` was just learnt: every learnt stream of its role takes the
    /// origin more than half of them learnt, or keeps its own.
    fn agree(&mut self, key: StreamKey) {
        let Some(Stream::Learnt { per_step, .. }) = self.streams.get(&key) else {
            return;
        };
        let Some(role) = self.role(key, *per_step) else {
            return;
        };
        let peers: Vec<(StreamKey, i64)> = self
            .streams
            .iter()
            .filter_map(|(k, s)| match s {
                Stream::Learnt { per_step, own, .. } => Some((*k, *per_step, *own)),
                _ => None,
            })
            .filter(|(k, p, _)| self.role(*k, *p).as_ref() == Some(&role))
            .map(|(k, _, own)| (k, own))
            .collect();
        let mut votes: HashMap<i64, usize> = HashMap::new();
        for (_, o) in &peers {
            *votes.entry(*o).or_default() += 1;
        }
        let majority = votes
            .into_iter()
            .find(|(_, n)| 2 * n > peers.len())
            .map(|(o, _)| o);
        for (k, _) in peers {
            if let Some(Stream::Learnt { own, origin, .. }) = self.streams.get_mut(&k) {
                let to = majority.unwrap_or(*own);
                if *origin != to {
                    tracing::debug!(key = ?k, own = *own, origin = to, "stream takes its replicas' step");
                }
                *origin = to;
            }
        }
    }
}

fn iteration_by(ordinal: u64, per_step: u64, origin: i64) -> u64 {
    (ordinal as i64 - origin)
        .div_euclid(per_step.max(1) as i64)
        .max(0) as u64
}

/// `(per_step, origin)` from time-placed samples (iteration → ordinals),
/// or `None` when no rule explains them.
fn learn(samples: &BTreeMap<u64, Vec<u64>>, agreement: f64) -> Option<(u64, i64)> {
    let first = *samples.keys().next()?;
    let last = *samples.keys().next_back()?;
    // Interior iterations only: the first and last may be partial.
    let medians: Vec<(u64, f64)> = samples
        .range(first + 1..last)
        .map(|(&k, v)| {
            let mut o: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            (k, crate::robust::median(&mut o).unwrap_or(0.0))
        })
        .collect();
    let mut steps: Vec<f64> = medians
        .windows(2)
        .filter(|w| w[1].0 == w[0].0 + 1)
        .map(|w| w[1].1 - w[0].1)
        .collect();
    if steps.len() < 2 {
        return None;
    }
    let per_step = crate::robust::median(&mut steps)?.round();
    if per_step < 1.0
        || steps
            .iter()
            .any(|d| (d - per_step).abs() > per_step / 2.0 + 1.0)
    {
        return None;
    }
    let per_step = per_step as u64;
    // A stream with a fixed count per step shows it in most iterations
    // (a boundary instance that flips moves one from k to k + 1); a count
    // that varies does not.
    let exact = samples
        .range(first + 1..last)
        .filter(|(_, v)| v.len() as u64 == per_step)
        .count();
    if 2 * exact <= medians.len() {
        return None;
    }
    // Each sample agrees with origins in (o − per_step·(k+1), o − per_step·k]:
    // the origin inside the most intervals wins.
    let n = per_step as i64;
    let mut edges: Vec<(i64, i32)> = Vec::new();
    let mut total = 0usize;
    for (&k, v) in samples {
        for &o in v {
            let hi = o as i64 - n * k as i64;
            edges.push((hi - n + 1, 1));
            edges.push((hi + 1, -1));
            total += 1;
        }
    }
    edges.sort_unstable();
    let (mut depth, mut best, mut at) = (0i32, 0i32, 0i64);
    for (x, d) in edges {
        depth += d;
        if depth > best {
            (best, at) = (depth, x);
        }
    }
    (best as f64 >= agreement * total as f64).then_some((per_step, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Learning on, as `stream_learn_iterations = 6` sets it.
    fn on() -> StreamSteps {
        StreamSteps::new(&IterationConfig {
            stream_learn_iterations: 6,
            ..IterationConfig::default()
        })
    }

    const KEY: StreamKey = StreamKey {
        comm_id: 7,
        pair: Some((0, 1)),
    };

    fn put(s: &mut StreamSteps, key: StreamKey, ordinal: u64, by_time: u64, known: bool) -> u64 {
        let r = 2 * key.comm_id as u32;
        s.place(key, ordinal, by_time, known, 2, [r, r + 1].into_iter())
    }

    /// Feeds `steps` steps of `per_step` instances (ordinals from
    /// `first`), each placed by time at `time_of(step, index)`.
    fn feed(
        s: &mut StreamSteps,
        per_step: u64,
        steps: u64,
        first: u64,
        time_of: impl Fn(u64, u64) -> u64,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        for k in 0..steps {
            for i in 0..per_step {
                out.push(put(s, KEY, first + k * per_step + i, time_of(k, i), true));
            }
        }
        out
    }

    #[test]
    fn learns_a_stream_placed_right_by_time() {
        let mut s = on();
        let got = feed(&mut s, 6, 12, 0, |k, _| k);
        assert_eq!(s.learnt(), 1);
        assert_eq!(got, (0..12).flat_map(|k| [k; 6]).collect::<Vec<_>>());
    }

    #[test]
    fn a_replica_ahead_by_a_step_gets_its_own_step_back() {
        // The fast replica's first two sends of step k+1 start before the
        // reference ends step k (placed in k by time) from step 8 on.
        let mut s = on();
        let got = feed(
            &mut s,
            6,
            14,
            0,
            |k, i| if k >= 8 && i < 2 { k - 1 } else { k },
        );
        assert_eq!(s.learnt(), 1);
        for (j, it) in got.iter().enumerate().skip(6 * 8) {
            assert_eq!(*it, j as u64 / 6, "ordinal {j}");
        }
    }

    #[test]
    fn a_straggler_from_the_first_step_alone_leaves_the_time_placement() {
        // Every step, 2 of 6 instances land one iteration early by time:
        // indistinguishable from a stream whose step starts 2 ordinals
        // later, so with no replicas the rule learnt is the time placement.
        let mut s = on();
        let got = feed(
            &mut s,
            6,
            12,
            0,
            |k, i| if k >= 1 && i < 2 { k - 1 } else { k },
        );
        assert_eq!(s.learnt(), 1);
        for (j, it) in got.iter().enumerate().skip(6) {
            let (k, i) = (j as u64 / 6, j as u64 % 6);
            assert_eq!(*it, if i < 2 { k - 1 } else { k }, "ordinal {j}");
        }
    }

    #[test]
    fn replicas_outvote_a_straggler_from_the_first_step() {
        // pp2 x dp4: stage 0 is ranks 0..4 (data-parallel group 100),
        // stage 1 ranks 4..8 (101); replica r's pipeline pair is (r, r+4)
        // on communicator 10 + r. Replica 3 has a straggler from the first
        // step: its sends land a whole step later by time.
        let mut s = on();
        s.note_comm(100, 4, 0..4);
        s.note_comm(101, 4, 4..8);
        let key = |r: u64| StreamKey {
            comm_id: 10 + r,
            pair: Some((0, 1)),
        };
        let mut last = Vec::new();
        for k in 0..12u64 {
            for r in 0..4u64 {
                for i in 0..6 {
                    let by_time = if r == 3 { k + 1 } else { k };
                    let it = s.place(
                        key(r),
                        6 * k + i,
                        by_time,
                        true,
                        2,
                        [r as u32, r as u32 + 4].into_iter(),
                    );
                    if k == 11 {
                        last.push((r, it));
                    }
                }
            }
        }
        assert_eq!(s.learnt(), 4);
        assert!(last.iter().all(|&(_, it)| it == 11), "{last:?}");
    }

    #[test]
    fn collective_streams_keep_their_own_step() {
        // Three data-parallel groups of a pp3 job: every member is in the
        // world (0), so nothing tells the stages apart, and stage 2's group
        // lands a step later by time. Two groups are no majority over it.
        let mut s = on();
        s.note_comm(0, 12, 0..12);
        let groups = [
            (20, [0, 1, 2, 3], 0),
            (21, [4, 5, 6, 7], 0),
            (22, [8, 9, 10, 11], 1),
        ];
        let streams = groups.map(|(comm_id, ranks, late)| {
            let key = StreamKey {
                comm_id,
                pair: None,
            };
            (key, ranks, late)
        });
        assert_eq!(play_streams(&mut s, &streams, 4), [11, 11, 12]);
        assert_eq!(s.learnt(), 3);
    }

    #[test]
    fn pipeline_pairs_of_different_boundaries_are_not_replicas() {
        // pp3 x dp2, one pipeline communicator per replica (10, 11): pairs
        // (0, 1) of both replicas start a step later by time than pair
        // (1, 2) of replica 0. Different boundaries never vote together.
        let mut s = on();
        s.note_comm(100, 2, [0, 1].into_iter());
        s.note_comm(101, 2, [2, 3].into_iter());
        s.note_comm(102, 2, [4, 5].into_iter());
        let streams = [
            (10, (0, 1), [0, 2], 1),
            (11, (0, 1), [1, 3], 1),
            (10, (1, 2), [2, 4], 0),
        ];
        let streams = streams.map(|(comm_id, pair, ranks, late)| {
            let key = StreamKey {
                comm_id,
                pair: Some(pair),
            };
            (key, ranks, late)
        });
        assert_eq!(play_streams(&mut s, &streams, 3), [12, 12, 11]);
        assert_eq!(s.learnt(), 3);
    }

    /// 12 steps of 4 instances on each stream (its members, and how many
    /// steps later than its ordinal its start time places it); returns
    /// where each stream's last instance went.
    fn play_streams<const N: usize>(
        s: &mut StreamSteps,
        streams: &[(StreamKey, [u32; N], u64); 3],
        nranks: u32,
    ) -> [u64; 3] {
        let mut got = [0; 3];
        for k in 0..12u64 {
            for i in 0..4 {
                for (g, (key, ranks, late)) in streams.iter().enumerate() {
                    got[g] = s.place(
                        *key,
                        4 * k + i,
                        k + late,
                        true,
                        nranks,
                        ranks.iter().copied(),
                    );
                }
            }
        }
        got
    }

    #[test]
    fn warm_up_instances_shift_the_origin() {
        // 3 instances before the first step, all in iteration 0.
        let mut s = on();
        for o in 0..3 {
            put(&mut s, KEY, o, 0, true);
        }
        feed(&mut s, 4, 10, 3, |k, _| k);
        assert_eq!(s.learnt(), 1);
        assert_eq!(put(&mut s, KEY, 3 + 4 * 15, 15, true), 15);
        assert_eq!(put(&mut s, KEY, 3 + 4 * 15 - 1, 15, true), 14);
    }

    #[test]
    fn a_stream_whose_count_varies_stays_by_time() {
        let mut s = on();
        let mut o = 0;
        for k in 0..30u64 {
            for _ in 0..(1 + (k * k * 7 + 3) % 9) {
                assert_eq!(put(&mut s, KEY, o, k, true), k);
                o += 1;
            }
        }
        assert_eq!(s.learnt(), 0);
    }

    #[test]
    fn extrapolated_times_teach_nothing() {
        let mut s = on();
        for o in 0..100 {
            assert_eq!(put(&mut s, KEY, o, o / 4, false), o / 4);
        }
        assert_eq!(s.learnt(), 0);
    }

    #[test]
    fn a_stream_that_changes_shape_is_learnt_again() {
        let mut s = on();
        feed(&mut s, 4, 10, 0, |k, _| k);
        assert_eq!(s.learnt(), 1);
        // From step 10 on, 8 a step: the ordinal rule runs ahead of time.
        let mut o = 40;
        for k in 10..30u64 {
            for _ in 0..8 {
                put(&mut s, KEY, o, k, true);
                o += 1;
            }
        }
        assert_eq!(s.learnt(), 1);
        assert_eq!(put(&mut s, KEY, o, 30, true), 30);
    }

    #[test]
    fn a_huge_stream_stays_by_time() {
        let mut s = on();
        feed(&mut s, 600, 8, 0, |k, _| k);
        assert_eq!(s.learnt(), 0);
        assert_eq!(put(&mut s, KEY, 600 * 8 + 5, 8, true), 8);
    }

    #[test]
    fn learning_off_keeps_every_stream_by_time() {
        let mut s = StreamSteps::new(&IterationConfig::default());
        let got = feed(
            &mut s,
            6,
            14,
            0,
            |k, i| if k >= 8 && i < 2 { k - 1 } else { k },
        );
        assert_eq!(s.learnt(), 0);
        assert_eq!(got[6 * 9], 8);
    }
}
