//! CUDA graphs: ops captured from a stream and replayed as one launch.
//! Replayed kernels do not pass through `cudaLaunchKernel`, as on real GPUs.

use crate::stream::Op;

/// A captured (`cudaGraph_t`) or instantiated (`cudaGraphExec_t`) graph.
pub struct Graph {
    pub ops: Vec<Op>,
}
