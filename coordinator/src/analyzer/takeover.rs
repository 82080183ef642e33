//! Takeovers: the communicators a restarted agent took over, whose
//! members' records wait in [`crate::join::realign`] until they can be
//! lined up with the other members'. In: takeover declarations and the
//! ingest's clock; out: the lined-up records, offered to the join like
//! live ones.

use super::*;

impl Analyzer {
    /// A restarted agent took over `c`: its member's records are lined up
    /// before they join ([`crate::join::realign`]).
    pub(super) fn take_over(&self, c: &CommRecord, b: &Batch, host: &Arc<str>) {
        let floor = self.joiner.last_seq_of(c.comm_id, c.rank);
        let now = self.to_coord(&b.host, b.mono_ns).0;
        // What the other members reported while nobody watched this one:
        // read before the realigner's lock is taken.
        let known = self
            .joiner
            .open_collectives(c.comm_id, host, |h, ns| self.to_coord(h, ns).0);
        let mut realign = lock(&self.realign);
        realign.take_over(c.comm_id, c.nranks, c.rank, &b.agent_id, host, floor, now);
        realign.seed(c.comm_id, known);
        drop(realign);
        self.realigned_comms.insert(c.comm_id, ());
        self.realigning.store(true, Ordering::Relaxed);
    }

    /// The input is over (the job ended, or the coordinator stops): the
    /// taken-over members still held are lined up with what is known and
    /// their records offered ([`Realigner::finish_remapped`]), so the last
    /// tick and the final report count them.
    ///
    /// [`Realigner::finish_remapped`]: crate::join::realign::Realigner::finish_remapped
    pub fn end_of_input(&self, now_ns: u64) -> IngestSummary {
        let mut sum = IngestSummary::default();
        let mut out = Offered::default();
        self.release_lined_up(now_ns, &mut sum, &mut out, true);
        self.log_still_held(now_ns);
        let nccl_errors = self.queue_offered(out);
        self.accepted.fetch_add(sum.accepted, Ordering::Relaxed);
        let mut c = lock(&self.counters);
        c.records_accepted += sum.accepted;
        c.nccl_errors += nccl_errors;
        if sum.accepted > 0 {
            info!(
                records = sum.accepted,
                "at the end of the input, held records of restarted agents' members joined"
            );
        }
        sum
    }

    /// A held record's agent time on its host's clock as known now, not as
    /// it was when the record arrived (right after a restart the clock is
    /// still settling).
    fn remap_now(&self, host: &str, agent_ns: u64) -> Option<CoordNs> {
        self.clocks
            .get(host)
            .map(|c| c.value().map().coord_and_bound(agent_ns).0)
    }

    /// Each taken-over member whose records never joined, with what its
    /// line-up lacked: the count alone (`takeover.held` in the report) told
    /// nothing when a CI run ended with 856 held records and no line-up.
    fn log_still_held(&self, now_ns: u64) {
        if !self.realigning.load(Ordering::Relaxed) {
            return;
        }
        let remap = |host: &str, agent_ns: u64| self.remap_now(host, agent_ns);
        let still = lock(&self.realign).still_held(now_ns as CoordNs, &remap, true);
        let ms = |ns: CoordNs| ns as f64 / 1e6;
        for h in still {
            warn!(
                comm = format!("{:#x}", h.comm_id),
                rank = h.rank,
                host = %h.host,
                held = h.held,
                held_from_ms = ms(h.held_entries.0),
                held_to_ms = ms(h.held_entries.1),
                floor = h.floor,
                others_instances = h.refs,
                others_seqs = h.ref_seqs.map(|(a, b)| format!("{a}..={b}")),
                others_from_ms = h.ref_entries.map(|e| ms(e.0)),
                others_to_ms = h.ref_entries.map(|e| ms(e.1)),
                why = ?h.why,
                "a restarted agent's member could not be lined up with the other members: its held records never join"
            );
        }
    }

    /// Offers the held records of the taken-over members that can now be
    /// lined up ([`crate::join::realign`]); all that can be once the input
    /// `ended`.
    pub(super) fn release_lined_up(
        &self,
        recv_ns: u64,
        sum: &mut IngestSummary,
        out: &mut Offered,
        ended: bool,
    ) {
        if !self.realigning.load(Ordering::Relaxed) {
            return;
        }
        let remap = |host: &str, agent_ns: u64| self.remap_now(host, agent_ns);
        let released = if ended {
            lock(&self.realign).finish_remapped(recv_ns as CoordNs, &remap)
        } else {
            lock(&self.realign).poll_remapped(recv_ns as CoordNs, &remap)
        };
        for rel in released {
            info!(
                comm = format!("{:#x}", rel.comm_id),
                rank = rel.rank,
                host = %rel.host,
                offset = rel.offset,
                records = rel.records.len(),
                mean_diff_ms = rel.fit.map(|f| f.mean_ns as f64 / 1e6),
                runner_up_ms = rel.fit.and_then(|f| f.runner_up_ns).map(|n| n as f64 / 1e6),
                waited_ms = rel.basis.map(|b| b.waited_ns / 1_000_000),
                held = rel.basis.map(|b| b.held),
                covered = rel.basis.map(|b| b.covered),
                patient = rel.basis.map(|b| b.patient),
                superseded = rel.superseded,
                input_ended = ended,
                window = rel.basis.map(|b| format!("{}+{}", b.window_start, b.window_len)),
                clock_bound_us = self
                    .clocks
                    .get(&*rel.host)
                    .map(|c| c.value().error_bound_ns() / 1e3),
                "a restarted agent's member lined up with the other members: its collectives join again"
            );
            // Its oldest records may belong to instances that closed
            // before the takeover was known (the agent saw them before it
            // could connect): counted as replayed and unjoinable, like a
            // spool's, not rejected.
            let source = if rel.superseded {
                Source::Superseded
            } else {
                Source::LinedUp
            };
            lock(&self.lined_up).push(((rel.comm_id, rel.rank), rel.offset));
            for r in rel.records {
                self.offer_one(&rel.host, r, source, None, recv_ns, sum, out);
            }
        }
    }
}
