use super::*;
use crate::join::{InstanceKey, MissingMember};

fn hang(comm: u64, present: &[u32], missing: &[u32]) -> HangState {
    HangState {
        candidate: HangCandidate {
            comm_id: comm,
            key: InstanceKey::Coll(1),
            op: CollOp::AllReduce,
            comm_nranks: (present.len() + missing.len()) as u32,
            entered_at: 0,
            first_host: "a".into(),
            first_agent_ns: 0,
            present_ranks: present.to_vec(),
            missing: missing
                .iter()
                .map(|r| MissingMember {
                    rank: *r,
                    rank_in_comm: 0,
                    host: "a".into(),
                    last_seq_seen: None,
                    last_completed_seq: None,
                })
                .collect(),
            summary: None,
        },
        iteration: None,
        detected_at: 0,
        wall: None,
        active: true,
        exited: Vec::new(),
    }
}

#[test]
fn hangs_behind_a_hang_are_consequences() {
    // Rank 13 stopped: its TP partner 12 waits for it; 12's pipeline
    // neighbour 4 then waits for 12, which never comes.
    let h = [hang(1, &[12], &[13]), hang(2, &[4], &[12])];
    let (roots, blocked) = split_hangs(&h);
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].candidate.comm_id, 1);
    assert_eq!(blocked[0].candidate.comm_id, 2);
    // A cycle (everyone missing somewhere waits elsewhere): all stay.
    let c = [hang(1, &[1], &[2]), hang(2, &[2], &[1])];
    assert_eq!(split_hangs(&c).0.len(), 2);
}

/// Feeds 8 iterations of a 2-host job; host 1's membership (its comm
/// records) is held back until iteration `announce_at` (never: None).
/// Returns the analyzer and the last iteration's end.
fn feed_with_late_membership(announce_at: Option<u64>) -> (Analyzer, u64) {
    let (a, mut g) = crate::synthjob::healthy();
    let mut held = Vec::new();
    let mut end = 0;
    for it in 0..8u64 {
        let out = g.next_iteration();
        crate::synthjob::samples(&a, &out);
        for (recv, mut b) in out.batches {
            if b.host == "node-1" {
                held.append(&mut b.comms);
                if Some(it) == announce_at {
                    b.comms = std::mem::take(&mut held);
                }
            }
            a.ingest(&b, recv);
        }
        end = out.end_ns;
        a.tick(end as i64 + 3_000_000);
    }
    (a, end)
}

#[test]
fn records_before_their_membership_are_parked_then_joined() {
    let (a, _) = feed_with_late_membership(Some(3));
    let (base, _) = feed_with_late_membership(Some(0));
    let r = a.report();
    assert!(
        r.ingest.counters.records_rejected.is_empty(),
        "{:?}",
        r.ingest.counters.records_rejected
    );
    let p = r.ingest.counters.parking;
    assert!(p.parked > 0 && p.released == p.parked, "{p:?}");
    assert_eq!((p.expired, p.overflow, p.held), (0, 0, 0), "{p:?}");
    // Joined as live data: every instance completes, as when nothing waited.
    assert_eq!(
        r.ingest.instances_completed,
        base.report().ingest.instances_completed
    );
    assert_eq!(base.report().ingest.counters.parking.parked, 0);
}

#[test]
fn records_whose_membership_never_comes_expire_as_lost() {
    let (a, end) = feed_with_late_membership(None);
    a.tick(end as i64 + 3_000_000);
    let held = a.report().ingest.counters.parking;
    assert!(held.held > 0 && held.expired == 0, "{held:?}");
    a.tick((end + crate::join::park::PARK_TIMEOUT_NS) as i64 + 1_000_000_000);
    let p = a.report().ingest.counters.parking;
    assert_eq!((p.held, p.held_bytes), (0, 0), "{p:?}");
    assert_eq!(p.expired, held.held, "{p:?}");
    assert!(a.report().ingest.counters.records_rejected.is_empty());
    assert!(a
        .metrics()
        .to_prometheus()
        .contains("slowrank_parked_records_total{outcome=\"expired\"}"));
}

#[test]
fn a_preamble_before_batch_zero_does_not_swallow_it() {
    let (a, mut g) = crate::synthjob::healthy();
    let out = g.next_iteration();
    let (recv, mut first) = out
        .batches
        .iter()
        .find(|(_, b)| b.host == "node-1")
        .cloned()
        .expect("node-1's first batch");
    // Numbered as a live agent numbers it (the generator starts at 1).
    first.seq = 0;
    assert!(!first.collectives.is_empty());
    // The link went down before batch 0 left: on reconnection the
    // preamble (sequence 0, declarations only) arrives first.
    let preamble = Batch {
        exits: Vec::new(),
        collectives: Vec::new(),
        intervals: Vec::new(),
        links: Vec::new(),
        probes: Vec::new(),
        calls: Vec::new(),
        stacks: Vec::new(),
        ..first.clone()
    };
    let p = a.ingest(&preamble, recv);
    assert!(!p.duplicate_batch && p.batch_rejected.is_none(), "{p:?}");
    assert!(p.preamble);
    let real = a.ingest(&first, recv);
    assert!(
        !real.duplicate_batch,
        "the real batch 0 was dropped: {real:?}"
    );
    assert!(!real.preamble);
    assert!(real.accepted > preamble.ranks.len() as u64, "{real:?}");
    // Once batch 0 is in, a second copy of it is a resend; a preamble
    // still declares (a restarted life knows batch 0 from its journal).
    assert!(a.ingest(&first, recv).duplicate_batch);
    let again = a.ingest(&preamble, recv);
    assert!(again.preamble && !again.duplicate_batch, "{again:?}");
    assert_eq!(a.report().ingest.counters.missing_batches, 0);
}

/// A coordinator life that joins a job at iteration `from` (rank 5
/// compute-slow throughout, from iteration 10): the batches before it went
/// to an earlier life (only their declarations reach this one, as the
/// agents' reconnection preambles carry them), and of iteration `from`
/// only host node-1's, so that iteration straddles the restart. Returns
/// the verdicts after `until` iterations.
fn life_joining_at(
    cfg: AnalyzerConfig,
    from: u64,
    until: u64,
    resumed: bool,
) -> Vec<crate::verdict::Verdict> {
    let a = Analyzer::new(cfg);
    if resumed {
        a.resumed_life();
    }
    let mut g = crate::synthjob::compute_fault(Some(10));
    crate::synthjob::start(&a, &mut g);
    for it in 0..until {
        let out = g.next_iteration();
        crate::synthjob::samples(&a, &out);
        for (recv, b) in &out.batches {
            let earlier_life = it < from || (it == from && b.host == "node-0");
            if earlier_life {
                let mut declared = b.clone();
                declared.collectives.clear();
                declared.intervals.clear();
                declared.links.clear();
                declared.exits.clear();
                a.ingest(&declared, *recv);
            } else {
                a.ingest(b, *recv);
            }
        }
        if it >= from {
            a.tick(out.end_ns as i64 + 3_000_000);
        }
    }
    a.report().verdicts
}

/// A resumed life warms up from its own first iteration: the straddling
/// iteration and the empty baselines of the first ones are nobody's
/// evidence. Its warm-up ends once its steps settle (`warmup_settle`), or
/// after `warmup_iterations` where that rule is off.
#[test]
fn a_resumed_life_warms_up_before_it_names_anyone() {
    for settle in [AnalyzerConfig::default().lifecycle.warmup_settle, 0] {
        let mut cfg = AnalyzerConfig::default();
        cfg.lifecycle.warmup_settle = settle;
        let warmup = if settle == 0 {
            cfg.lifecycle.warmup_iterations
        } else {
            settle as u64
        };
        let (from, until) = (40, 40 + cfg.lifecycle.warmup_iterations + 30);
        let v = life_joining_at(cfg, from, until, true);
        // Named again once warm, and only then.
        assert!(
            v.iter()
                .any(|v| v.rank == 5 && v.kind == classify::Kind::Compute),
            "{v:?}"
        );
        for v in &v {
            assert!(
                v.first_seen_iteration >= from + warmup,
                "rank {} named at iteration {}, inside the new life's warm-up ({from}..{}, settle {settle})",
                v.rank,
                v.first_seen_iteration,
                from + warmup
            );
        }
    }
}

/// A slowdown from inside the warm-up that ended before the report: the
/// baseline test cannot see it (the slow steps are its baseline, and the
/// job is back to pace at the end); the report tells it as a stretch
/// with its ends.
#[test]
fn a_slowdown_that_began_in_warm_up_and_ended_is_a_stretch_with_its_ends() {
    use slowrank_synth::{Fault, FaultKind, Generator, SynthSpec};
    let mut spec = SynthSpec::dp(2, 4);
    let mut f = Fault::persistent(
        FaultKind::Compute {
            rank: 5,
            factor: 1.8,
        },
        10,
    );
    f.end_iteration = Some(40);
    spec.faults.push(f);
    // A warm-up of the full count (its steps never settled, as a real
    // job's may not): the fault is inside it.
    let mut cfg = AnalyzerConfig::default();
    cfg.lifecycle.warmup_settle = 0;
    let a = Analyzer::new(cfg);
    let mut g = Generator::new(spec.clone());
    crate::synthjob::start(&a, &mut g);
    crate::synthjob::feed(&a, &mut g, 80);
    let r = a.report();
    assert_eq!(r.slow_stretches.len(), 1, "{:?}", r.slow_stretches);
    let st = &r.slow_stretches[0];
    assert!((8..=12).contains(&st.from_iteration), "{st:?}");
    assert!((38..=42).contains(&st.to_iteration), "{st:?}");
    assert!(!st.ongoing && st.rise > 0.1, "{st:?}");
    let text = crate::report::render_human(&r);
    assert!(!text.contains("kept its pace"), "{text}");
    assert!(text.contains("SLOWER iterations"), "{text}");
    // Healthy: none.
    assert!(crate::synthjob::analyzed(None, 80)
        .report()
        .slow_stretches
        .is_empty());
    // Where the steps settle (the default), the warm-up ends a few steps
    // in and the straggler from iteration 10 is named while it lasts.
    let a = Analyzer::new(AnalyzerConfig::default());
    let mut g = Generator::new(spec);
    crate::synthjob::start(&a, &mut g);
    crate::synthjob::feed(&a, &mut g, 80);
    let v = a.report().verdicts;
    assert!(
        v.iter().any(|v| v.rank == 5
            && v.kind == classify::Kind::Compute
            && v.first_seen_iteration < 20),
        "{v:?}"
    );
}

/// Node 1's agent dies after iteration `down`, and a new one takes its
/// ranks' communicators over at iteration `up` (they are announced again
/// as resumed, and its records count from 0 again).
fn feed_with_agent_restart(down: u64, up: u64, iterations: u64) -> Analyzer {
    feed_with_agent_restart_delivered(down, up, iterations, false)
}

/// [`feed_with_agent_restart`]; with `late`, the restarted agent reaches
/// the coordinator only once the job is over (refused until the killed
/// agent's connection timed out): every batch of its, the takeover first,
/// arrives after the other hosts' last, and the input then ends.
fn feed_with_agent_restart_delivered(down: u64, up: u64, iterations: u64, late: bool) -> Analyzer {
    let (a, mut g) = crate::synthjob::healthy();
    let mut withheld = Vec::new();
    let mut last_end = 0;
    let mut comms: Vec<CommRecord> = Vec::new();
    // Per communicator, node 1's first sequence number seen by the new agent.
    let mut base: HashMap<(u64, u32), u64> = HashMap::new();
    let mut new_seq = 0;
    for it in 0..iterations {
        let out = g.next_iteration();
        crate::synthjob::samples(&a, &out);
        for (recv, mut b) in out.batches {
            if b.host == "node-1" {
                comms.extend(b.comms.iter().cloned());
                if (down..up).contains(&it) {
                    continue;
                }
                if it >= up {
                    b.agent_id = "agent-1-restarted".into();
                    b.seq = new_seq;
                    new_seq += 1;
                    if it == up {
                        b.ranks.clear();
                        b.comms = comms
                            .iter()
                            .map(|c| CommRecord {
                                resumed: true,
                                ..c.clone()
                            })
                            .collect();
                    }
                    for r in &mut b.collectives {
                        let first = *base.entry((r.comm_id, r.rank)).or_insert(r.seq);
                        r.seq -= first;
                    }
                    if late {
                        withheld.push(b);
                        continue;
                    }
                }
            }
            a.ingest(&b, recv);
        }
        a.tick(out.end_ns as i64 + 3_000_000);
        last_end = out.end_ns;
    }
    if late {
        let at = last_end + 5_000_000;
        for b in &withheld {
            a.ingest(b, at);
        }
        a.end_of_input(at);
        a.tick(at as i64 + 3_000_000);
    }
    a
}

/// The restarted agent's takeover and records all arrive after the other
/// members shipped their last record (it was refused until the killed
/// agent's connection timed out, and the job had ended): its members are
/// lined up with what the join still holds open of the others, not held
/// for references that never come (a CI run: 928 records held,
/// `NoReferences`).
#[test]
fn a_restarted_agent_that_connects_after_the_job_ended_is_lined_up() {
    let whole = feed_with_agent_restart(100, 100, 40);
    let a = feed_with_agent_restart_delivered(10, 14, 40, true);
    let r = a.report();
    let t = r.ingest.counters.takeover;
    assert!(t.taken_over > 0, "{t:?}");
    assert_eq!(t.lined_up, t.taken_over, "{t:?}");
    assert_eq!((t.lost, t.held), (0, 0), "{t:?}");
    // Every instance after the gap joins (a wrong offset would join none).
    let all = whole.report().ingest.instances_completed;
    let per_iteration = all / 40;
    let got = r.ingest.instances_completed;
    assert!(
        got + 4 * per_iteration + 2 >= all && got <= all,
        "{got} of {all} instances joined, {per_iteration} per iteration"
    );
}

#[test]
fn a_restarted_agents_renumbered_records_join_the_right_instances() {
    let whole = feed_with_agent_restart(100, 100, 60);
    let a = feed_with_agent_restart(10, 14, 60);
    let r = a.report();
    assert!(
        r.ingest.counters.records_rejected.is_empty(),
        "{:?}",
        r.ingest.counters.records_rejected
    );
    let t = r.ingest.counters.takeover;
    assert!(t.taken_over > 0, "{t:?}");
    assert_eq!(t.lined_up, t.taken_over, "{t:?}");
    assert_eq!((t.lost, t.held), (0, 0), "{t:?}");
    assert!(t.records > 0, "{t:?}");
    // Every instance joins but those of the 4 iterations nobody watched
    // node 1 in, give or take one a batch cut across the edge (a wrong
    // offset would join none of the 46 iterations after it).
    let all = whole.report().ingest.instances_completed;
    let per_iteration = all / 60;
    assert!(per_iteration > 0);
    let got = r.ingest.instances_completed;
    assert!(
        (all - 4 * per_iteration - 2..=all - 4 * per_iteration).contains(&got),
        "{got} of {all} instances joined, {per_iteration} per iteration"
    );
    assert!(whole.report().ingest.counters.takeover.is_zero());
}

/// The coordinator is restarted at iteration `restart` of a job whose rank
/// 5 is compute-slow from iteration 70 on; the new life is started from
/// the earlier one's baselines and page series (`carry`) or not. Returns
/// the second life after iteration `until`.
fn second_life(restart: u64, until: u64, carry: bool) -> Analyzer {
    let first = Analyzer::new(AnalyzerConfig::default());
    let second = Analyzer::new(AnalyzerConfig::default());
    second.resumed_life();
    let mut g = crate::synthjob::compute_fault(Some(70));
    crate::synthjob::start(&first, &mut g);
    crate::synthjob::start(&second, &mut g);
    for it in 0..until {
        if it == restart {
            if let Some(p) = first.iteration_period() {
                second.restore_period(p);
            }
            if carry {
                // Through JSON, as `--out` keeps them.
                let b = serde_json::to_string(&first.baselines().expect("learned")).unwrap();
                second.carry_over(serde_json::from_str(&b).unwrap(), first.timeline());
            }
        }
        let out = g.next_iteration();
        for (h, s) in &out.samples {
            first.add_clock_sample(h, *s).unwrap();
            second.add_clock_sample(h, *s).unwrap();
        }
        for (recv, b) in &out.batches {
            if it < restart {
                first.ingest(b, *recv);
                // The second life sees the declarations its agents resend.
                let mut declared = b.clone();
                declared.collectives.clear();
                declared.intervals.clear();
                declared.links.clear();
                declared.exits.clear();
                second.ingest(&declared, *recv);
            } else {
                second.ingest(b, *recv);
            }
        }
        if it < restart {
            first.tick(out.end_ns as i64 + 3_000_000);
        } else {
            second.tick(out.end_ns as i64 + 3_000_000);
        }
    }
    second
}

/// A restart 15 iterations into a slowdown: with the earlier life's
/// baselines the new one still tells the job slowed, from when, and
/// against the pace it had before the fault; learned afresh, the slow
/// steps became the job's pace. The page's series spans both lives.
#[test]
fn a_restart_mid_slowdown_keeps_the_jobs_pace() {
    let kept = second_life(85, 150, true).report();
    let sd = kept.slowdown.as_ref().expect("the slowdown is still told");
    assert!(sd.rise > 0.2, "{sd:?}");
    assert!((66..=76).contains(&sd.since_iteration), "{sd:?}");
    let afresh = second_life(85, 150, false).report();
    assert!(afresh.slowdown.is_none(), "{:?}", afresh.slowdown);
    let before = kept.job.baseline_step_ms.unwrap();
    let relearned = afresh.job.baseline_step_ms.unwrap();
    assert!(
        relearned > before * (1.0 + sd.rise / 2.0),
        "the fresh baseline ({relearned} ms) is the slow pace, the kept one ({before} ms) is not"
    );
    let rows = &second_life(85, 150, true).timeline().rows;
    assert!(
        rows.first().is_some_and(|r| r.first < 85),
        "{:?}",
        rows.first()
    );
    assert!(rows.last().is_some_and(|r| r.last >= 140));
}

/// A resend of a batch already taken is a duplicate before any other
/// check: a restarted life's clock model, not yet settled, once refused a
/// resend the killed life had journaled as "in the future", and the log
/// called it ingested. A new batch cut after it arrived is still refused,
/// with its numbers.
#[test]
fn a_resend_is_a_duplicate_whatever_its_clock_says() {
    let (a, mut g) = crate::synthjob::healthy();
    let out = g.next_iteration();
    let (recv, first) = out
        .batches
        .iter()
        .find(|(_, b)| b.host == "node-1")
        .cloned()
        .expect("node-1's first batch");
    let took = a.ingest(&first, recv);
    assert!(
        took.batch_rejected.is_none() && !took.duplicate_batch,
        "{took:?}"
    );
    let mut skewed = first.clone();
    skewed.mono_ns += 86_400_000_000_000;
    let again = a.ingest(&skewed, recv);
    assert!(again.duplicate_batch, "{again:?}");
    assert_eq!(again.batch_rejected, None);
    skewed.seq += 1;
    let new = a.ingest(&skewed, recv);
    assert_eq!(new.batch_rejected, Some("batch_in_future"));
    let why = new.batch_rejected_why.expect("the refusal in words");
    assert!(
        why.contains("after it arrived") && why.contains("bound"),
        "{why}"
    );
}

/// A job that ended while the coordinator was away: host node-1's agent
/// reconnects with a preamble telling of its ranks' exits, ahead of the
/// spooled batches holding their last iterations. The exits do not make
/// those iterations hang on them: the spool's records join when they come.
#[test]
fn an_exit_told_ahead_of_the_spooled_records_waits_for_them() {
    let (a, mut g) = crate::synthjob::healthy();
    let (mut spooled, mut declared, mut end) = (Vec::new(), None, 0);
    for it in 0..8u64 {
        let out = g.next_iteration();
        crate::synthjob::samples(&a, &out);
        for (recv, b) in out.batches {
            if b.host == "node-1" {
                declared.get_or_insert_with(|| b.clone());
                if it >= 4 {
                    spooled.push(b);
                    continue;
                }
            }
            a.ingest(&b, recv);
        }
        end = out.end_ns;
        a.tick(end as i64 + 3_000_000);
    }
    let declared = declared.expect("node-1's first batch");
    let last = spooled.last().expect("spooled batches").mono_ns;
    // Told 5 s after the job's end: past the hang timeout of every
    // iteration node-1's spool holds.
    let recv = end + 5_000_000_000;
    let preamble = Batch {
        seq: 0,
        mono_ns: g.spec().clocks[1].agent_ns(recv - 1_000_000),
        exits: declared
            .ranks
            .iter()
            .map(|id| RankExit {
                pid: id.pid,
                rank: id.rank,
                exit_ns: last + 500_000,
            })
            .collect(),
        collectives: Vec::new(),
        intervals: Vec::new(),
        links: Vec::new(),
        ..declared
    };
    let p = a.ingest(&preamble, recv);
    assert!(p.batch_rejected.is_none() && p.rejected == 0, "{p:?}");
    a.tick(recv as i64);
    assert!(a.report().hangs.is_empty(), "{:?}", a.report().hangs);
    for b in &spooled {
        a.ingest(b, recv + 1_000_000);
    }
    a.tick(recv as i64 + 2_000_000);
    let r = a.report();
    assert!(
        r.ingest.counters.records_rejected.is_empty(),
        "{:?}",
        r.ingest.counters.records_rejected
    );
    assert!(r.hangs.is_empty(), "{:?}", r.hangs);
    assert_eq!(r.job.exited_ranks, vec![4, 5, 6, 7]);
}

#[test]
fn only_records_that_came_too_late_count_as_replayed() {
    let late = RecordError::Late { comm_id: 1, seq: 5 };
    let backwards = RecordError::SequenceBackwards {
        comm_id: 1,
        rank: 3,
        seq: 5,
        last: 600,
    };
    let live = Source::Live { connected_at: 1000 };
    // Live: late only if it happened before its agent connected.
    assert!(live.replayed(&late, 999));
    assert!(!live.replayed(&late, 1000));
    assert!(!live.replayed(&backwards, 999));
    // A lined-up member's records may all be older than their instance.
    assert!(Source::LinedUp.replayed(&late, u64::MAX));
    assert!(!Source::LinedUp.replayed(&backwards, 0));
    // A superseded member's may also be behind the later agent's.
    assert!(Source::Superseded.replayed(&late, u64::MAX));
    assert!(Source::Superseded.replayed(&backwards, 0));
    assert!(!Source::Superseded.replayed(&RecordError::UnknownCommunicator { comm_id: 1 }, 0));
}
