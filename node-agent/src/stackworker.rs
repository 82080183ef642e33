//! Runs the [`StackFeed`] on a thread of its own, so the agent's loop never
//! waits for symbolization.
//!
//! The first stacks of a process make blazesym read and index every ELF file
//! it maps (and the kernel's symbols): seconds of CPU on a loaded host, far
//! more for a PyTorch process. Done on the agent's loop, that stalled rank
//! discovery, the probe ring's drains and the batches for as long: beside a
//! CPU hog, a rank that started 100 ms after its host's others went
//! unobserved for its whole 5 s run (the deep-links test, 3 of 8 runs).
//!
//! The loop talks to the worker by messages that never block; the worker
//! drains the stack ring every [`POLL`], applies the messages in order, and
//! leaves each cut window in a queue the loop takes from when it cuts a
//! batch.

use std::{
    collections::VecDeque,
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use slowrank_shared::wire::{CollectiveRecord, StackWindow};

use crate::{stack_collector::CollectorError, stackfeed::StackFeed, stacks::StackCounters};

/// How often the worker takes what the drain thread queued when no message
/// comes. The queue holds [`crate::stacks::MAX_DRAINED`] records, seconds of
/// the busiest window, so 16 ms loses nothing; 5 ms woke the thread 200
/// times a second for an idle queue. A cut takes the queue first.
const POLL: Duration = Duration::from_millis(16);
/// Windows kept for the next batch when none takes them (oldest dropped).
const MAX_READY: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum StackWorkerError {
    #[error("cannot start the stack thread")]
    Spawn(#[source] std::io::Error),
    #[error(transparent)]
    Start(CollectorError),
    #[error("the stack thread died while starting")]
    Died,
}

enum Msg {
    Sync(Vec<(u32, u32)>),
    OpenLaunch(Vec<u32>, Duration),
    CloseLaunch,
    TrainingThreads(Vec<(u32, u32)>),
    Collectives(Vec<CollectiveRecord>),
    Cut {
        now_ns: u64,
        last: bool,
    },
    /// Answered once every earlier message is applied.
    Barrier(mpsc::Sender<()>),
    Counters(mpsc::Sender<Result<StackCounters, CollectorError>>),
}

#[derive(Default)]
struct Ready {
    windows: VecDeque<StackWindow>,
    dropped: u64,
}

impl Ready {
    fn bound(&mut self) {
        while self.windows.len() > MAX_READY {
            self.windows.pop_front();
            self.dropped += 1;
        }
    }
}

/// What the worker drives: [`StackFeed`], or a stand-in in tests.
pub trait Feed {
    fn sync(&mut self, ranks: Vec<(u32, u32)>);
    fn open_launch_window(&mut self, ranks: &[u32], dur: Duration);
    fn close_launch_window(&mut self);
    fn training_threads(&mut self, threads: &[(u32, u32)]);
    fn collectives(&mut self, records: &[CollectiveRecord]);
    /// Drains the kernel's ring (and symbolizes what it holds).
    fn poll(&mut self);
    fn cut_window(&mut self, now_ns: u64, last: bool);
    fn take(&mut self) -> Vec<StackWindow>;
    fn counters(&self) -> Result<StackCounters, CollectorError>;
}

impl Feed for StackFeed {
    fn sync(&mut self, ranks: Vec<(u32, u32)>) {
        StackFeed::sync(self, ranks.into_iter());
    }
    fn open_launch_window(&mut self, ranks: &[u32], dur: Duration) {
        StackFeed::open_launch_window(self, ranks, dur);
    }
    fn close_launch_window(&mut self) {
        StackFeed::close_launch_window(self);
    }
    fn training_threads(&mut self, threads: &[(u32, u32)]) {
        StackFeed::training_threads(self, threads);
    }
    fn collectives(&mut self, records: &[CollectiveRecord]) {
        StackFeed::collectives(self, records);
    }
    fn poll(&mut self) {
        StackFeed::poll(self);
    }
    fn cut_window(&mut self, now_ns: u64, last: bool) {
        StackFeed::cut_window(self, now_ns, last);
    }
    fn take(&mut self) -> Vec<StackWindow> {
        StackFeed::take(self)
    }
    fn counters(&self) -> Result<StackCounters, CollectorError> {
        StackFeed::counters(self)
    }
}

/// The loop's handle on the stack worker.
pub struct StackWorker {
    tx: mpsc::Sender<Msg>,
    ready: Arc<Mutex<Ready>>,
    thread: Option<JoinHandle<()>>,
}

impl StackWorker {
    /// Starts the worker thread and builds the feed on it with `make`
    /// (blazesym's symbolizer cannot move between threads); returns once
    /// `make` has succeeded or failed.
    pub fn start<F, C>(make: F) -> Result<Self, StackWorkerError>
    where
        C: Feed,
        F: FnOnce() -> Result<C, CollectorError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let (started_tx, started_rx) = mpsc::channel();
        let ready = Arc::new(Mutex::new(Ready::default()));
        let shared = ready.clone();
        let thread = std::thread::Builder::new()
            .name("slowrank-stacks".into())
            .spawn(move || match make() {
                Ok(feed) => {
                    let _ = started_tx.send(Ok(()));
                    run(feed, &rx, &shared);
                }
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                }
            })
            .map_err(StackWorkerError::Spawn)?;
        match started_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                tx,
                ready,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(StackWorkerError::Start(e))
            }
            Err(_) => {
                let _ = thread.join();
                Err(StackWorkerError::Died)
            }
        }
    }

    fn send(&self, m: Msg) {
        // A worker that died (it panicked) has logged why; the loop goes on
        // without stacks.
        let _ = self.tx.send(m);
    }

    /// The agent's current (pid, global rank) list: see [`StackFeed::sync`].
    pub fn sync(&self, ranks: impl Iterator<Item = (u32, u32)>) {
        self.send(Msg::Sync(ranks.collect()));
    }

    /// See [`StackFeed::open_launch_window`].
    pub fn open_launch_window(&self, ranks: &[u32], dur: Duration) {
        self.send(Msg::OpenLaunch(ranks.to_vec(), dur));
    }

    /// See [`StackFeed::close_launch_window`].
    pub fn close_launch_window(&self) {
        self.send(Msg::CloseLaunch);
    }

    /// See [`StackFeed::training_threads`].
    pub fn training_threads(&self, threads: &[(u32, u32)]) {
        self.send(Msg::TrainingThreads(threads.to_vec()));
    }

    /// The collectives of a batch that carry GPU-side marks (the others are
    /// not sent): see [`StackFeed::collectives`].
    pub fn collectives(&self, records: &[CollectiveRecord]) {
        let marked: Vec<CollectiveRecord> = records
            .iter()
            .filter(|c| c.gpu_arrive_ns != 0)
            .cloned()
            .collect();
        if !marked.is_empty() {
            self.send(Msg::Collectives(marked));
        }
    }

    /// Ends the current window at `now_ns` (CLOCK_MONOTONIC); it reaches
    /// [`StackWorker::take`] once the worker has folded what came before.
    pub fn cut_window(&self, now_ns: u64, last: bool) {
        self.send(Msg::Cut { now_ns, last });
    }

    /// Waits (at most `limit`) until every message sent so far is applied:
    /// before the last batch, so it carries the last window.
    pub fn settle(&self, limit: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Barrier(tx));
        rx.recv_timeout(limit).is_ok()
    }

    /// The stack programs' kernel-side counters (waits for the worker).
    pub fn counters(&self, limit: Duration) -> Option<Result<StackCounters, CollectorError>> {
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Counters(tx));
        rx.recv_timeout(limit).ok()
    }

    /// Windows cut so far, for the batch being cut.
    pub fn take(&self) -> Vec<StackWindow> {
        let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        r.windows.drain(..).collect()
    }

    /// Gives windows back when the batch could not be cut.
    pub fn put_back(&self, windows: Vec<StackWindow>) {
        let mut r = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        for w in windows.into_iter().rev() {
            r.windows.push_front(w);
        }
        r.bound();
    }

    /// Windows dropped because no batch took them in time.
    pub fn dropped_windows(&self) -> u64 {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).dropped
    }
}

impl Drop for StackWorker {
    fn drop(&mut self) {
        // Closing the channel ends the worker's loop.
        let (tx, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(mut feed: impl Feed, rx: &mpsc::Receiver<Msg>, ready: &Mutex<Ready>) {
    let mut last_poll = Instant::now();
    loop {
        let wait = POLL.saturating_sub(last_poll.elapsed());
        match rx.recv_timeout(wait) {
            Ok(m) => apply(&mut feed, m, ready),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_poll.elapsed() >= POLL {
            feed.poll();
            last_poll = Instant::now();
        }
    }
}

fn apply(feed: &mut impl Feed, m: Msg, ready: &Mutex<Ready>) {
    match m {
        Msg::Sync(ranks) => feed.sync(ranks),
        Msg::OpenLaunch(ranks, dur) => feed.open_launch_window(&ranks, dur),
        Msg::CloseLaunch => feed.close_launch_window(),
        Msg::TrainingThreads(t) => feed.training_threads(&t),
        Msg::Collectives(c) => feed.collectives(&c),
        Msg::Cut { now_ns, last } => {
            // What the drain thread queued since the last poll belongs in
            // this window.
            feed.poll();
            feed.cut_window(now_ns, last);
            let windows = feed.take();
            let mut r = ready.lock().unwrap_or_else(|p| p.into_inner());
            r.windows.extend(windows);
            r.bound();
        }
        Msg::Barrier(done) => {
            let _ = done.send(());
        }
        Msg::Counters(reply) => {
            let _ = reply.send(feed.counters());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slowrank_shared::wire::StackView;

    /// A feed whose first poll blocks until the test lets it go, as a
    /// first symbolization of a big process holds the thread for seconds.
    struct Slow {
        gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
        ranks: Vec<(u32, u32)>,
        cuts: Vec<StackWindow>,
    }

    impl Slow {
        fn new(
            gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
            ranks: Vec<(u32, u32)>,
        ) -> Self {
            Self {
                gate,
                ranks,
                cuts: Vec::new(),
            }
        }
    }

    impl Feed for Slow {
        fn sync(&mut self, ranks: Vec<(u32, u32)>) {
            self.ranks = ranks;
        }
        fn open_launch_window(&mut self, _: &[u32], _: Duration) {}
        fn close_launch_window(&mut self) {}
        fn training_threads(&mut self, _: &[(u32, u32)]) {}
        fn collectives(&mut self, _: &[CollectiveRecord]) {}
        fn poll(&mut self) {
            if let Some((entered, release)) = self.gate.take() {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
        }
        fn cut_window(&mut self, now_ns: u64, _: bool) {
            // One window per rank known at the cut, ending at the cut.
            for &(_, rank) in &self.ranks {
                self.cuts.push(StackWindow {
                    rank,
                    view: StackView::Cpu,
                    start_ns: 0,
                    end_ns: now_ns,
                    strings: Vec::new(),
                    stacks: Vec::new(),
                    records: 0,
                    truncated: 0,
                    overflow_weight: 0,
                });
            }
        }
        fn take(&mut self) -> Vec<StackWindow> {
            std::mem::take(&mut self.cuts)
        }
        fn counters(&self) -> Result<StackCounters, CollectorError> {
            Ok(StackCounters::default())
        }
    }

    #[test]
    fn a_stuck_symbolization_does_not_hold_up_the_loop_and_the_last_window_still_arrives() {
        let (entered_tx, entered) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let w =
            StackWorker::start(move || Ok(Slow::new(Some((entered_tx, release_rx)), Vec::new())))
                .unwrap();
        // The worker is inside its poll and stays there.
        entered.recv().unwrap();
        for i in 0..100 {
            w.sync([(100, 3), (101, 4)].into_iter());
            w.cut_window(i, false);
        }
        w.cut_window(1000, true);
        // Every call above returned while the worker was stuck; nothing is
        // cut yet, and a barrier is not reached.
        assert!(w.take().is_empty());
        assert!(!w.settle(Duration::from_millis(50)));
        release.send(()).unwrap();
        assert!(w.settle(Duration::from_secs(60)));
        let windows = w.take();
        // In order, each with the ranks of the sync before it.
        assert_eq!(windows.len(), 202);
        assert_eq!(windows.last().unwrap().end_ns, 1000);
        assert!(windows.windows(2).all(|p| p[0].end_ns <= p[1].end_ns));
        assert_eq!(
            w.counters(Duration::from_secs(60)).unwrap().unwrap(),
            StackCounters::default()
        );
    }

    #[test]
    fn windows_no_batch_took_are_bounded_and_counted() {
        let w = StackWorker::start(|| Ok(Slow::new(None, vec![(1, 0)]))).unwrap();
        for i in 0..(MAX_READY as u64 + 10) {
            w.cut_window(i, false);
        }
        assert!(w.settle(Duration::from_secs(60)));
        let got = w.take();
        assert_eq!(got.len(), MAX_READY);
        assert_eq!(got[0].end_ns, 10, "the oldest are dropped");
        assert_eq!(w.dropped_windows(), 10);
        // A batch that could not go gives them back, still bounded.
        w.put_back(got);
        assert_eq!(w.take().len(), MAX_READY);
    }

    #[test]
    fn a_feed_that_cannot_start_is_an_error_not_a_thread_left_behind() {
        let e = StackWorker::start(|| -> Result<Slow, CollectorError> {
            Err(CollectorError::from(crate::stacks::StackError::MissingMap(
                "STACKS",
            )))
        });
        assert!(matches!(e, Err(StackWorkerError::Start(_))));
    }
}
