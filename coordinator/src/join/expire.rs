//! Expiry: instances some members entered and others never reached, past
//! the timeout, become hang candidates naming who is missing and what each
//! last completed; the rest close quietly.

use super::*;

impl Joiner {
    /// Closes instances whose first member entered more than the timeout
    /// before `now`; `to_coord` aligns an agent time of a host.
    ///
    /// A member that has not arrived is *missing* only when what we know of
    /// it is current past the timeout: `current(rank, host, deadline)` says
    /// whether its agent's data reaches beyond `deadline` (coordinator time)
    /// — agents batch and a loaded host ships late, and a member whose
    /// records are merely in flight is not hung. While some absent member is
    /// not yet current the instance stays open (up to `hang_stale_ns`). A
    /// member that already issued a later operation on the communicator is
    /// not missing either: its record for this one was lost.
    pub fn expire(
        &self,
        now: CoordNs,
        to_coord: impl Fn(&str, u64) -> CoordNs,
        current: impl Fn(u32, &str, CoordNs) -> bool,
    ) -> Vec<Expired> {
        let mut out = Vec::new();
        let mut work = 0usize;
        let mut kept: usize = self.comms.iter().map(|e| e.hangs.len()).sum();
        'comms: for mut entry in self.comms.iter_mut() {
            let comm_id = *entry.key();
            let st = &mut *entry;
            let due = self.due_instances(st, now, &to_coord);
            for (key, entered) in due {
                let stale = now.saturating_sub(entered) > self.cfg.hang_stale_ns;
                // A member never heard of on this communicator is not known
                // to be current: the instance waits until stale. Said
                // without walking every position of a huge communicator
                // each tick (members with records all have slots).
                if !stale
                    && matches!(key, InstanceKey::Coll(_))
                    && st.slots.len() < st.nranks as usize
                {
                    continue;
                }
                if work >= MAX_EXPIRE_WORK {
                    break 'comms;
                }
                let deadline = entered.saturating_add(self.cfg.hang_timeout_ns);
                // The member that kept the last instance undecided most
                // likely keeps this one undecided too: one lookup says so.
                work += 1;
                if !stale && holds_back(st, key, st.expire_blocker, deadline, &current) {
                    continue;
                }
                let (positions, unannounced) = match key {
                    InstanceKey::P2p { lo, hi, .. } => (vec![lo, hi], 0),
                    InstanceKey::Coll(_) => member_positions(st),
                };
                work += positions.len();
                let (present_ranks, absent, undecided) =
                    attendance(st, key, &positions, unannounced, deadline, &current, !stale);
                if let Some(p) = undecided {
                    st.expire_blocker = Some(p);
                    if !stale {
                        continue;
                    }
                }
                let seen = Attendance {
                    present_ranks,
                    absent,
                    unannounced,
                };
                out.push(self.close_expired(st, comm_id, key, entered, seen, &mut kept));
            }
        }
        // Communicators in id order (a stable sort keeps each one's oldest
        // first): the map's order is random per process, and replays must
        // give the same report every time.
        out.sort_by_key(|e| match e {
            Expired::Hang(h) => h.comm_id,
            Expired::Incomplete { comm_id, .. } => *comm_id,
        });
        out
    }

    /// Closes an expired instance: a hang candidate naming who is missing
    /// (kept for the report while few are), or quietly incomplete when
    /// nobody is.
    fn close_expired(
        &self,
        st: &mut CommState,
        comm_id: u64,
        key: InstanceKey,
        entered: CoordNs,
        seen: Attendance,
        kept: &mut usize,
    ) -> Expired {
        let open = st.open.remove(&key).expect("listed");
        self.open_total.fetch_sub(1, Ordering::Relaxed);
        st.close(key, self.closed_cap());
        let Attendance {
            present_ranks,
            mut absent,
            unannounced,
        } = seen;
        let summary = self.cut_missing(st, &mut absent, unannounced);
        let missing = missing_members(st, &absent);
        if missing.is_empty() && unannounced == 0 {
            self.bump(|c| c.incomplete += 1);
            return Expired::Incomplete { comm_id, key };
        }
        let h = HangCandidate {
            comm_id,
            key,
            op: open.op,
            comm_nranks: st.nranks,
            entered_at: entered,
            first_host: open.first_host.to_string(),
            first_agent_ns: open.first_agent_ns,
            present_ranks,
            missing,
            summary,
        };
        // Only the earliest hung instances per communicator matter.
        if st.hangs.len() < 4 && *kept < MAX_KEPT_HANGS {
            st.hangs.insert(key, h.clone());
            st.stalled.insert(key, open);
            *kept += 1;
        }
        self.bump(|c| c.hangs += 1);
        Expired::Hang(h)
    }

    /// Cuts `absent` to [`MAX_NAMED_MISSING`], counting the rest (and the
    /// members never announced) as unlisted; past [`HANG_LIST_MAX`] the
    /// absent are also said as ranges, over every absent member, before
    /// the list is cut: ranks past the named ones are in the ranges too,
    /// and members never announced are in the count alone.
    fn cut_missing(
        &self,
        st: &CommState,
        absent: &mut Vec<u32>,
        unannounced: usize,
    ) -> Option<MissingSummary> {
        let absent_total = absent.len() + unannounced;
        let summary = (absent_total > HANG_LIST_MAX).then(|| {
            let known = absent
                .iter()
                .filter_map(|p| st.slots.get(p).map(|s| s.rank))
                .collect();
            MissingSummary::new(absent_total as u64, known)
        });
        let mut unlisted = unannounced as u64;
        if absent.len() > MAX_NAMED_MISSING {
            unlisted += (absent.len() - MAX_NAMED_MISSING) as u64;
            absent.truncate(MAX_NAMED_MISSING);
        }
        if unlisted > 0 {
            self.bump(|c| c.missing_unlisted += unlisted);
        }
        summary
    }

    /// A communicator's open instances past their wait, with when their
    /// first member entered (coordinator time), oldest first. Instances of
    /// a communicator with members never heard of wait until stale; the
    /// rest until the timeout.
    fn due_instances(
        &self,
        st: &mut CommState,
        now: CoordNs,
        to_coord: &impl Fn(&str, u64) -> CoordNs,
    ) -> Vec<(InstanceKey, CoordNs)> {
        let unslotted = st.slots.len() < st.nranks as usize;
        let mut due: Vec<(InstanceKey, CoordNs)> = st
            .open
            .iter_mut()
            .filter_map(|(k, o)| {
                let wait = if unslotted && matches!(k, InstanceKey::Coll(_)) {
                    self.cfg.hang_stale_ns.max(self.cfg.hang_timeout_ns)
                } else {
                    self.cfg.hang_timeout_ns
                };
                // Far from due by the last look: not worth mapping the
                // clock again (a tick over 65,536 open instances did
                // that for each, every 100 ms).
                if o.entered_hint
                    .is_some_and(|h| now.saturating_sub(h).saturating_add(HINT_MARGIN_NS) < wait)
                {
                    return None;
                }
                let entered = to_coord(&o.first_host, o.first_agent_ns);
                o.entered_hint = Some(entered);
                (now.saturating_sub(entered) > self.cfg.hang_timeout_ns).then_some((*k, entered))
            })
            .collect();
        // Oldest first: the instances queued behind a stuck one follow it.
        due.sort_unstable_by_key(|d| d.0);
        due
    }
}

/// Who an expiring instance's members were: the ranks present, the
/// positions absent, and how many never announced themselves.
struct Attendance {
    present_ranks: Vec<u32>,
    absent: Vec<u32>,
    unannounced: usize,
}

/// Who of `positions` arrived at instance `key` (their ranks), who is
/// absent (positions), and the first absent member whose data is not yet
/// current past `deadline`, if any (so the instance cannot be judged yet;
/// with `stop_undecided` the walk ends there). A member that already
/// issued a later operation on the communicator is not absent: its record
/// for this one was lost. Members never announced leave it undecided too
/// (said as position `u32::MAX`, which is no blocker).
fn attendance(
    st: &CommState,
    key: InstanceKey,
    positions: &[u32],
    unannounced: usize,
    deadline: CoordNs,
    current: &impl Fn(u32, &str, CoordNs) -> bool,
    stop_undecided: bool,
) -> (Vec<u32>, Vec<u32>, Option<u32>) {
    let open = &st.open[&key];
    let p2p = matches!(key, InstanceKey::P2p { .. });
    let mut present_ranks = Vec::new();
    let mut absent = Vec::new();
    let mut undecided = (unannounced > 0).then_some(u32::MAX);
    if undecided.is_some() && stop_undecided {
        return (present_ranks, absent, undecided);
    }
    for (i, p) in positions.iter().enumerate() {
        // Records are stored by comm position, p2p ones by side.
        let idx = if p2p { i as u32 } else { *p };
        if let Some(m) = open.records.get(&idx) {
            present_ranks.push(m.rank);
            continue;
        }
        if passed(st, key, *p, deadline) {
            continue;
        }
        let slot = st.slots.get(p);
        let known = slot.is_some_and(|s| current(s.rank, &s.host, deadline));
        if !known && undecided.is_none() {
            undecided = Some(*p);
            if stop_undecided {
                break;
            }
        }
        absent.push(*p);
    }
    (present_ranks, absent, undecided)
}

/// Whether collective position `blocker` keeps instance `key` undecided:
/// absent from it, not past it, and its data not current past `deadline`.
fn holds_back(
    st: &CommState,
    key: InstanceKey,
    blocker: Option<u32>,
    deadline: CoordNs,
    current: &impl Fn(u32, &str, CoordNs) -> bool,
) -> bool {
    let (InstanceKey::Coll(_), Some(p)) = (key, blocker) else {
        return false;
    };
    if p >= st.nranks || st.open[&key].records.contains_key(&p) || passed(st, key, p, deadline) {
        return false;
    }
    !st.slots
        .get(&p)
        .is_some_and(|s| current(s.rank, &s.host, deadline))
}

/// The absent members as the report names them.
fn missing_members(st: &CommState, absent: &[u32]) -> Vec<MissingMember> {
    absent
        .iter()
        .map(|p| {
            let slot = st.slots.get(p);
            MissingMember {
                rank: slot.map_or(UNKNOWN_RANK, |s| s.rank),
                rank_in_comm: *p,
                host: slot.map_or_else(String::new, |s| s.host.to_string()),
                last_seq_seen: st.last_seq.get(p).copied(),
                last_completed_seq: st.last_completed.get(p).copied(),
            }
        })
        .collect()
}

/// The positions of a collective instance to look at, and how many of its
/// members are left out of them as never announced (no agent ever sent
/// their membership; only a count can be said of them). Every position
/// while few are unannounced, so they are named; else only the announced
/// ones: walking every claimed position made each instance of a 4,096-rank
/// communicator only its creator was in cost 4,096 steps, and an agent
/// opening such instances by the thousand stalled the coordinator.
fn member_positions(st: &CommState) -> (Vec<u32>, usize) {
    let unannounced = (st.nranks as usize).saturating_sub(st.slots.len());
    if unannounced <= HANG_LIST_MAX {
        return ((0..st.nranks).collect(), 0);
    }
    let mut known: Vec<u32> = st.slots.keys().copied().collect();
    known.sort_unstable();
    (known, unannounced)
}

/// Whether position `p` already issued an operation after `key` on this
/// communicator (so its record for `key` was lost, not withheld). For a
/// point-to-point one whose later records cannot be numbered
/// ([`Joiner::p2p_unjoinable`]), one to the same peer entered past the
/// instance's `deadline` says so: a member stuck in it issues nothing
/// after.
fn passed(st: &CommState, key: InstanceKey, p: u32, deadline: CoordNs) -> bool {
    match key {
        InstanceKey::Coll(seq) => st.last_seq.get(&p).is_some_and(|l| *l > seq),
        InstanceKey::P2p { lo, hi, ordinal } => {
            let peer = if p == lo { hi } else { lo };
            st.p2p_ordinal.get(&(p, peer)).is_some_and(|n| *n > ordinal)
                || st
                    .p2p_unjoinable
                    .get(&(p, peer))
                    .is_some_and(|t| *t > deadline)
        }
    }
}
