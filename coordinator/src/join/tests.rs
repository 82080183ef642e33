use super::*;

#[test]
fn many_missing_ranks_are_a_count_with_ranges() {
    let mut ranks: Vec<u32> = (1..(1u32 << 20)).rev().collect();
    ranks.push(7); // said twice: counted once in the ranges
    let s = MissingSummary::new(1 << 20, ranks);
    assert_eq!(s.ranges, vec![[1, (1 << 20) - 1]]);
    assert_eq!(s.unlisted, 1, "one absent member has no known rank");
    assert!(s
        .describe()
        .starts_with("1048576 members, ranks 1-1048575 (1 not"));
    // Every other rank: the ranges stop at the cap, the rest is counted.
    let sparse = MissingSummary::new(1000, (0..1000).map(|r| r * 2).collect());
    assert_eq!(sparse.ranges.len(), MAX_MISSING_RANGES);
    assert_eq!(sparse.ranges[1], [2, 2]);
    assert_eq!(sparse.unlisted, 1000 - MAX_MISSING_RANGES as u64);
    // None known: only the count.
    let unknown = MissingSummary::new(5, Vec::new());
    assert!(unknown.ranges.is_empty());
    assert_eq!(
        unknown.describe(),
        "5 members (5 not in the ranges: never announced by an agent, or past 256 ranges)"
    );
}

fn comm(rank: u32, pos: u32, n: u32) -> CommRecord {
    CommRecord {
        pid: 100 + rank,
        rank,
        comm_id: 7,
        parent_id: 0,
        color: 0,
        nranks: n,
        rank_in_comm: pos,
        created_ns: 1,
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    }
}

fn rec(rank: u32, seq: u64, t: u64) -> CollectiveRecord {
    CollectiveRecord {
        pid: 100 + rank,
        rank,
        comm_id: 7,
        seq,
        op: CollOp::AllReduce,
        bytes: 1024,
        peer: -1,
        host_entry_ns: t,
        host_exit_ns: t + 10,
        gpu_arrive_ns: 0,
        gpu_done_ns: 0,
        launches_before: 3,
        sync_wait_ns_before: 0,
        gpu_busy_before_ns: None,
        ret: 0,
    }
}

fn joiner(n: u32) -> (Joiner, Arc<str>) {
    let j = Joiner::new(JoinConfig {
        max_open_per_comm: 8,
        open_records_per_comm: 0,
        hang_timeout_ns: 1_000,
        ..Default::default()
    });
    let h: Arc<str> = Arc::from("node-0");
    for r in 0..n {
        j.register_comm(&h, &comm(r, r, n)).unwrap();
    }
    (j, h)
}

/// Instances of a 4,096-rank communicator only one member was ever
/// announced in (a token holder claiming huge communicators): their
/// expiry costs the members seen, not the size claimed, so one pass
/// takes them all (walking every position, a pass took 256), and the
/// never-announced members are a count, not 4,095 nameless entries.
#[test]
fn unannounced_members_are_counted_not_walked() {
    let j = Joiner::new(JoinConfig {
        hang_timeout_ns: 1_000,
        hang_stale_ns: 2_000,
        ..Default::default()
    });
    let h: Arc<str> = Arc::from("evil");
    let (comms, per_comm) = (4u64, 256u64);
    for id in 0..comms {
        let c = CommRecord {
            comm_id: 100 + id,
            ..comm(0, 0, 4096)
        };
        j.register_comm(&h, &c).unwrap();
        for seq in 0..per_comm {
            let r = CollectiveRecord {
                comm_id: 100 + id,
                ..rec(0, seq, 10)
            };
            assert!(matches!(j.offer(&h, r).unwrap(), Offer::Pending));
        }
    }
    let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| false);
    assert_eq!(
        out.len() as u64,
        comms * per_comm,
        "one pass expires them all"
    );
    for e in &out {
        let Expired::Hang(c) = e else {
            panic!("{e:?}: absent members are a hang, not lost records")
        };
        assert!(c.missing.is_empty(), "{:?}", c.missing.first());
        assert_eq!(c.present_ranks, vec![0]);
        let sm = c.summary.as_ref().expect("counted");
        assert_eq!((sm.count, sm.unlisted), (4095, 4095));
        assert!(sm.ranges.is_empty());
    }
    assert_eq!(j.counters().missing_unlisted, 4095 * comms * per_comm);
    assert_eq!(j.open_instances(), 0);
}

/// One rank cannot be made a member of communicators without bound
/// (each holds state until the coordinator stops); its own
/// communicators announced again (a restart) still are.
#[test]
fn a_rank_joins_a_bounded_number_of_communicators() {
    let j = Joiner::new(JoinConfig::default());
    let h: Arc<str> = Arc::from("evil");
    let of = |id: u64, rank: u32| CommRecord {
        comm_id: 1000 + id,
        ..comm(rank, 0, 4096)
    };
    for id in 0..u64::from(MAX_COMMS_PER_RANK) {
        j.register_comm(&h, &of(id, 1)).unwrap();
    }
    let past = u64::from(MAX_COMMS_PER_RANK);
    assert!(matches!(
        j.register_comm(&h, &of(past, 1)),
        Err(RecordError::TooManyCommunicatorsForRank { rank: 1, .. })
    ));
    assert!(j.comm_nranks(1000 + past).is_none(), "nothing kept of it");
    j.register_comm(&h, &of(0, 1)).expect("announced again");
    j.register_comm(&h, &of(past, 2)).expect("another rank");
}

/// Past the list's bound, an arrival at a kept hang is taken off its
/// count: the hang resolves only when the count says nobody is out.
#[test]
fn a_hang_with_unannounced_members_does_not_resolve_on_the_named_ones() {
    let j = Joiner::new(JoinConfig {
        hang_timeout_ns: 1_000,
        hang_stale_ns: 2_000,
        ..Default::default()
    });
    let h: Arc<str> = Arc::from("node-0");
    for r in 0..2 {
        j.register_comm(&h, &comm(r, r, 100)).unwrap();
    }
    assert!(matches!(
        j.offer(&h, rec(0, 1, 10)).unwrap(),
        Offer::Pending
    ));
    let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| true);
    let [Expired::Hang(c)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        c.missing.iter().map(|m| m.rank).collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(c.summary.as_ref().map(|s| s.count), Some(99));
    match j.offer(&h, rec(1, 1, 20)).unwrap() {
        Offer::HangProgress { resolved, .. } => {
            assert!(!resolved, "98 members no agent announced are still out")
        }
        o => panic!("{o:?}"),
    }
}

/// Hangs on many communicators are all reported, but only
/// [`MAX_KEPT_HANGS`] are kept to resolve (each holds its absent list).
#[test]
fn hangs_kept_are_bounded_across_communicators() {
    let j = Joiner::new(JoinConfig {
        hang_timeout_ns: 1_000,
        ..Default::default()
    });
    let h: Arc<str> = Arc::from("node-0");
    let comms = 200u64;
    for id in 0..comms {
        for r in 0..2 {
            j.register_comm(
                &h,
                &CommRecord {
                    comm_id: 100 + id,
                    ..comm(r, r, 2)
                },
            )
            .unwrap();
        }
        for seq in 0..4 {
            let r = CollectiveRecord {
                comm_id: 100 + id,
                ..rec(0, seq, 10 + seq)
            };
            assert!(matches!(j.offer(&h, r).unwrap(), Offer::Pending));
        }
    }
    let mut hangs = 0;
    for _ in 0..100 {
        let out = j.expire(1_000_000, |_, t| t as CoordNs, |_, _, _| true);
        hangs += out.iter().filter(|e| matches!(e, Expired::Hang(_))).count();
        if out.is_empty() {
            break;
        }
    }
    assert_eq!(hangs as u64, comms * 4, "every hang is reported");
    let kept: usize = j.comms.iter().map(|e| e.hangs.len()).sum();
    assert_eq!(kept, MAX_KEPT_HANGS);
}

#[test]
fn fill_level_caps_the_largest_first() {
    assert_eq!(fill_level(&[40, 40, 40, 3], 63), 20);
    assert_eq!(fill_level(&[100, 2, 1], 50), 47);
    assert_eq!(fill_level(&[5, 5], 100), 5);
    assert_eq!(fill_level(&[], 10), 0);
}

#[test]
fn out_of_order_members_complete_once() {
    let (j, h) = joiner(3);
    assert!(matches!(j.offer(&h, rec(2, 0, 5)).unwrap(), Offer::Pending));
    assert!(matches!(j.offer(&h, rec(0, 1, 9)).unwrap(), Offer::Pending));
    assert!(matches!(j.offer(&h, rec(0, 0, 4)).unwrap(), Offer::Pending));
    assert!(matches!(
        j.offer(&h, rec(2, 0, 5)).unwrap(),
        Offer::Duplicate
    ));
    match j.offer(&h, rec(1, 0, 6)).unwrap() {
        Offer::Completed(i) => {
            assert_eq!(i.key, InstanceKey::Coll(0));
            assert_eq!(
                i.members.iter().map(|m| m.rank).collect::<Vec<_>>(),
                vec![0, 1, 2]
            );
        }
        o => panic!("{o:?}"),
    }
    assert!(matches!(
        j.offer(&h, rec(1, 0, 6)),
        Err(RecordError::SequenceBackwards { .. })
    ));
}

#[test]
fn unknown_comm_and_non_member_are_rejected() {
    let (j, h) = joiner(2);
    let mut r = rec(0, 0, 1);
    r.comm_id = 99;
    assert!(matches!(
        j.offer(&h, r),
        Err(RecordError::UnknownCommunicator { .. })
    ));
    assert!(matches!(
        j.offer(&h, rec(5, 0, 1)),
        Err(RecordError::NotAMember { .. })
    ));
    assert!(matches!(
        j.register_comm(&h, &comm(9, 0, 3)),
        Err(RecordError::CommSizeConflict { .. })
    ));
}

#[test]
fn window_is_bounded_and_evictions_counted() {
    let (j, h) = joiner(2);
    for s in 0..100 {
        j.offer(&h, rec(0, s, 10 + s)).unwrap();
    }
    assert!(j.open_instances() <= 8);
    assert_eq!(j.counters().evicted, 92);
    // Rank 1's record for an evicted instance is late, not a new instance.
    assert!(matches!(
        j.offer(&h, rec(1, 3, 13)),
        Err(RecordError::Late { .. })
    ));
}

#[test]
fn delayed_host_is_not_a_hang_until_it_reported_past_the_timeout() {
    let (j, h) = joiner(3);
    j.offer(&h, rec(0, 0, 200)).unwrap();
    j.offer(&h, rec(2, 0, 201)).unwrap();
    // The missing member's agent last reported at 500: its records may
    // still be on their way (spooled behind a link outage).
    let heard_at = |t: i64| move |_: u32, _: &str, deadline: CoordNs| t >= deadline;
    assert!(j.expire(1_300, |_, t| t as i64, heard_at(500)).is_empty());
    // Once it reported past the timeout without the record, it is a hang.
    assert_eq!(j.expire(1_300, |_, t| t as i64, heard_at(1_250)).len(), 1);
    // An agent silent past the stale limit is not waited for.
    let (j, h) = joiner(3);
    j.offer(&h, rec(0, 0, 200)).unwrap();
    let stale = JoinConfig::default().hang_stale_ns;
    assert_eq!(
        j.expire(stale + 300, |_, t| t as i64, heard_at(500)).len(),
        1
    );
}

#[test]
fn hang_names_missing_rank_and_last_completed() {
    let (j, h) = joiner(3);
    for s in 0..5 {
        for r in 0..3 {
            j.offer(&h, rec(r, s, 100 + s)).unwrap();
        }
    }
    // Rank 1 stops; 0 and 2 enter instance 5.
    j.offer(&h, rec(0, 5, 200)).unwrap();
    j.offer(&h, rec(2, 5, 201)).unwrap();
    assert!(j.expire(1_000, |_, t| t as i64, |_, _, _| true).is_empty());
    let exp = j.expire(1_300, |_, t| t as i64, |_, _, _| true);
    assert_eq!(exp.len(), 1);
    let Expired::Hang(hc) = &exp[0] else {
        panic!("{exp:?}")
    };
    assert_eq!(hc.key, InstanceKey::Coll(5));
    assert_eq!(hc.present_ranks, vec![0, 2]);
    assert_eq!(hc.missing.len(), 1);
    assert_eq!(hc.missing[0].rank, 1);
    assert_eq!(hc.missing[0].last_completed_seq, Some(4));
    // It finally shows up: the hang resolves, and the instance joins
    // after all (a wait past the timeout is data, not loss).
    let Offer::HangProgress {
        resolved: true,
        completed: Some(i),
        ..
    } = j.offer(&h, rec(1, 5, 202)).unwrap()
    else {
        panic!("not resolved and joined")
    };
    assert_eq!(i.key, InstanceKey::Coll(5));
    let ranks: Vec<u32> = i.members.iter().map(|m| m.rank).collect();
    assert_eq!(ranks, vec![0, 1, 2]);
}

#[test]
fn lost_record_is_incomplete_not_hang() {
    let (j, h) = joiner(2);
    j.offer(&h, rec(0, 0, 10)).unwrap(); // rank 1's record for 0 is lost
    j.offer(&h, rec(0, 1, 20)).unwrap();
    j.offer(&h, rec(1, 1, 21)).unwrap();
    let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
    assert!(
        matches!(exp.as_slice(), [Expired::Incomplete { .. }]),
        "{exp:?}"
    );
}

#[test]
fn member_whose_data_is_not_current_is_not_missing_yet() {
    // Two hosts; host b's agent ships late. Its ranks' records for
    // instance 0 are still in flight when the timeout passes.
    let j = Joiner::new(JoinConfig {
        hang_timeout_ns: 1_000,
        hang_stale_ns: 100_000,
        ..Default::default()
    });
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    for r in 0..4 {
        j.register_comm(if r < 2 { &a } else { &b }, &comm(r, r, 4))
            .unwrap();
    }
    j.offer(&a, rec(0, 0, 100)).unwrap();
    j.offer(&a, rec(1, 0, 101)).unwrap();
    let wm_b = std::cell::Cell::new(500i64);
    let current = |_: u32, h: &str, deadline: i64| h == "a" || wm_b.get() >= deadline;
    assert!(j.expire(5_000, |_, t| t as i64, current).is_empty());
    assert_eq!(j.open_instances(), 1);
    // Host b's batch arrives: its ranks passed instance 0 long ago.
    j.offer(&b, rec(2, 0, 102)).unwrap();
    assert!(matches!(
        j.offer(&b, rec(3, 0, 103)).unwrap(),
        Offer::Completed(_)
    ));
    // Instance 1: rank 3 never comes; once b is current past the
    // deadline, it is missing (and only it).
    j.offer(&a, rec(0, 1, 6_000)).unwrap();
    j.offer(&a, rec(1, 1, 6_001)).unwrap();
    j.offer(&b, rec(2, 1, 6_002)).unwrap();
    wm_b.set(6_500);
    assert!(j.expire(8_000, |_, t| t as i64, current).is_empty());
    wm_b.set(7_100);
    let exp = j.expire(8_000, |_, t| t as i64, current);
    let [Expired::Hang(h)] = exp.as_slice() else {
        panic!("{exp:?}")
    };
    assert_eq!(
        h.missing.iter().map(|m| m.rank).collect::<Vec<_>>(),
        vec![3]
    );
    assert_eq!(h.present_ranks, vec![0, 1, 2]);
}

#[test]
fn later_records_arriving_first_do_not_hide_a_hang() {
    // Rank 1's older records reach the coordinator after the others'
    // records of the stuck instance: it is still missing from it.
    let (j, h) = joiner(3);
    j.offer(&h, rec(0, 0, 10)).unwrap();
    j.offer(&h, rec(2, 0, 11)).unwrap();
    j.offer(&h, rec(0, 1, 20)).unwrap();
    j.offer(&h, rec(2, 1, 21)).unwrap();
    j.offer(&h, rec(1, 0, 12)).unwrap();
    let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
    let [Expired::Hang(hc)] = exp.as_slice() else {
        panic!("{exp:?}")
    };
    assert_eq!(hc.key, InstanceKey::Coll(1));
    assert_eq!(hc.missing[0].rank, 1);
    assert_eq!(hc.missing[0].last_completed_seq, Some(0));
}

#[test]
fn stale_agent_still_ends_in_a_hang() {
    let (j, h) = joiner(2);
    j.offer(&h, rec(0, 0, 10)).unwrap();
    let never = |_: u32, _: &str, _: i64| false;
    let mut j2 = j;
    j2.cfg.hang_stale_ns = 50_000;
    assert!(j2.expire(20_000, |_, t| t as i64, never).is_empty());
    let exp = j2.expire(60_000, |_, t| t as i64, never);
    assert!(matches!(exp.as_slice(), [Expired::Hang(_)]), "{exp:?}");
}

#[test]
fn p2p_pairs_by_ordinal_not_seq() {
    let (j, h) = joiner(2);
    let mut send = rec(0, 3, 10);
    send.op = CollOp::Send;
    send.peer = 1;
    let mut recv = rec(1, 0, 12);
    recv.op = CollOp::Recv;
    recv.peer = 0;
    assert!(matches!(j.offer(&h, send).unwrap(), Offer::Pending));
    match j.offer(&h, recv).unwrap() {
        Offer::Completed(i) => assert_eq!(
            i.key,
            InstanceKey::P2p {
                lo: 0,
                hi: 1,
                ordinal: 0
            }
        ),
        o => panic!("{o:?}"),
    }
    let mut bad = rec(1, 5, 20);
    bad.op = CollOp::Recv;
    bad.peer = 1;
    assert!(matches!(j.offer(&h, bad), Err(RecordError::BadPeer { .. })));
}

/// Member `rank` of a 2-member communicator receives from the other.
fn recv_from_other(rank: u32, seq: u64, t: u64) -> CollectiveRecord {
    let mut r = rec(rank, seq, t);
    r.op = CollOp::Recv;
    r.peer = 1 - rank as i32;
    r
}

/// A pipeline stage whose agent restarted: its sends and receives cannot
/// be numbered (what it missed is unknown), so they are not joined; the
/// next stage's operations they would pair with are not its hang when it
/// is seen issuing to that stage past their timeout, and are its hang
/// when it is not.
#[test]
fn a_peer_seen_going_on_with_unjoinable_p2p_is_not_hung() {
    // Rank 1 receives twice from rank 0, whose records are lost.
    let (j, h) = joiner(2);
    assert!(matches!(
        j.offer(&h, recv_from_other(1, 0, 10)).unwrap(),
        Offer::Pending
    ));
    assert!(matches!(
        j.offer(&h, recv_from_other(1, 1, 900)).unwrap(),
        Offer::Pending
    ));
    // Rank 0 went on past the first's timeout (10 + 1,000) but not the
    // second's (900 + 1,000).
    j.p2p_unjoinable(7, 0, 1, 1_500);
    let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
    assert!(
        matches!(
            exp.as_slice(),
            [
                Expired::Incomplete { .. },
                Expired::Hang(HangCandidate { .. })
            ]
        ),
        "{exp:?}"
    );
    let Expired::Hang(hc) = &exp[1] else {
        unreachable!()
    };
    assert_eq!(hc.missing[0].rank, 0);
    // Nothing seen of rank 0 at all: both are its hang.
    let (j, h) = joiner(2);
    j.offer(&h, recv_from_other(1, 0, 10)).unwrap();
    j.offer(&h, recv_from_other(1, 1, 900)).unwrap();
    let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
    assert_eq!(exp.len(), 2);
    assert!(exp.iter().all(|e| matches!(e, Expired::Hang(_))), "{exp:?}");
}

/// A send/recv already called hung (its peer's agent was gone longer than
/// the hang timeout) is one the peer went on past once the peer's
/// unnumbered operations to the same member show up after it began, and
/// only then (stop 49: a pipeline job's restarted stage ranks were hung to
/// the end of the run).
#[test]
fn a_hung_send_recv_whose_peer_shows_up_later_is_one_it_went_on_past() {
    let (j, h) = joiner(2);
    j.offer(&h, recv_from_other(1, 0, 10)).unwrap();
    let exp = j.expire(5_000, |_, t| t as i64, |_, _, _| true);
    let [Expired::Hang(hc)] = exp.as_slice() else {
        panic!("{exp:?}")
    };
    let InstanceKey::P2p { lo, hi, .. } = hc.key else {
        panic!("{hc:?}")
    };
    assert_eq!((hc.missing[0].rank, lo, hi), (0, 0, 1));
    assert!(!j.p2p_went_on(7, 0, 1, hc.entered_at), "nothing seen yet");
    // An operation from before the instance began says nothing.
    j.p2p_unjoinable(7, 0, 1, 5);
    assert!(!j.p2p_went_on(7, 0, 1, hc.entered_at));
    // One to another peer neither.
    j.p2p_unjoinable(7, 0, 3, 6_000);
    assert!(!j.p2p_went_on(7, 0, 1, hc.entered_at));
    j.p2p_unjoinable(7, 0, 1, 6_000);
    assert!(j.p2p_went_on(7, 0, 1, hc.entered_at));
}
