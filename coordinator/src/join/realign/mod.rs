//! Lining up the collectives of a member whose agent restarted.
//!
//! In: the communicators a restarted agent took over
//! ([`CommRecord::resumed`](slowrank_shared::wire::CommRecord::resumed)),
//! that member's records (numbered again from 0 at the takeover) and the
//! other members' records of the same communicator. Out: the member's
//! records with the sequence numbers of the instances they belong to, or
//! counted as lost.
//!
//! The collectives issued while no agent watched the member are unknown,
//! so its new numbers are off by an unknown offset. The offset is found the
//! way one lines up two copies of a log: the member's first records must
//! name the same operations and sizes as the instances the other members
//! report at that offset (a training step repeats a pattern, which leaves
//! only whole periods), and among those the offset whose instances the
//! other members entered closest in time to this member wins (a period
//! apart is one step apart in time). Every member of a collective enters it
//! within the step's skew, so the right offset is the one whose time
//! differences are smallest.
//!
//! Pure: the caller passes times; nothing here reads a clock.
//!
//! A communicator whose members all restarted with one agent (a
//! tensor-parallel group inside the host) has nobody else to line up with:
//! after [`PATIENCE_NS`] its members are lined up with each other
//! ([`Realigner::among_themselves`]).
//!
//! Limits: point-to-point records are matched by their order between two members,
//! which the gap breaks, so a taken-over member's are counted lost too.

use foldhash::HashMap;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use slowrank_shared::wire::{CollOp, CollectiveRecord};

use crate::clock::CoordNs;

mod offset;
#[cfg(test)]
use offset::Probe;
use offset::{choose_offset, line_up, probes};
pub use offset::{NoFit, Waiting};

/// Records of a taken-over member that must match the other members'
/// instances, operation and size, before its offset is trusted. One step
/// of a data-parallel job holds a handful of collectives; 8 spans more
/// than one step of most jobs, so a repeated pattern cannot match at a
/// wrong offset within the step.
pub const MIN_MATCHED: usize = 8;

/// Records of the member used to line it up (its first ones).
const WINDOW: usize = 32;

/// The other members' reports must reach this far past the newest record
/// used, so that the instances they belong to are known: agents ship
/// every 200 ms by default.
const COVER_NS: CoordNs = 1_000_000_000;

/// Past this, a member is lined up with whatever is known.
const PATIENCE_NS: CoordNs = 10_000_000_000;

/// Records held per member while it waits, at most; past it the oldest is
/// counted lost (10 s of a fast 8-rank group's 100 collectives a second,
/// several times over).
const MAX_HELD: usize = 4_096;

/// Other members' instances remembered per communicator being lined up.
const MAX_REFS: usize = 16_384;

/// Earlier takeovers of one member kept while a newer one holds it: an
/// agent killed again before its member was lined up (seconds after it
/// attached) leaves records that still belong somewhere. Past this many
/// the oldest's held records are counted lost.
const MAX_EARLIER: usize = 4;

/// How far from the member's records (in time) an instance may lie and
/// still be a candidate: a step is well under this.
const SEARCH_NS: CoordNs = 5_000_000_000;

/// What to do with one record.
#[derive(Debug, PartialEq)]
pub enum Route {
    /// Offer it to the join (renumbered when its member was lined up).
    Offer(CollectiveRecord),
    /// Held until its member is lined up.
    Held,
    /// Cannot be placed (a taken-over member's point-to-point operation).
    Lost,
}

/// Records released by [`Realigner::poll`], for the join.
#[derive(Debug)]
pub struct Released {
    pub host: Arc<str>,
    pub comm_id: u64,
    pub rank: u32,
    pub offset: u64,
    pub records: Vec<CollectiveRecord>,
    /// How well the offset fit, when it was matched against other members.
    pub fit: Option<Fit>,
    /// What the choice rested on, for the log.
    pub basis: Option<Basis>,
    /// An earlier agent's member, released after a later agent took the
    /// member over: its records' numbers may lie below what the later one
    /// already sent, and their instances may have closed meanwhile.
    pub superseded: bool,
}

/// What a line-up against other members rested on: how long the member had
/// been held, how many of its held records the others' reports covered, and
/// the window of them that decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Basis {
    pub waited_ns: CoordNs,
    pub held: usize,
    pub covered: usize,
    /// Lined up with whatever was known ([`PATIENCE_NS`] passed).
    pub patient: bool,
    pub window_start: usize,
    pub window_len: usize,
}

/// How well a line-up fit: the mean entry difference at the chosen offset
/// and at the best other one (for the log: a runner-up nearly as close
/// means the choice was nearly a toss).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub mean_ns: CoordNs,
    pub runner_up_ns: Option<CoordNs>,
}

impl Fit {
    /// How clearly the chosen offset won: the runner-up's mean difference
    /// over the chosen one's (infinite without a runner-up).
    pub fn clarity(&self) -> f64 {
        self.runner_up_ns.map_or(f64::INFINITY, |r| {
            r.max(0) as f64 / self.mean_ns.max(1) as f64
        })
    }
}

/// A member still held, and what its line-up lacks (for the log).
#[derive(Debug, Clone, PartialEq)]
pub struct StillHeld {
    pub comm_id: u64,
    pub rank: u32,
    pub host: Arc<str>,
    pub held: usize,
    /// Entries of its first and last held records (coordinator clock, as
    /// held: not remapped).
    pub held_entries: (CoordNs, CoordNs),
    /// The last sequence number the join had of it before the takeover.
    pub floor: Option<u64>,
    /// The other members' instances known: how many, their number range
    /// and entry range.
    pub refs: usize,
    pub ref_seqs: Option<(u64, u64)>,
    pub ref_entries: Option<(CoordNs, CoordNs)>,
    pub why: Waiting,
}

/// Counters, for `report.json` and `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RealignCounters {
    /// Members whose communicator a restarted agent took over.
    pub taken_over: u64,
    /// Of those, lined up with the other members.
    pub lined_up: u64,
    /// Records renumbered and offered to the join.
    pub records: u64,
    /// Records that could not be placed (held too long or too many,
    /// point-to-point).
    pub lost: u64,
    /// Records held now.
    pub held: u64,
}

impl RealignCounters {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug)]
struct Ref {
    op: CollOp,
    bytes: u64,
    /// The earliest entry any other member reported.
    entry: CoordNs,
}

#[derive(Debug)]
enum State {
    Holding {
        host: Arc<str>,
        /// The last sequence number known from before the takeover.
        floor: Option<u64>,
        since: CoordNs,
        held: VecDeque<(CollectiveRecord, CoordNs)>,
    },
    LinedUp {
        offset: u64,
    },
}

#[derive(Debug)]
struct Member {
    /// The agent that took it over: only its records are renumbered (the
    /// old agent's late ones carry the right numbers).
    agent_id: String,
    state: State,
    /// Earlier takeovers by agents that died in turn, oldest first: each
    /// numbered its records from 0 again, so each is lined up (and its
    /// late records renumbered) on its own.
    earlier: Vec<(String, State)>,
}

impl Member {
    /// The takeovers of this member, oldest first, the current one last.
    fn generations(&self) -> impl Iterator<Item = &State> {
        self.earlier.iter().map(|(_, s)| s).chain([&self.state])
    }
}

fn held_len(state: &State) -> usize {
    match state {
        State::Holding { held, .. } => held.len(),
        State::LinedUp { .. } => 0,
    }
}

/// Every taken-over member, keyed by (communicator, global rank).
#[derive(Debug, Default)]
pub struct Realigner {
    members: HashMap<(u64, u32), Member>,
    refs: HashMap<u64, BTreeMap<u64, Ref>>,
    /// Members per communicator being lined up.
    nranks: HashMap<u64, u32>,
    counters: RealignCounters,
}

impl Realigner {
    /// Whether anything is being lined up or renumbered (a fast path for
    /// the ingest of jobs that never had an agent restart).
    pub fn is_idle(&self) -> bool {
        self.members.is_empty()
    }

    /// Ranks with a membership still held here (taken over, not lined up
    /// yet): their agent is current, but their records are not in the join,
    /// so an instance they are absent from is not hung for want of them.
    pub fn holding_ranks(&self) -> foldhash::HashSet<u32> {
        self.members
            .iter()
            .filter(|(_, m)| m.generations().any(|g| matches!(g, State::Holding { .. })))
            .map(|((_, rank), _)| *rank)
            .collect()
    }

    pub fn counters(&self) -> RealignCounters {
        let mut c = self.counters;
        c.held = self
            .members
            .values()
            .flat_map(Member::generations)
            .map(|g| held_len(g) as u64)
            .sum();
        c
    }

    /// Agent `agent_id` took over `rank`'s membership of `comm_id`; `floor`
    /// is the last sequence number the join has of that member. Said again
    /// by the same agent (its preamble after a reconnection), nothing
    /// changes.
    #[allow(clippy::too_many_arguments)]
    pub fn take_over(
        &mut self,
        comm_id: u64,
        nranks: u32,
        rank: u32,
        agent_id: &str,
        host: &Arc<str>,
        floor: Option<u64>,
        now: CoordNs,
    ) {
        if self
            .members
            .get(&(comm_id, rank))
            .is_some_and(|m| m.agent_id == agent_id)
        {
            return;
        }
        self.counters.taken_over += 1;
        self.refs.entry(comm_id).or_default();
        self.nranks.insert(comm_id, nranks);
        let state = State::Holding {
            host: host.clone(),
            floor,
            since: now,
            held: VecDeque::new(),
        };
        let key = (comm_id, rank);
        let Some(m) = self.members.get_mut(&key) else {
            self.members.insert(
                key,
                Member {
                    agent_id: agent_id.to_owned(),
                    state,
                    earlier: Vec::new(),
                },
            );
            return;
        };
        // The agent before this one took it over too and died in turn
        // (chaos: two kills seconds apart; its held records were once
        // counted lost here, 24 in one run of 8).
        let before = std::mem::replace(&mut m.agent_id, agent_id.to_owned());
        let state = std::mem::replace(&mut m.state, state);
        m.earlier.push((before, state));
        if m.earlier.len() > MAX_EARLIER {
            let (_, oldest) = m.earlier.remove(0);
            self.counters.lost += held_len(&oldest) as u64;
        }
    }

    /// Routes one checked record from `agent_id`; `entry` is its host
    /// entry on the coordinator clock.
    pub fn route(&mut self, mut rec: CollectiveRecord, agent_id: &str, entry: CoordNs) -> Route {
        let comm_id = rec.comm_id;
        let Some(m) = self.members.get_mut(&(comm_id, rec.rank)) else {
            self.reference(&rec, entry);
            return Route::Offer(rec);
        };
        let state = if m.agent_id == agent_id {
            &mut m.state
        } else if let Some((_, s)) = m.earlier.iter_mut().find(|(a, _)| a == agent_id) {
            // An earlier takeover's agent, shipped late: numbered from its
            // own takeover.
            s
        } else {
            // The original agent's, shipped late: numbered before the gap.
            self.reference(&rec, entry);
            return Route::Offer(rec);
        };
        if matches!(rec.op, CollOp::Send | CollOp::Recv) {
            self.counters.lost += 1;
            return Route::Lost;
        }
        match state {
            State::LinedUp { offset } => {
                rec.seq += *offset;
                self.counters.records += 1;
                self.reference(&rec, entry);
                Route::Offer(rec)
            }
            State::Holding { held, .. } => {
                if held.len() >= MAX_HELD {
                    held.pop_front();
                    self.counters.lost += 1;
                }
                held.push_back((rec, entry));
                Route::Held
            }
        }
    }

    /// Notes instances of `comm_id` the other members reported before its
    /// takeover was known (`(seq, op, bytes, entry)`, from the join's open
    /// instances). Without them a member whose new agent reached the
    /// coordinator only after the others had shipped their last record
    /// waited for references that never came: a CI run ended with 928
    /// records held, `NoReferences`, because the restarted agent was
    /// refused until the killed one's connection timed out and the job had
    /// ended by then.
    pub fn seed(
        &mut self,
        comm_id: u64,
        known: impl IntoIterator<Item = (u64, CollOp, u64, CoordNs)>,
    ) {
        let Some(refs) = self.refs.get_mut(&comm_id) else {
            return;
        };
        for (seq, op, bytes, entry) in known {
            if matches!(op, CollOp::Send | CollOp::Recv) {
                continue;
            }
            refs.entry(seq)
                .and_modify(|r| r.entry = r.entry.min(entry))
                .or_insert(Ref { op, bytes, entry });
        }
        while refs.len() > MAX_REFS {
            refs.pop_first();
        }
    }

    /// Notes another member's instance of a communicator being lined up.
    fn reference(&mut self, rec: &CollectiveRecord, entry: CoordNs) {
        if matches!(rec.op, CollOp::Send | CollOp::Recv) {
            return;
        }
        let Some(refs) = self.refs.get_mut(&rec.comm_id) else {
            return;
        };
        refs.entry(rec.seq)
            .and_modify(|r| r.entry = r.entry.min(entry))
            .or_insert(Ref {
                op: rec.op,
                bytes: rec.bytes,
                entry,
            });
        while refs.len() > MAX_REFS {
            refs.pop_first();
        }
    }

    /// Lines up the members that can be, releasing their held records.
    pub fn poll(&mut self, now: CoordNs) -> Vec<Released> {
        self.poll_remapped(now, &|_, _| None)
    }

    /// [`Realigner::poll`], with held records' entries mapped again through
    /// `remap(host, agent entry)` (the host's clock as known now) where it
    /// gives one. A held record's entry was mapped when it arrived: right
    /// after an agent restart, with a clock model still settling. One
    /// agent-restart run lined a member up 3 instances off from its first
    /// 71 records (mean difference 48 ms at the offset it chose; the
    /// records fit the right one within 7 ms), while its host's other
    /// members, lined up 0.4 s later, fit within 5–8 ms.
    pub fn poll_remapped(
        &mut self,
        now: CoordNs,
        remap: &dyn Fn(&str, u64) -> Option<CoordNs>,
    ) -> Vec<Released> {
        self.poll_with(now, remap, false)
    }

    /// At the end of the input (the job over, the coordinator stopping):
    /// nothing more will arrive to cover a held record, so every member
    /// that can be is lined up with what is known, as after its patience.
    /// A job that ended 1.2 s after a restarted agent connected left 468
    /// records held, never joined, while 117 per member were enough to
    /// line them up (stop 49).
    pub fn finish_remapped(
        &mut self,
        now: CoordNs,
        remap: &dyn Fn(&str, u64) -> Option<CoordNs>,
    ) -> Vec<Released> {
        self.poll_with(now, remap, true)
    }

    fn poll_with(
        &mut self,
        now: CoordNs,
        remap: &dyn Fn(&str, u64) -> Option<CoordNs>,
        ended: bool,
    ) -> Vec<Released> {
        let mut out = Vec::new();
        let counters = &mut self.counters;
        for (&(comm_id, rank), m) in self.members.iter_mut() {
            let refs = self.refs.get(&comm_id).filter(|r| !r.is_empty());
            let earlier = m.earlier.len();
            let generations = m.earlier.iter_mut().map(|(_, g)| g).chain([&mut m.state]);
            for (i, g) in generations.enumerate() {
                let Some((offset, fit, basis)) =
                    refs.and_then(|refs| choose_offset(g, refs, now, remap, ended).ok())
                else {
                    continue;
                };
                // Records whose instances closed before the takeover was known
                // are offered too: the join counts them as replayed and
                // unjoinable, the others still join.
                let mut r = release(g, comm_id, rank, offset, counters);
                r.fit = Some(fit);
                r.basis = Some(basis);
                r.superseded = i < earlier;
                out.push(r);
            }
            // An earlier takeover that nothing could line up in twice the
            // patience (its communicator has no other member to match) is
            // given up, counted.
            m.earlier.retain(|(_, g)| match g {
                State::Holding { since, held, .. } if now - *since >= 2 * PATIENCE_NS => {
                    counters.lost += held.len() as u64;
                    false
                }
                _ => true,
            });
        }
        out.extend(self.among_themselves(now, ended));
        // References are needed only while someone waits for them.
        let waiting: foldhash::HashSet<u64> = self
            .members
            .iter()
            .filter(|(_, m)| m.generations().any(|g| matches!(g, State::Holding { .. })))
            .map(|((c, _), _)| *c)
            .collect();
        self.refs.retain(|c, _| waiting.contains(c));
        self.nranks.retain(|c, _| waiting.contains(c));
        out
    }
}

impl Realigner {
    /// Every takeover still held, with what its line-up lacks as of `now`
    /// (with the input `ended` or not), for the log: records that never
    /// join must say why.
    pub fn still_held(
        &self,
        now: CoordNs,
        remap: &dyn Fn(&str, u64) -> Option<CoordNs>,
        ended: bool,
    ) -> Vec<StillHeld> {
        let mut out = Vec::new();
        for (&(comm_id, rank), m) in &self.members {
            let refs = self.refs.get(&comm_id);
            for g in m.generations() {
                let State::Holding {
                    host, floor, held, ..
                } = g
                else {
                    continue;
                };
                let why = match refs.filter(|r| !r.is_empty()) {
                    None => Waiting::NoReferences,
                    Some(r) => match choose_offset(g, r, now, remap, ended) {
                        Ok(_) => continue,
                        Err(w) => w,
                    },
                };
                let entries = |r: &BTreeMap<u64, Ref>| {
                    r.values().fold(None, |acc: Option<(CoordNs, CoordNs)>, x| {
                        Some(acc.map_or((x.entry, x.entry), |(lo, hi)| {
                            (lo.min(x.entry), hi.max(x.entry))
                        }))
                    })
                };
                out.push(StillHeld {
                    comm_id,
                    rank,
                    host: host.clone(),
                    held: held.len(),
                    held_entries: (
                        held.front().map_or(0, |h| h.1),
                        held.back().map_or(0, |h| h.1),
                    ),
                    floor: *floor,
                    refs: refs.map_or(0, BTreeMap::len),
                    ref_seqs: refs
                        .and_then(|r| Some((*r.first_key_value()?.0, *r.last_key_value()?.0))),
                    ref_entries: refs.and_then(entries),
                    why,
                });
            }
        }
        out.sort_by_key(|s| (s.comm_id, s.rank));
        out
    }
}

impl Realigner {
    /// Communicators whose every member was taken over by one restarted
    /// agent (a tensor-parallel group inside one host) have nobody else to
    /// line up with: once they have waited [`PATIENCE_NS`] without any
    /// other member's record, they are lined up with each other. The
    /// member whose records start earliest is the anchor, numbered on from
    /// the highest number any of them used before the gap (the count of
    /// what was missed is unknown, and nobody else needs it); the others
    /// are matched to its records as to another member's.
    fn among_themselves(&mut self, now: CoordNs, ended: bool) -> Vec<Released> {
        let mut groups: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (&(comm_id, rank), m) in &self.members {
            if let State::Holding { since, held, .. } = &m.state {
                let alone = self.refs.get(&comm_id).is_none_or(|r| r.is_empty());
                if alone && (ended || now - *since >= PATIENCE_NS) && held.len() >= MIN_MATCHED {
                    groups.entry(comm_id).or_default().push(rank);
                }
            }
        }
        let mut out = Vec::new();
        for (comm_id, mut ranks) in groups {
            let nranks = self.nranks.get(&comm_id).copied().unwrap_or(0) as usize;
            if ranks.len() != nranks {
                continue;
            }
            ranks.sort_unstable();
            let first = |r: &u32| match &self.members[&(comm_id, *r)].state {
                State::Holding { held, .. } => held.front().map_or(CoordNs::MAX, |h| h.1),
                State::LinedUp { .. } => CoordNs::MAX,
            };
            let Some(&anchor) = ranks.iter().min_by_key(|r| first(r)) else {
                continue;
            };
            let base = ranks
                .iter()
                .filter_map(|r| match &self.members[&(comm_id, *r)].state {
                    State::Holding { floor, .. } => *floor,
                    State::LinedUp { .. } => None,
                })
                .max()
                .map_or(0, |f| f + 1);
            let State::Holding { held, .. } = &self.members[&(comm_id, anchor)].state else {
                continue;
            };
            let a0 = held.front().map_or(0, |h| h.0.seq);
            // Never below the anchor's own numbers (an offset is added).
            let base = base.max(a0);
            let refs: BTreeMap<u64, Ref> = held
                .iter()
                .map(|(r, e)| {
                    let entry = *e;
                    (
                        base + (r.seq - a0),
                        Ref {
                            op: r.op,
                            bytes: r.bytes,
                            entry,
                        },
                    )
                })
                .collect();
            let mut offsets = vec![(anchor, base - a0)];
            for &rank in ranks.iter().filter(|r| **r != anchor) {
                let State::Holding { held, .. } = &self.members[&(comm_id, rank)].state else {
                    continue;
                };
                let s0 = held.front().map_or(0, |h| h.0.seq);
                let window = probes(held.iter().take(WINDOW).map(|(r, e)| (r, *e)));
                match line_up(&window, &refs, base.checked_sub(1)).and_then(|k| k.checked_sub(s0)) {
                    Some(offset) => offsets.push((rank, offset)),
                    None => break,
                }
            }
            if offsets.len() != ranks.len() {
                continue;
            }
            for (rank, offset) in offsets {
                if let Some(m) = self.members.get_mut(&(comm_id, rank)) {
                    out.push(release(
                        &mut m.state,
                        comm_id,
                        rank,
                        offset,
                        &mut self.counters,
                    ));
                }
            }
        }
        out
    }
}

/// Lines the takeover `state` up at `offset`: its held records renumbered,
/// for the join.
fn release(
    state: &mut State,
    comm_id: u64,
    rank: u32,
    offset: u64,
    counters: &mut RealignCounters,
) -> Released {
    let (host, records) = match state {
        State::Holding { host, held, .. } => (
            host.clone(),
            held.drain(..)
                .map(|(mut r, _)| {
                    r.seq += offset;
                    r
                })
                .collect::<Vec<_>>(),
        ),
        State::LinedUp { .. } => (Arc::from(""), Vec::new()),
    };
    counters.lined_up += 1;
    counters.records += records.len() as u64;
    *state = State::LinedUp { offset };
    Released {
        host,
        comm_id,
        rank,
        offset,
        records,
        fit: None,
        basis: None,
        superseded: false,
    }
}

#[cfg(test)]
mod tests;
