//! Streams and their executor threads: the simulated GPU.

use std::{
    collections::VecDeque,
    ffi::c_void,
    sync::{Arc, Condvar, Mutex, OnceLock},
};

use slowrank_sim::{abi::cuda::HostFn, clock, control::Control, model::Model};

use crate::{event::Event, graph::Graph, registry::Registry};

/// One unit of stream work.
#[derive(Clone)]
pub enum Op {
    /// A kernel of `ns` nanoseconds at nominal GPU speed.
    Kernel {
        ns: u64,
    },
    /// A copy taking `ns` nanoseconds (DMA, not slowed by compute faults).
    Copy {
        ns: u64,
    },
    /// `cudaLaunchHostFunc`: runs on the executor, blocking the stream.
    Host {
        f: HostFn,
        data: usize,
    },
    Record {
        ev: Arc<Event>,
        gen: u64,
    },
    Wait {
        ev: Arc<Event>,
        gen: u64,
    },
    Graph(Arc<Graph>),
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    /// An op is running on the executor.
    busy: bool,
    /// When set, ops are recorded into a graph instead of run.
    capture: Option<Vec<Op>>,
}

pub struct Stream {
    q: Mutex<Queue>,
    cv: Condvar,
}

/// All streams of this process.
pub fn streams() -> &'static Registry<Stream> {
    static S: OnceLock<Registry<Stream>> = OnceLock::new();
    S.get_or_init(Registry::new)
}

/// The legacy default stream (`cudaStream_t` 0).
pub fn default_stream() -> Arc<Stream> {
    static D: OnceLock<Arc<Stream>> = OnceLock::new();
    D.get_or_init(|| {
        let s = Stream::spawn();
        streams().insert(s.clone());
        s
    })
    .clone()
}

/// Resolves a `cudaStream_t`; `None` for an unknown handle.
pub fn resolve(h: *mut c_void) -> Option<Arc<Stream>> {
    if h.is_null() {
        Some(default_stream())
    } else {
        streams().get(h)
    }
}

pub fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(Model::from_env)
}

impl Stream {
    /// A new stream with its executor thread.
    pub fn spawn() -> Arc<Stream> {
        let s = Arc::new(Stream {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
        });
        let exec = s.clone();
        std::thread::Builder::new()
            .name("gpu-stream".into())
            .stack_size(512 * 1024)
            .spawn(move || exec.run())
            .expect("cannot spawn a stream executor thread");
        s
    }

    /// Enqueues `op`, or records it when the stream is capturing.
    pub fn push(&self, op: Op) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cap) = q.capture.as_mut() {
            cap.push(op);
            return;
        }
        q.ops.push_back(op);
        self.cv.notify_all();
    }

    pub fn begin_capture(&self) -> bool {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        if q.capture.is_some() {
            return false;
        }
        q.capture = Some(Vec::new());
        true
    }

    pub fn end_capture(&self) -> Option<Vec<Op>> {
        self.q
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capture
            .take()
    }

    /// Blocks until every op enqueued so far has run.
    pub fn synchronize(&self) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        while !q.ops.is_empty() || q.busy {
            q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn is_idle(&self) -> bool {
        let q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.ops.is_empty() && !q.busy
    }

    fn run(&self) {
        clock::precise_sleeps();
        let ctl = Control::current();
        // Nominal end of the previous op: back-to-back kernels are timed from
        // it, so oversleeping one kernel shortens the wait for the next and
        // the GPU keeps its modelled throughput on a loaded machine.
        let mut gpu_ns = clock::mono_ns();
        loop {
            let (op, was_idle) = {
                let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
                q.busy = false;
                let mut idle = false;
                while q.ops.is_empty() {
                    idle = true;
                    self.cv.notify_all();
                    q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                q.busy = true;
                (q.ops.pop_front().expect("not empty"), idle)
            };
            // An op that was waiting in the queue starts when the previous
            // one nominally ended; one that found the GPU idle starts now.
            if was_idle {
                gpu_ns = gpu_ns.max(clock::mono_ns());
            }
            if let Op::Kernel { ns } = op {
                gpu_ns += (ns as f64 * ctl.compute_factor().max(0.0)) as u64;
                // A kernel followed by another already queued needs no wakeup
                // of its own: the time is accounted for in `gpu_ns`, and
                // anything observable (events, host functions, the stream
                // going idle) waits for it. Saves most sleeps on 2 cores.
                if !self.next_is_kernel() {
                    clock::sleep_until(gpu_ns);
                }
                continue;
            }
            self.execute(op, ctl, &mut gpu_ns);
        }
    }

    fn next_is_kernel(&self) -> bool {
        let q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        matches!(q.ops.front(), Some(Op::Kernel { .. }))
    }

    fn execute(&self, op: Op, ctl: &Control, gpu_ns: &mut u64) {
        match op {
            Op::Kernel { ns } => {
                *gpu_ns += (ns as f64 * ctl.compute_factor().max(0.0)) as u64;
                clock::sleep_until(*gpu_ns);
            }
            Op::Copy { ns } => {
                *gpu_ns += ns;
                clock::sleep_until(*gpu_ns);
            }
            Op::Host { f, data } => {
                // A collective cannot start before the GPU got there.
                clock::sleep_until(*gpu_ns);
                // SAFETY: the caller of cudaLaunchHostFunc vouches for f/data.
                unsafe { f(data as *mut c_void) };
                *gpu_ns = clock::mono_ns();
            }
            Op::Record { ev, gen } => {
                // Others waiting on this event must not see it early.
                clock::sleep_until(*gpu_ns);
                ev.complete(gen, *gpu_ns);
            }
            Op::Wait { ev, gen } => {
                ev.wait(gen);
                *gpu_ns = (*gpu_ns).max(clock::mono_ns());
            }
            Op::Graph(g) => {
                for op in g.ops.iter().cloned() {
                    self.execute(op, ctl, gpu_ns);
                }
            }
        }
    }
}
