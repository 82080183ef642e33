//! CUDA events: a record is a stream op; waiting means "until the op that
//! the latest record enqueued has run".

use std::sync::{Condvar, Mutex};

#[derive(Default)]
struct State {
    /// Generation of the latest `cudaEventRecord` call.
    recorded: u64,
    /// Highest generation a stream has executed.
    completed: u64,
    /// Monotonic ns when `completed` was reached.
    time_ns: u64,
}

#[derive(Default)]
pub struct Event {
    st: Mutex<State>,
    cv: Condvar,
}

impl Event {
    /// A new record call: returns the generation its stream op completes.
    pub fn next_generation(&self) -> u64 {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.recorded += 1;
        st.recorded
    }

    pub fn latest_generation(&self) -> u64 {
        self.st.lock().unwrap_or_else(|p| p.into_inner()).recorded
    }

    /// Called by a stream executor when it reaches the record op.
    pub fn complete(&self, gen: u64, now_ns: u64) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if gen > st.completed {
            st.completed = gen;
            st.time_ns = now_ns;
        }
        self.cv.notify_all();
    }

    pub fn wait(&self, gen: u64) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        while st.completed < gen {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn is_done(&self) -> bool {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.completed >= st.recorded
    }

    /// Completion time, `None` if never completed.
    pub fn time_ns(&self) -> Option<u64> {
        let st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        (st.completed > 0).then_some(st.time_ns)
    }
}
