//! Stand-in `libcudart.so.12`: the CUDA runtime calls a training job makes,
//! with their real C signatures, over a simulated GPU.
//!
//! Every stream has an executor thread that runs its work in order: kernels
//! sleep for their modelled duration (times the rank's compute-fault factor),
//! copies for bytes over PCIe bandwidth, host functions (how the NCCL
//! stand-in runs collectives) on the executor itself. Launch calls return at
//! once, as on real hardware; synchronize calls block until the work drains.
//!
//! Exported names are assembler aliases of Rust functions (see `api.rs`) so
//! that the version script can give them the `libcudart.so.12` version.

mod api;
mod event;
mod graph;
mod memory;
mod registry;
mod stream;
