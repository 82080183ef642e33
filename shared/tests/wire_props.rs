//! Properties of the wire format over arbitrary batches: encode → decode
//! gives the batch back, and no single corrupted byte of an encoding makes
//! `decode` panic (it answers Ok or an error with a reason); clock-port
//! datagrams refuse any change.

use proptest::collection::vec;
use proptest::prelude::*;
use slowrank_shared::clock_udp::Datagram;
use slowrank_shared::probe::MAX_ARGS;
use slowrank_shared::wire::{
    self, Batch, CallRecord, CollOp, CollectiveRecord, CommRecord, FoldedStack, LinkRecord,
    ProbeDesc, RankExit, RankIdentity, RankInterval, StackView, StackWindow,
};

fn op() -> impl Strategy<Value = CollOp> {
    prop_oneof![
        Just(CollOp::AllReduce),
        Just(CollOp::AllGather),
        Just(CollOp::ReduceScatter),
        Just(CollOp::Broadcast),
        Just(CollOp::Reduce),
        Just(CollOp::AllToAll),
        Just(CollOp::Send),
        Just(CollOp::Recv),
    ]
}

fn identity() -> impl Strategy<Value = RankIdentity> {
    (any::<[u32; 7]>(), ".{0,12}", any::<u64>()).prop_map(|(n, job_id, seen_ns)| RankIdentity {
        pid: n[0],
        rank: n[1],
        world_size: n[2],
        local_rank: n[3],
        local_world_size: n[4],
        group_rank: n[5],
        restart_count: n[6],
        job_id,
        seen_ns,
    })
}

fn comm() -> impl Strategy<Value = CommRecord> {
    (any::<[u32; 4]>(), any::<[u64; 3]>(), any::<i32>()).prop_map(|(n, w, color)| CommRecord {
        pid: n[0],
        rank: n[1],
        comm_id: w[0],
        parent_id: w[1],
        color,
        nranks: n[2],
        rank_in_comm: n[3],
        created_ns: w[2],
        split_ordinal: 0,
        split_key: 0,
        resumed: false,
    })
}

fn collective() -> impl Strategy<Value = CollectiveRecord> {
    (
        any::<[u32; 3]>(),
        any::<[u64; 8]>(),
        op(),
        any::<i32>(),
        any::<i32>(),
    )
        .prop_map(|(n, w, op, peer, ret)| CollectiveRecord {
            pid: n[0],
            rank: n[1],
            comm_id: w[0],
            seq: w[1],
            op,
            bytes: w[2],
            peer,
            host_entry_ns: w[3],
            host_exit_ns: w[4],
            gpu_arrive_ns: w[5],
            gpu_done_ns: w[6],
            launches_before: n[2],
            sync_wait_ns_before: w[7],
            gpu_busy_before_ns: (w[7] % 2 == 0).then_some(w[6]),
            ret,
        })
}

fn interval() -> impl Strategy<Value = RankInterval> {
    (any::<[u32; 4]>(), any::<[u64; 14]>(), any::<bool>()).prop_map(|(n, w, b)| RankInterval {
        pid: n[0],
        rank: n[1],
        start_ns: w[0],
        end_ns: w[1],
        launches: w[2],
        launch_ns: w[3],
        sync_calls: w[4],
        sync_wait_ns: w[5],
        oncpu_ns: w[6],
        runq_delay_ns: w[7],
        offcpu_ns: w[8],
        launch_counted_ns: w[9],
        probe_hits: w[10],
        probe_cost_ns: w[11],
        datapath_cost_ns: w[13],
        trap_pair_ns: n[2],
        launch_duty_ppm: n[3],
        budget_narrowed: b,
        agent_cpu_ns: w[12],
    })
}

fn link() -> impl Strategy<Value = LinkRecord> {
    (any::<[u32; 5]>(), any::<i64>(), any::<[u64; 6]>()).prop_map(|(n, peer_rank, w)| LinkRecord {
        pid: n[0],
        rank: n[1],
        peer_rank,
        qp_num: n[2],
        dest_qp_num: n[3],
        start_ns: w[0],
        end_ns: w[1],
        posts: w[2],
        completions: w[3],
        post_to_completion_ns: w[4],
        bytes: w[5],
        dlid: n[4],
    })
}

fn call() -> impl Strategy<Value = CallRecord> {
    (
        any::<u64>(),
        any::<[u32; 3]>(),
        any::<bool>(),
        any::<[u64; MAX_ARGS]>(),
        any::<u64>(),
    )
        .prop_map(|(ts_ns, n, is_return, args, ret)| CallRecord {
            ts_ns,
            pid: n[0],
            tid: n[1],
            probe: n[2],
            is_return,
            args,
            ret,
        })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        (".{0,16}", ".{0,16}", any::<[u64; 5]>()),
        (
            vec(identity(), 0..4),
            vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..4),
            vec(comm(), 0..4),
            vec(collective(), 0..16),
        ),
        (
            vec(interval(), 0..4),
            vec(link(), 0..4),
            vec((any::<u32>(), ".{0,24}", ".{0,16}"), 0..3),
            vec(call(), 0..8),
        ),
    )
        .prop_map(
            |(
                (host, agent_id, w),
                (ranks, exits, comms, collectives),
                (intervals, links, probes, calls),
            )| Batch {
                host,
                agent_id,
                seq: w[0],
                mono_ns: w[1],
                wall_ns: w[2],
                ranks,
                exits: exits
                    .into_iter()
                    .map(|(pid, rank, exit_ns)| RankExit { pid, rank, exit_ns })
                    .collect(),
                comms,
                collectives,
                intervals,
                links,
                probes: probes
                    .into_iter()
                    .map(|(id, path, symbol)| ProbeDesc { id, path, symbol })
                    .collect(),
                calls,
                ringbuf_drops: w[3],
                spool_drops: w[4],
                // One folded-stack window shaped by the same draws.
                stacks: vec![StackWindow {
                    rank: w[0] as u32,
                    view: if w[1] % 2 == 0 {
                        StackView::Cpu
                    } else {
                        StackView::Launch
                    },
                    start_ns: w[1],
                    end_ns: w[2],
                    strings: vec!["main".into(), "load_batch".into()],
                    stacks: vec![FoldedStack {
                        frames: vec![0, 1],
                        weight: w[3],
                    }],
                    records: w[4],
                    truncated: w[0] % 7,
                    overflow_weight: w[2] % 5,
                }],
            },
        )
}

proptest! {
    #[test]
    fn encode_decode_round_trips(b in batch()) {
        let bytes = wire::encode(&b).unwrap();
        prop_assert_eq!(wire::decode::<Batch>(&bytes).unwrap(), b);
    }

    #[test]
    fn any_single_byte_corruption_never_panics(
        b in batch(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..,
    ) {
        let mut bytes = wire::encode(&b).unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        match wire::decode::<Batch>(&bytes) {
            // A changed header byte is always caught by the header checks
            // (the reserved byte at 7 is not checked, the archive then is
            // intact); a changed archive byte may still be a valid archive
            // (e.g. a flipped timestamp), but never a panic.
            Ok(_) => prop_assert!(
                i == 7 || i >= wire::HEADER_LEN,
                "header byte {} corrupted but accepted",
                i
            ),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn every_truncation_is_an_error(b in batch(), at in any::<prop::sample::Index>()) {
        let bytes = wire::encode(&b).unwrap();
        let cut = at.index(bytes.len());
        prop_assert!(wire::decode::<Batch>(&bytes[..cut]).is_err());
    }
}

fn datagram() -> impl Strategy<Value = Datagram> {
    (any::<[u8; 16]>(), any::<[u64; 4]>(), 0u8..3).prop_map(|(token, w, k)| match k {
        0 => Datagram::Hello {
            token,
            counter: w[0],
        },
        1 => Datagram::Probe {
            token,
            seq: w[0],
            coord_send_ns: w[1],
        },
        _ => Datagram::Answer {
            token,
            seq: w[0],
            coord_send_ns: w[1],
            agent_recv_ns: w[2],
            agent_send_ns: w[3],
        },
    })
}

proptest! {
    /// Clock-port datagrams: any byte changed anywhere, or any bytes at
    /// all, are refused (the MAC covers everything before it), never a panic.
    #[test]
    fn clock_datagrams_refuse_every_change(
        d in datagram(),
        key in any::<[u8; 32]>(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..,
        junk in vec(any::<u8>(), 0..100),
    ) {
        let mut bytes = d.encode(&key);
        prop_assert_eq!(Datagram::decode(&bytes, &key), Ok(d));
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        // Byte 6–7 are reserved, yet MAC'd: a change there fails too.
        prop_assert!(Datagram::decode(&bytes, &key).is_err(), "byte {} changed, accepted", i);
        prop_assert!(Datagram::decode(&junk, &key).is_err());
    }
}
