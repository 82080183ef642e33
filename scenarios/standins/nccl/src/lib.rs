//! Stand-in `libnccl.so.2`.
//!
//! Like the real library, every call only *enqueues*: a collective becomes a
//! host function on the caller's CUDA stream (through the stand-in
//! libcudart's `cudaLaunchHostFunc`), and runs when the simulated GPU gets
//! there. It then rendezvouses with the other members through the hub,
//! completes when the last member's GPU has arrived plus the modelled
//! transfer time, and — for members with peers on other hosts — drives that
//! traffic through the verbs provider's `post_send`/`poll_cq` from a proxy
//! thread, found through `ctx->ops` exactly as NCCL's IB transport does.

mod api;
mod comm;
mod cuda;
mod group;
mod net;
mod proxy;
mod task;
mod trace;
