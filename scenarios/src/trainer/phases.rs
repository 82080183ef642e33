//! One training iteration, phase by phase, the way a PyTorch job drives the
//! GPU. Each phase is its own non-inlined function so CPU flame graphs tell
//! them apart.

use std::{ffi::c_void, time::Duration};

use slowrank_sim::clock;

use super::{cuda::Event, Trainer, TrainerError};

// Host-side stubs of the "kernels": their addresses are what
// `cudaLaunchKernel` receives, as with real `__global__` functions.
#[inline(never)]
pub extern "C" fn embedding_forward_kernel() {}
#[inline(never)]
pub extern "C" fn gemm_forward_kernel() {}
#[inline(never)]
pub extern "C" fn gemm_backward_kernel() {}
#[inline(never)]
pub extern "C" fn adam_update_kernel() {}

fn kernel(f: extern "C" fn()) -> *const c_void {
    f as *const c_void
}

impl Trainer {
    /// Host time of `function`, stretched by host faults. Sleeps like a
    /// thread waiting on I/O or the GIL, or burns the CPU when the rank is
    /// under CPU contention so that contention really slows it.
    fn host_work(&mut self, function: &str, base_us: f64) {
        let e = self.injector.host_effect(function);
        let us = base_us * self.rng.jitter(self.spec.step.jitter) * e.factor;
        let d = Duration::from_secs_f64(us.max(0.0) / 1e6) + e.delay;
        if e.spin {
            let until = clock::mono_ns() + d.as_nanos() as u64;
            while clock::mono_ns() < until {
                std::hint::spin_loop();
            }
        } else if !d.is_zero() {
            std::thread::sleep(d);
        }
    }

    fn kernel_ns(&mut self) -> u64 {
        (self.spec.step.kernel_us * 1e3 * self.rng.jitter(self.spec.step.jitter)) as u64
    }

    fn launch_kernels(&mut self, f: extern "C" fn(), n: u32) -> Result<(), TrainerError> {
        for _ in 0..n {
            let ns = self.kernel_ns();
            self.cuda.launch(kernel(f), ns, self.compute)?;
        }
        Ok(())
    }

    /// Data loader: host-side batch preparation, then the H2D copy.
    #[inline(never)]
    pub fn load_batch(&mut self) -> Result<(), TrainerError> {
        self.host_work("load_batch", self.spec.step.data_loader_us);
        self.cuda.upload(self.batch, &self.host_batch, self.compute)
    }

    /// Tensor-parallel all-reduce of a layer's activations (synchronous for
    /// the compute stream, like Megatron's row-parallel linear).
    #[inline(never)]
    fn tp_all_reduce(&mut self) -> Result<(), TrainerError> {
        let Some(tp) = &self.groups.tp else {
            return Ok(());
        };
        let (comm, stream) = (tp.comm, tp.stream);
        self.cuda.stream_waits_for(stream, self.compute)?;
        self.nccl
            .all_reduce(self.act, self.spec.step.activation_bytes, comm, stream)?;
        self.cuda.stream_waits_for(self.compute, stream)
    }

    /// Pipeline receive from stage `stage - 1` (forward) or `stage + 1`
    /// (backward) before the compute that needs it.
    #[inline(never)]
    fn pp_recv(&mut self, from_stage: u32) -> Result<(), TrainerError> {
        let Some(pp) = &self.groups.pp else {
            return Ok(());
        };
        let (comm, stream) = (pp.comm, pp.stream);
        self.cuda.stream_waits_for(stream, self.compute)?;
        self.nccl.group_start()?;
        self.nccl.recv(
            self.act,
            self.spec.step.activation_bytes,
            from_stage,
            comm,
            stream,
        )?;
        self.nccl.group_end()?;
        self.cuda.stream_waits_for(self.compute, stream)
    }

    /// Pipeline send to another stage once the compute producing it is done.
    #[inline(never)]
    fn pp_send(&mut self, to_stage: u32) -> Result<(), TrainerError> {
        let Some(pp) = &self.groups.pp else {
            return Ok(());
        };
        let (comm, stream) = (pp.comm, pp.stream);
        self.cuda.stream_waits_for(stream, self.compute)?;
        self.nccl.group_start()?;
        self.nccl.send(
            self.act,
            self.spec.step.activation_bytes,
            to_stage,
            comm,
            stream,
        )?;
        self.nccl.group_end()
    }

    /// Data-parallel all-reduce of one gradient bucket, asynchronous: it
    /// overlaps the rest of backward; the optimizer waits for it.
    #[inline(never)]
    fn dp_bucket_all_reduce(&mut self, bucket: u32) -> Result<Option<Event>, TrainerError> {
        let Some(dp) = &self.groups.dp else {
            return Ok(None);
        };
        let (comm, stream) = (dp.comm, dp.stream);
        let bytes = self.spec.step.bucket_bytes;
        self.cuda.stream_waits_for(stream, self.compute)?;
        // SAFETY: offset inside the gradient allocation (never dereferenced).
        let buf = unsafe {
            self.grads
                .cast::<u8>()
                .add((bucket as u64 * bytes) as usize)
        }
        .cast();
        self.nccl.all_reduce(buf, bytes, comm, stream)?;
        Ok(Some(self.cuda.record(stream)?))
    }

    fn stage(&self) -> (u32, u32) {
        match &self.groups.pp {
            Some(pp) => (pp.index, pp.members.len() as u32),
            None => (0, 1),
        }
    }

    /// Forward pass of every microbatch (GPipe order).
    #[inline(never)]
    pub fn forward(&mut self) -> Result<(), TrainerError> {
        let s = self.spec.step.clone();
        let (stage, stages) = self.stage();
        let per_layer = (s.forward_kernels / (s.microbatches * s.layers)).max(1);
        for _mb in 0..s.microbatches {
            if stage > 0 {
                self.pp_recv(stage - 1)?;
            } else {
                self.launch_kernels(embedding_forward_kernel, 1)?;
            }
            for _layer in 0..s.layers {
                self.host_work("forward", s.host_us_per_layer);
                self.launch_kernels(gemm_forward_kernel, per_layer)?;
                self.tp_all_reduce()?;
            }
            if stage + 1 < stages {
                self.pp_send(stage + 1)?;
            }
        }
        Ok(())
    }

    /// Backward pass, microbatches in reverse; during the last one the
    /// gradient buckets are all-reduced as soon as they are ready.
    #[inline(never)]
    pub fn backward(&mut self) -> Result<(), TrainerError> {
        let s = self.spec.step.clone();
        let (stage, stages) = self.stage();
        let per_layer = (s.backward_kernels / (s.microbatches * s.layers)).max(1);
        let last_total = per_layer * s.layers;
        for mb in (0..s.microbatches).rev() {
            let last = mb == 0;
            if stage + 1 < stages {
                self.pp_recv(stage + 1)?;
            }
            let mut launched = 0u32;
            let mut issued = 0u32;
            for _layer in 0..s.layers {
                self.host_work("backward", s.host_us_per_layer);
                for _ in 0..per_layer {
                    self.launch_kernels(gemm_backward_kernel, 1)?;
                    launched += 1;
                    while last
                        && issued < s.grad_buckets
                        && launched * s.grad_buckets >= (issued + 1) * last_total
                    {
                        if let Some(ev) = self.dp_bucket_all_reduce(issued)? {
                            self.dp_pending.push(ev);
                        }
                        issued += 1;
                    }
                }
                self.tp_all_reduce()?;
            }
            if stage > 0 {
                self.pp_send(stage - 1)?;
            }
        }
        Ok(())
    }

    /// The optimizer may only run once every gradient bucket is reduced.
    #[inline(never)]
    pub fn wait_gradients(&mut self) -> Result<(), TrainerError> {
        for ev in std::mem::take(&mut self.dp_pending) {
            self.cuda.wait_event(self.compute, ev)?;
            self.cuda.destroy(ev)?;
        }
        Ok(())
    }

    /// Optimizer step: kernel launches, or one CUDA-graph replay.
    #[inline(never)]
    pub fn optimizer_step(&mut self) -> Result<(), TrainerError> {
        self.host_work("optimizer_step", self.spec.step.host_us_per_layer);
        let n = self.spec.step.optimizer_kernels;
        if self.spec.step.optimizer_graph {
            if self.optimizer_graph.is_none() {
                let ns = self.kernel_ns();
                let (cuda, s) = (&self.cuda, self.compute);
                let exec = cuda.capture(s, || {
                    for _ in 0..n {
                        cuda.launch(kernel(adam_update_kernel), ns, s)?;
                    }
                    Ok(())
                })?;
                self.optimizer_graph = Some(exec);
            }
            let exec = self.optimizer_graph.expect("just captured");
            self.cuda.graph_launch(exec, self.compute)
        } else {
            self.launch_kernels(adam_update_kernel, n)
        }
    }

    /// End of step: wait for the GPU (like `loss.item()`).
    #[inline(never)]
    pub fn synchronize(&mut self) -> Result<(), TrainerError> {
        self.cuda.device_synchronize()
    }
}
