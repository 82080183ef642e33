use super::*;

fn folded(lines: &[(&str, u64)]) -> Folded {
    Folded {
        stacks: lines.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    }
}

#[test]
fn top_frame_is_where_the_difference_starts() {
    let healthy = folded(&[
        ("main;step;load_batch;sleep;nanosleep", 5),
        ("main;step;forward;launch", 20),
        ("main;step;synchronize;wait", 75),
    ]);
    let slow = folded(&[
        ("main;step;load_batch;sleep;nanosleep", 30),
        ("main;step;forward;launch", 20),
        ("main;step;synchronize;wait", 50),
    ]);
    let top = top_frames(&slow, &healthy, Threads::All, 3);
    assert_eq!(top[0].frame, "load_batch", "{top:#?}");
    assert!((top[0].flagged_share - 0.30).abs() < 1e-9);
    assert!((top[0].reference_share - 0.05).abs() < 1e-9);
    assert!(top.iter().all(|t| t.frame != "sleep" && t.frame != "main"));
}

#[test]
fn parts_split_the_training_thread_on_and_off_cpu_by_what_it_waited_in() {
    let f = folded(&[
            ("py [main];train;load_batch;read;vfs_read_[k];schedule_[k];__schedule_[k]", 30),
            ("py [main];train;forward;launch", 20),
            ("py [main];train;sync;cudaStreamSynchronize;futex_wait_[k];schedule_[k];__schedule_[k]", 40),
            ("py [main];train;allreduce;ncclAllReduce;futex_wait_[k];__schedule_[k]", 5),
            ("py [main];train;pin;pthread_mutex_lock;futex_wait_[k];__schedule_[k]", 3),
            ("py [main];train;app::Trainer::synchronize;std::Condvar::wait;futex_wait_[k];__schedule_[k]", 7),
            ("py [main];train;nap;clock_nanosleep;do_nanosleep_[k];__schedule_[k]", 2),
            ("nccl-proxy;poll;futex_wait_[k];__schedule_[k]", 500),
        ]);
    let on = select(&f, Part::TrainOnCpu);
    assert_eq!(on.lines(), "py [main];train;forward;launch 20\n");
    let off = select(&f, Part::TrainOffCpu);
    let cat = |label: &str| -> u64 {
        off.stacks
            .iter()
            .filter(|(k, _)| k.split(';').nth(1) == Some(label))
            .map(|(_, w)| *w)
            .sum()
    };
    assert_eq!(cat(Wait::Io.label()), 30);
    assert_eq!(cat(Wait::GpuSync.label()), 47);
    assert_eq!(cat(Wait::Collective.label()), 5);
    assert_eq!(cat(Wait::Lock.label()), 3);
    assert_eq!(cat(Wait::Sleep.label()), 2);
    assert_eq!(
        off.total(),
        87,
        "the proxy thread is not the training thread"
    );
    assert_eq!(select(&f, Part::AllThreads), f);
    // A thread the agent marked as issuing the collectives counts too.
    assert!(is_training_thread("python [train]"));
    assert!(!is_training_thread("pt_autograd_0"));
}

#[test]
fn the_training_thread_difference_is_not_drowned_by_parked_threads() {
    // The issue-24 shape: helper threads parked most of the time, the
    // training thread's load_batch a sliver of the whole process.
    let healthy = folded(&[
        ("t [main];step;load_batch;clock_nanosleep;__schedule_[k]", 4),
        (
            "t [main];step;sync;cudaStreamSynchronize;__schedule_[k]",
            50,
        ),
        ("t [main];step;compute", 46),
        ("gpu-stream;wait;futex_wait_[k];__schedule_[k]", 1000),
        ("nccl-proxy;wait;futex_wait_[k];__schedule_[k]", 500),
    ]);
    let slow = folded(&[
        (
            "t [main];step;load_batch;clock_nanosleep;__schedule_[k]",
            40,
        ),
        (
            "t [main];step;sync;cudaStreamSynchronize;__schedule_[k]",
            20,
        ),
        ("t [main];step;compute", 40),
        ("gpu-stream;wait;futex_wait_[k];__schedule_[k]", 1100),
        ("nccl-proxy;wait;futex_wait_[k];__schedule_[k]", 400),
    ]);
    let top = top_frames(
        &select_as(&slow, Part::TrainOffCpu, false),
        &select_as(&healthy, Part::TrainOffCpu, false),
        Threads::All,
        3,
    );
    assert_eq!(top[0].frame, "load_batch", "{top:#?}");
    assert!((top[0].flagged_share - 40.0 / 60.0).abs() < 1e-9);
    let dir = std::env::temp_dir().join(format!("slowrank-flame-parts-{}", std::process::id()));
    let windows: Vec<StackWindow> = [(1u32, &slow), (2, &healthy), (3, &healthy)]
        .iter()
        .map(|(rank, f)| {
            let mut strings: Vec<String> = Vec::new();
            let stacks = f
                .stacks
                .iter()
                .map(|(k, w)| slowrank_shared::wire::FoldedStack {
                    frames: k
                        .split(';')
                        .map(|x| {
                            strings.iter().position(|s| s == x).unwrap_or_else(|| {
                                strings.push(x.to_owned());
                                strings.len() - 1
                            }) as u32
                        })
                        .collect(),
                    weight: *w,
                })
                .collect();
            StackWindow {
                rank: *rank,
                view: StackView::Cpu,
                start_ns: 0,
                end_ns: 10,
                strings,
                stacks,
                records: 1,
                truncated: 0,
                overflow_weight: 0,
            }
        })
        .collect();
    let r = diff(&DiffRequest {
        windows: &windows,
        flagged: 1,
        candidates: &[2, 3],
        view: StackView::Cpu,
        start_ns: 0,
        end_ns: 10,
        out_dir: &dir,
        top: 5,
        threads: Threads::Main,
    })
    .unwrap();
    let parts: Vec<&str> = r.views.iter().map(|v| v.part.as_str()).collect();
    assert_eq!(parts, ["train-oncpu", "train-offcpu", "all-threads"]);
    for v in &r.views {
        assert!(
            std::path::Path::new(&v.diff_svg).is_file(),
            "{}",
            v.diff_svg
        );
    }
    assert_eq!(r.top_frames[0].frame, "load_batch");
    assert_eq!(r.views[1].top_frames[0].frame, "load_batch");
    // On- and off-CPU make up the training thread.
    assert!((r.views[0].flagged_share + r.views[1].flagged_share - 1.0).abs() < 1e-9);
    assert!((r.views[2].flagged_share - 1.0).abs() < 1e-9);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_role_is_the_dp_peers() {
    // tp2 pp2 dp2: rank = pp*4 + dp*2 + tp
    assert_eq!(same_role(5, 2, 2, 2), vec![7]);
    assert_eq!(same_role(0, 1, 1, 4), vec![1, 2, 3]);
}

#[test]
fn median_rank_skips_the_odd_one() {
    let a = folded(&[("m;x", 50), ("m;y", 50)]);
    let b = folded(&[("m;x", 48), ("m;y", 52)]);
    let c = folded(&[("m;x", 90), ("m;y", 10)]);
    assert_eq!(median_rank(&[(1, c), (2, a), (3, b)]), Some(2));
}

#[test]
fn windows_survive_the_wire_and_fold() {
    use slowrank_shared::wire::{decode, encode, Batch, FoldedStack};
    let w = StackWindow {
        rank: 2,
        view: StackView::Cpu,
        start_ns: 10,
        end_ns: 20,
        strings: vec!["py [main]".into(), "train".into(), "load_batch".into()],
        stacks: vec![
            FoldedStack {
                frames: vec![0, 1, 2],
                weight: 7,
            },
            FoldedStack {
                frames: vec![0, 1],
                weight: 3,
            },
        ],
        records: 10,
        truncated: 1,
        overflow_weight: 0,
    };
    let batch = Batch {
        stacks: vec![w],
        ..Default::default()
    };
    let back: Batch = decode(&encode(&batch).unwrap()).unwrap();
    assert_eq!(back, batch);
    let f = fold(&back.stacks, 2, StackView::Cpu, 0, 100).unwrap();
    assert_eq!(
        f.lines(),
        "py [main];train 3\npy [main];train;load_batch 7\n"
    );
    assert!(fold(&back.stacks, 2, StackView::Cpu, 20, 30)
        .unwrap()
        .stacks
        .is_empty());
}

#[test]
fn bad_index_is_an_error() {
    let w = StackWindow {
        rank: 1,
        view: StackView::Cpu,
        start_ns: 0,
        end_ns: 10,
        strings: vec!["a".into()],
        stacks: vec![slowrank_shared::wire::FoldedStack {
            frames: vec![0, 5],
            weight: 1,
        }],
        records: 1,
        truncated: 0,
        overflow_weight: 0,
    };
    assert!(matches!(
        fold(&[w], 1, StackView::Cpu, 0, 10),
        Err(FlameError::BadIndex { index: 5, .. })
    ));
}
