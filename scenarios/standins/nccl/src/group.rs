//! `ncclGroupStart` / `ncclGroupEnd`: operations issued inside a group are
//! held per thread and launched together at the outermost `GroupEnd`, one
//! task per stream, so a send and a receive between two ranks in the same
//! group cannot deadlock.

use std::{cell::RefCell, ffi::c_void};

use slowrank_sim::abi::nccl::{NcclResult, NCCL_INVALID_USAGE, NCCL_SUCCESS};

use crate::task::{self, Part};

#[derive(Default)]
struct Group {
    depth: u32,
    ops: Vec<(usize, Part)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

pub fn start() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    NCCL_SUCCESS
}

pub fn end() -> NcclResult {
    let ops = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        Some(if g.depth == 0 {
            std::mem::take(&mut g.ops)
        } else {
            Vec::new()
        })
    });
    let Some(ops) = ops else {
        return NCCL_INVALID_USAGE;
    };
    let mut streams: Vec<usize> = ops.iter().map(|o| o.0).collect();
    streams.dedup();
    streams.sort_unstable();
    streams.dedup();
    let mut rc = NCCL_SUCCESS;
    let mut ops = ops;
    for s in streams {
        let (mine, rest): (Vec<_>, Vec<_>) = ops.into_iter().partition(|o| o.0 == s);
        ops = rest;
        let r = task::enqueue(s as *mut c_void, mine.into_iter().map(|o| o.1).collect());
        if r != NCCL_SUCCESS {
            rc = r;
        }
    }
    rc
}

/// Launches `part` now, or holds it until the group ends.
pub fn submit(stream: *mut c_void, part: Part) -> NcclResult {
    let held = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((stream as usize, part));
            None
        } else {
            Some(part)
        }
    });
    match held {
        Some(part) => task::enqueue(stream, vec![part]),
        None => NCCL_SUCCESS,
    }
}
