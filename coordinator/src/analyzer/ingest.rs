//! Ingest: validate each batch against what its agent announced, map its
//! times onto the coordinator clock and offer its records to the join
//! (parking early ones). In: a decoded `Batch`; out: joined instances
//! queued for `tick`, and counted rejections.

use super::*;

impl Analyzer {
    /// Ingests one decoded batch received at coordinator time `recv_ns`.
    /// Never panics on bad content: each impossible record is rejected,
    /// counted with its reason, and the rest of the batch is used.
    pub fn ingest(&self, b: &Batch, recv_ns: u64) -> IngestSummary {
        let mut sum = IngestSummary::default();
        self.batches.fetch_add(1, Ordering::Relaxed);
        // A resend of a batch this or an earlier life took is nothing new,
        // whatever its other checks would say: judged on a clock first, a
        // restarted life's not yet settled model once refused one a killed
        // life had journaled, and its log called it ingested (a chaos run
        // then counted it twice).
        if self.is_resend(b) {
            lock(&self.counters).duplicate_batches += 1;
            sum.duplicate_batch = true;
            return sum;
        }
        if let Err(e) = self.check_batch(b, recv_ns) {
            sum.batch_rejected = Some(e.label());
            sum.batch_rejected_why = Some(e.to_string());
            let mut c = lock(&self.counters);
            *c.batches_rejected.entry(e.label().to_owned()).or_default() += 1;
            push_recent(&mut c, &e);
            return sum;
        }
        if !self.admit(b, &mut sum) {
            return sum;
        }
        let host: Arc<str> = Arc::from(b.host.as_str());
        // A host first heard of in this batch gets a clock only if the batch
        // holds something usable: rejected garbage must not add a host (and
        // its error bound) to the report.
        let clock_known = self.clocks.contains_key(&b.host);
        if clock_known {
            self.observe_batch_clock(b, recv_ns);
        }
        let slack = self.cfg.limits.future_slack_ns;
        self.ingest_ranks(b, slack, &mut sum);
        let announced = self.ingest_comms(b, &host, &mut sum);
        let mut out = Offered::default();
        // Records that waited for these memberships go first: they were
        // issued before this batch's.
        self.release_parked(&announced, recv_ns, &mut sum, &mut out);
        self.offer_collectives(b, &host, recv_ns, &mut sum, &mut out);
        self.release_lined_up(recv_ns, &mut sum, &mut out, false);
        self.ingest_intervals_and_links(b, slack, &mut sum);
        let nccl_errors = self.queue_offered(out);
        if !clock_known && sum.accepted > 0 {
            self.observe_batch_clock(b, recv_ns);
        }
        self.advance_watermark(b);
        self.accepted.fetch_add(sum.accepted, Ordering::Relaxed);
        let mut c = lock(&self.counters);
        c.records_accepted += sum.accepted;
        c.nccl_errors += nccl_errors;
        sum
    }

    /// Notes the batch's collectives as issued, then offers each valid one
    /// to the join (an invalid one is rejected and counted).
    fn offer_collectives(
        &self,
        b: &Batch,
        host: &Arc<str>,
        recv_ns: u64,
        sum: &mut IngestSummary,
        out: &mut Offered,
    ) {
        let slack = self.cfg.limits.future_slack_ns;
        // Records from before the agent's current connection: it was away
        // (spooled, or held by its fold) while they happened.
        let source = Source::Live {
            connected_at: self
                .agents
                .get(&b.agent_id)
                .map_or(0, |a| a.connected_mono_ns),
        };
        self.note_issued(b);
        for r in &b.collectives {
            match self
                .check_rank(r.rank, &b.host)
                .and_then(|_| validate::check_collective(r, b.mono_ns, slack))
            {
                Ok(())
                    if self.realigning.load(Ordering::Relaxed)
                        && self.realigned_comms.contains_key(&r.comm_id) =>
                {
                    let entry = self.to_coord(&b.host, r.host_entry_ns).0;
                    let routed = lock(&self.realign).route(r.clone(), &b.agent_id, entry);
                    match routed {
                        Route::Offer(r) => self.offer_one(host, r, source, None, recv_ns, sum, out),
                        Route::Held => {}
                        Route::Lost => {
                            sum.rejected += 1;
                            if matches!(r.op, CollOp::Send | CollOp::Recv) {
                                self.joiner.p2p_unjoinable(r.comm_id, r.rank, r.peer, entry);
                            }
                        }
                    }
                }
                Ok(()) => self.offer_one(host, r.clone(), source, None, recv_ns, sum, out),
                Err(e) => {
                    self.reject(e);
                    sum.rejected += 1;
                }
            }
        }
    }

    /// The highest instance each communicator's members have issued
    /// (point-to-point ops aside), for communicators the join knows.
    fn note_issued(&self, b: &Batch) {
        let mut issued = lock(&self.issued);
        for r in b
            .collectives
            .iter()
            .filter(|r| !matches!(r.op, CollOp::Send | CollOp::Recv))
        {
            if let Some(n) = self.joiner.comm_nranks(r.comm_id) {
                let e = issued.entry(r.comm_id).or_insert((n, 0));
                e.1 = e.1.max(r.seq);
            }
        }
    }

    /// Queues what the offers completed (for `tick`) and the hang
    /// progress; returns the NCCL errors seen.
    pub(super) fn queue_offered(&self, out: Offered) -> u64 {
        let Offered {
            completed,
            progress,
            nccl_errors,
        } = out;
        if !completed.is_empty() {
            lock(&self.completed).extend(completed);
        }
        if !progress.is_empty() {
            lock(&self.hang_progress).extend(progress);
        }
        nccl_errors
    }

    /// After the records: the batch says its agent is current up to its
    /// cut. Not the preamble (sequence 0): re-sent on reconnection ahead
    /// of the spooled batches, it carries the latest cut but none of the
    /// records before it, and would expire their instances as hangs.
    fn advance_watermark(&self, b: &Batch) {
        if b.seq != 0 {
            self.watermarks
                .entry(b.agent_id.clone())
                .and_modify(|w| *w = (*w).max(b.mono_ns))
                .or_insert(b.mono_ns);
        }
    }

    /// Whether the batch's number is one its agent's sequence already holds
    /// (a preamble never is: see [`Self::admit`]).
    fn is_resend(&self, b: &Batch) -> bool {
        self.agents.get(&b.agent_id).is_some_and(|a| {
            let preamble = b.seq == 0 && (only_declares(b) || a.last_seq.is_some_and(|l| l > 0));
            !preamble && a.last_seq.is_some_and(|last| b.seq <= last)
        })
    }

    /// Whether the batch is new in its agent's sequence (a preamble always
    /// is), counting its gaps and drops; a duplicate or an impossible jump
    /// is counted and refused whole.
    fn admit(&self, b: &Batch, sum: &mut IngestSummary) -> bool {
        let mut a = self.agents.entry(b.agent_id.clone()).or_default();
        if a.host.is_none() {
            a.host = Some(b.host.clone());
        }
        // Sequence 0 after later batches is the agent's reconnection
        // preamble: it re-declares its ranks and communicators (a
        // restarted coordinator needs them) and is never a resend. So is
        // a record-less sequence 0 at any time: the link may have gone
        // down before the real batch 0 left the agent's spool, and
        // taking the preamble for batch 0 would drop the real one as a
        // duplicate; after batch 0 it must still declare (a restarted
        // life knows batch 0 from its journal, not its communicators).
        let preamble = b.seq == 0 && (only_declares(b) || a.last_seq.is_some_and(|l| l > 0));
        sum.preamble = preamble;
        if !preamble && a.last_seq.is_some_and(|last| b.seq <= last) {
            drop(a);
            lock(&self.counters).duplicate_batches += 1;
            sum.duplicate_batch = true;
            return false;
        }
        let missing = match a.last_seq {
            Some(last) if !preamble => b.seq - last - 1,
            _ => 0,
        };
        if missing >= validate::MAX_SEQ_GAP {
            let e = RecordError::SeqJump {
                last: a.last_seq.unwrap_or(0),
                got: b.seq,
            };
            drop(a);
            sum.batch_rejected = Some(e.label());
            sum.batch_rejected_why = Some(e.to_string());
            let mut c = lock(&self.counters);
            *c.batches_rejected.entry(e.label().to_owned()).or_default() += 1;
            push_recent(&mut c, &e);
            return false;
        }
        // A step no agent can make is not believed (nor remembered):
        // one u64::MAX would pin the job-wide sums at their ceiling.
        let step = |now: u64, had: u64| {
            Some(now.saturating_sub(had)).filter(|d| *d <= validate::MAX_COUNTER_STEP)
        };
        let (rd, sd) = (
            step(b.ringbuf_drops, a.ringbuf_drops),
            step(b.spool_drops, a.spool_drops),
        );
        if !preamble {
            a.last_seq = Some(a.last_seq.map_or(b.seq, |l| l.max(b.seq)));
        }
        if rd.is_some() {
            a.ringbuf_drops = a.ringbuf_drops.max(b.ringbuf_drops);
        }
        if sd.is_some() {
            a.spool_drops = a.spool_drops.max(b.spool_drops);
        }
        let (rd, sd) = (rd.unwrap_or(0), sd.unwrap_or(0));
        drop(a);
        // Saturating: a garbage sequence or drop count must not overflow.
        let mut c = lock(&self.counters);
        c.batches += 1;
        c.missing_batches = c.missing_batches.saturating_add(missing);
        c.ringbuf_drops = c.ringbuf_drops.saturating_add(rd);
        c.spool_drops = c.spool_drops.saturating_add(sd);
        true
    }

    /// The batch's rank identities and exits.
    fn ingest_ranks(&self, b: &Batch, slack: u64, sum: &mut IngestSummary) {
        for id in &b.ranks {
            if let Err(e) = self.check_identity(id, &b.host) {
                self.reject(e);
                sum.rejected += 1;
                continue;
            }
            self.ranks.insert(
                id.rank,
                RankInfo {
                    rank: id.rank,
                    host: b.host.clone(),
                    agent_id: b.agent_id.clone(),
                    pid: id.pid,
                    world_size: id.world_size,
                    job_id: id.job_id.clone(),
                    restart_count: id.restart_count,
                    exited_at: None,
                    exit_shipped_by: None,
                },
            );
            sum.accepted += 1;
        }
        for e in &b.exits {
            if let Err(err) = self.check_exit(e, &b.host, b.mono_ns, slack) {
                self.reject(err);
                sum.rejected += 1;
                continue;
            }
            let t = self.to_coord(&b.host, e.exit_ns).0;
            if let Some(mut r) = self.ranks.get_mut(&e.rank) {
                r.exited_at = Some(t);
                r.exit_shipped_by = Some(e.exit_ns.min(b.mono_ns));
            }
            sum.accepted += 1;
        }
    }

    /// The batch's communicators (splits worked out where a record lacks
    /// its size); returns the ones announced now, whose parked records can
    /// go.
    fn ingest_comms(&self, b: &Batch, host: &Arc<str>, sum: &mut IngestSummary) -> Vec<u64> {
        let mut announced = Vec::new();
        for c in &b.comms {
            if c.parent_id != 0 {
                // Every split record feeds the split table (a member heard);
                // those without a size are completed by it.
                let deferred = crate::join::splits::Splits::needs_resolving(c);
                let parent =
                    self.joiner
                        .comm_info(c.parent_id)
                        .map(|i| crate::join::splits::Parent {
                            nranks: i.nranks,
                            ranks: i.ranks,
                        });
                let offered = self.check_rank(c.rank, &b.host).and_then(|_| {
                    lock(&self.splits)
                        .offer(host, c, parent.as_ref())
                        .map_err(RecordError::from)
                });
                match offered {
                    Ok(resolved) => {
                        for (h, rc) in resolved {
                            match self
                                .check_comm_size(&rc)
                                .and_then(|_| self.joiner.register_comm(&h, &rc))
                            {
                                Ok(()) => announced.push(rc.comm_id),
                                Err(e) => self.reject(e),
                            }
                        }
                    }
                    Err(e) if deferred => {
                        self.reject(e);
                        sum.rejected += 1;
                        continue;
                    }
                    // A complete record needs no working out.
                    Err(_) => {}
                }
                if deferred {
                    sum.accepted += 1;
                    continue;
                }
            }
            if let Err(e) = self
                .check_rank(c.rank, &b.host)
                .and_then(|_| validate::check_comm(c))
                .and_then(|_| self.check_comm_size(c))
                .and_then(|_| self.joiner.register_comm(host, c))
            {
                self.reject(e);
                sum.rejected += 1;
            } else {
                sum.accepted += 1;
                announced.push(c.comm_id);
                if c.resumed {
                    self.take_over(c, b, host);
                }
            }
        }
        announced
    }

    /// The batch's per-rank intervals and RDMA link records, queued for the
    /// next tick (bounded: past the cap a record is dropped and counted).
    fn ingest_intervals_and_links(&self, b: &Batch, slack: u64, sum: &mut IngestSummary) {
        let cap = self.cfg.limits.max_queued_records;
        {
            let mut q = lock(&self.raw_intervals);
            for i in &b.intervals {
                match self
                    .check_rank(i.rank, &b.host)
                    .and_then(|_| validate::check_interval(i, b.mono_ns, slack))
                {
                    Ok(()) if q.len() < cap => {
                        lock(&self.overhead).add(&b.host, i);
                        q.push((b.host.clone(), i.clone()));
                        sum.accepted += 1;
                    }
                    Ok(()) => {
                        drop_record(&self.counters, "queue_full");
                        sum.rejected += 1;
                    }
                    Err(e) => {
                        self.reject(e);
                        sum.rejected += 1;
                    }
                }
            }
        }
        {
            let mut q = lock(&self.raw_links);
            let mut peers = lock(&self.link_peers);
            let mut unnamed = lock(&self.unnamed_links);
            for l in &b.links {
                let peer_ok = l.peer_rank >= 0 && l.peer_rank <= u32::MAX as i64;
                let res = self
                    .check_rank(l.rank, &b.host)
                    .and_then(|_| validate::check_link(l, b.mono_ns, slack));
                if res.is_ok() {
                    peers.observe(l);
                }
                match res {
                    Ok(()) if peer_ok && q.len() < cap => {
                        q.push((b.host.clone(), l.clone()));
                        sum.accepted += 1;
                    }
                    // The agent cannot name the remote rank of a QP: both
                    // ends' QP numbers and LIDs do, once both were seen
                    // (retried at each tick; bounded).
                    Ok(()) if !peer_ok => {
                        if l.posts > 0 && unnamed.len() < cap {
                            unnamed.push((b.host.clone(), l.clone()));
                        }
                        sum.accepted += 1;
                    }
                    Ok(()) => {
                        drop_record(&self.counters, "queue_full");
                        sum.rejected += 1;
                    }
                    Err(e) => {
                        self.reject(e);
                        sum.rejected += 1;
                    }
                }
            }
        }
    }

    /// Offers one checked collective to the join; one whose communicator
    /// or member is not known yet is parked ([`crate::join::park`]), not refused.
    /// `parked_since`: when it was first parked, for one offered again.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn offer_one(
        &self,
        host: &Arc<str>,
        r: CollectiveRecord,
        source: Source,
        parked_since: Option<u64>,
        now: u64,
        sum: &mut IngestSummary,
        out: &mut Offered,
    ) {
        match self.joiner.offer(host, r.clone()) {
            Ok(o) => {
                if r.ret != 0 {
                    out.nccl_errors += 1;
                }
                match o {
                    Offer::Completed(i) => out.completed.push(i),
                    Offer::Duplicate => sum.duplicates += 1,
                    Offer::HangProgress {
                        comm_id,
                        key,
                        resolved,
                        completed,
                    } => {
                        out.progress.push((comm_id, key, resolved));
                        out.completed.extend(completed);
                    }
                    Offer::Pending | Offer::Merged => {}
                }
                sum.accepted += 1;
            }
            Err(e) if source.replayed(&e, r.host_entry_ns) => {
                lock(&self.counters).replayed_unjoinable += 1;
            }
            Err(
                RecordError::UnknownCommunicator { comm_id }
                | RecordError::NotAMember { comm_id, .. },
            ) => {
                let item = ParkedRecord {
                    host: host.clone(),
                    rec: r,
                    source,
                };
                let bytes = std::mem::size_of::<ParkedRecord>();
                let mut p = lock(&self.parking);
                let res = match parked_since {
                    Some(since) => p.repark(comm_id, item, bytes, since),
                    None => p.park(comm_id, item, bytes, now),
                };
                let n = p.counters().overflow;
                drop(p);
                // Said at 1, 2, 4, 8 … losses: a full parking refuses many.
                if let (Err(e), true) = (res, n.is_power_of_two()) {
                    warn!("{n} collective record(s) lost, the latest of communicator {comm_id:#x}: {e}");
                }
            }
            Err(e) => {
                self.reject(e);
                sum.rejected += 1;
            }
        }
    }

    /// Offers again the records parked for the communicators just announced.
    pub(super) fn release_parked(
        &self,
        comms: &[u64],
        now: u64,
        sum: &mut IngestSummary,
        out: &mut Offered,
    ) {
        for &comm_id in comms {
            let released = {
                let mut p = lock(&self.parking);
                if !p.waits_for(comm_id) {
                    continue;
                }
                p.release(comm_id)
            };
            if let (Some(n), Some(top)) = (
                self.joiner.comm_nranks(comm_id),
                released
                    .iter()
                    .filter(|(p, _)| !matches!(p.rec.op, CollOp::Send | CollOp::Recv))
                    .map(|(p, _)| p.rec.seq)
                    .max(),
            ) {
                let mut issued = lock(&self.issued);
                let e = issued.entry(comm_id).or_insert((n, 0));
                e.1 = e.1.max(top);
            }
            for (p, since) in released {
                self.offer_one(&p.host, p.rec, p.source, Some(since), now, sum, out);
            }
        }
    }

    /// The ingest counters, with the parking's.
    pub(super) fn ingest_counters(&self) -> IngestCounters {
        let mut c = lock(&self.counters).clone();
        c.parking = lock(&self.parking).counters();
        c.takeover = lock(&self.realign).counters();
        c
    }

    /// Parked records whose membership never came are lost: say so.
    pub(super) fn expire_parked(&self, now: CoordNs) {
        let lost = lock(&self.parking).expire(now.max(0) as u64);
        if !lost.is_empty() {
            let comms: std::collections::BTreeSet<u64> =
                lost.iter().map(|p| p.rec.comm_id).collect();
            warn!(
                records = lost.len(),
                communicators = ?comms.iter().map(|c| format!("{c:#x}")).collect::<Vec<_>>(),
                "collective records lost: their communicator's membership never arrived within {} s",
                crate::join::park::PARK_TIMEOUT_NS / 1_000_000_000
            );
        }
    }

    pub(super) fn observe_batch_clock(&self, b: &Batch, recv_ns: u64) {
        // A batch cut before its agent's current connection waited in the
        // spool (a restarted coordinator gets the whole backlog): its
        // arrival bounds the offset by its age, tens of ms too late, which
        // made a restarted coordinator see one host's ranks that much late
        // until the first probe answered.
        let spooled = self
            .agents
            .get(&b.agent_id)
            .is_some_and(|a| b.mono_ns < a.connected_mono_ns);
        let mut clock = self
            .clocks
            .entry(b.host.clone())
            .or_insert_with(|| ClockEstimator::new(self.cfg.clock.clone()));
        if !spooled {
            clock.observe_one_way(b.mono_ns, recv_ns);
        }
        drop(clock);
        if b.wall_ns != 0 {
            let (c, _) = self.to_coord(&b.host, b.mono_ns);
            *lock(&self.wall_offset) = Some((b.wall_ns as i64).saturating_sub(c));
        }
    }

    /// Whole-batch checks, before anything of the batch is used: an agent
    /// that changes host, or a batch cut after it arrived (on the host's
    /// estimated clock), would corrupt the clock and the sequence tracking.
    pub(super) fn check_batch(&self, b: &Batch, recv_ns: u64) -> Result<(), RecordError> {
        if let Some(a) = self.agents.get(&b.agent_id) {
            if let Some(had) = a.host.as_ref().filter(|h| **h != b.host) {
                return Err(RecordError::HostChanged {
                    agent_id: b.agent_id.clone(),
                    had: had.clone(),
                    got: b.host.clone(),
                });
            }
        }
        // Not on an earlier life's clock: if its host's agent rebooted, the
        // seed is wrong, and the batch's arrival is what shows it (the seed
        // is dropped then, not the batch).
        if let Some(c) = self.clocks.get(&b.host).filter(|c| !c.is_seeded()) {
            let (at, err) = c.value().map().coord_and_bound(b.mono_ns);
            if err.is_finite() {
                let ahead = at as f64 - recv_ns as f64;
                if ahead > self.cfg.limits.future_slack_ns as f64 + err {
                    return Err(RecordError::BatchInFuture {
                        batch_ns: b.mono_ns,
                        ahead_ns: ahead as u64,
                        bound_ns: err as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// A rank identity: a sane world, consistent with the job's, and a rank
    /// no other host holds (unless this is a newer elastic restart).
    pub(super) fn check_identity(&self, id: &RankIdentity, host: &str) -> Result<(), RecordError> {
        if id.world_size > validate::MAX_COMM_RANKS {
            return Err(RecordError::WorldTooLarge(id.world_size));
        }
        if id.world_size != 0 && id.rank >= id.world_size {
            return Err(RecordError::RankOutOfRange {
                rank: id.rank,
                world_size: id.world_size,
            });
        }
        if id.world_size == 0 && id.rank >= validate::MAX_COMM_RANKS {
            return Err(RecordError::WorldTooLarge(id.rank));
        }
        if let Some(r) = self.ranks.get(&id.rank) {
            let owner = crate::net::ownership::Owner {
                host: &r.host,
                exited: r.exited_at.is_some(),
                restart_count: r.restart_count,
            };
            if !crate::net::ownership::may_take(&owner, host, id.restart_count, &self.live_hosts) {
                return Err(RecordError::WrongHost {
                    rank: id.rank,
                    host: host.to_owned(),
                    owner: r.host.clone(),
                });
            }
        }
        if id.world_size != 0 {
            let mut w = lock(&self.world);
            // A new world size needs every other host's ranks gone (exited,
            // or their agent away): one host's claim cannot resize the job
            // under the others.
            let others_live = || {
                self.ranks.iter().any(|r| {
                    r.host != host
                        && r.exited_at.is_none()
                        && self.live_hosts.is_live(&r.host) != Some(false)
                        && self.live_hosts.tracking()
                })
            };
            match *w {
                Some((ws, rc))
                    if ws != id.world_size && (id.restart_count <= rc || others_live()) =>
                {
                    return Err(RecordError::WorldSizeConflict {
                        had: ws,
                        got: id.world_size,
                    });
                }
                Some((_, rc)) if id.restart_count < rc => {}
                _ => *w = Some((id.world_size, id.restart_count)),
            }
        }
        Ok(())
    }

    /// The rank is inside the world (when known) and runs on `host`.
    pub(super) fn check_rank(&self, rank: u32, host: &str) -> Result<(), RecordError> {
        if let Some((ws, _)) = *lock(&self.world) {
            if rank >= ws {
                return Err(RecordError::RankOutOfRange {
                    rank,
                    world_size: ws,
                });
            }
        }
        if let Some(r) = self.ranks.get(&rank) {
            if r.host != host {
                return Err(RecordError::WrongHost {
                    rank,
                    host: host.to_owned(),
                    owner: r.host.clone(),
                });
            }
        }
        Ok(())
    }

    pub(super) fn check_comm_size(&self, c: &CommRecord) -> Result<(), RecordError> {
        match *lock(&self.world) {
            Some((ws, _)) if c.nranks > ws => Err(RecordError::CommLargerThanWorld {
                comm_id: c.comm_id,
                nranks: c.nranks,
                world_size: ws,
            }),
            _ => Ok(()),
        }
    }

    /// An exit in time, from the rank's host, of the rank's current process
    /// (a late exit of a process an elastic restart replaced is stale).
    pub(super) fn check_exit(
        &self,
        e: &RankExit,
        host: &str,
        batch_ns: u64,
        slack: u64,
    ) -> Result<(), RecordError> {
        self.check_rank(e.rank, host)?;
        validate::not_future("exit_ns", e.exit_ns, batch_ns, slack)?;
        if let Some(r) = self.ranks.get(&e.rank) {
            if r.pid != e.pid {
                return Err(RecordError::ExitOfOtherProcess {
                    rank: e.rank,
                    pid: e.pid,
                    current: r.pid,
                });
            }
        }
        Ok(())
    }

    pub(super) fn wall(&self, t: CoordNs) -> Option<DateTime<Utc>> {
        let off = (*lock(&self.wall_offset))?;
        Some(DateTime::<Utc>::from_timestamp_nanos(t.saturating_add(off)))
    }

    /// The ranks of each host that have not exited.
    pub(super) fn live_ranks_by_host(&self) -> BTreeMap<String, Vec<u32>> {
        let mut m: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for r in self.ranks.iter() {
            if r.exited_at.is_none() {
                m.entry(r.host.clone()).or_default().push(r.rank);
            }
        }
        m
    }

    pub(super) fn host_of(&self, rank: u32) -> String {
        self.ranks
            .get(&rank)
            .map_or_else(|| "?".into(), |r| r.host.clone())
    }
}
