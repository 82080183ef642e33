//! The trainer each rank process runs (`slowrank-trainer`): a PyTorch-like
//! job driving the stand-in CUDA runtime and NCCL, loaded by soname through
//! `LD_LIBRARY_PATH`, with per-iteration step times reported to the
//! launcher. Per iteration: `load_batch`, `forward`, `backward` (DP buckets
//! all-reduced while it runs), `wait_gradients`, `optimizer_step`,
//! `synchronize`.

// Private: these wrap raw C handles and are only meaningful inside a rank.
mod cpucap;
mod cuda;
mod groups;
mod inject;
mod nccl;
mod phases;

use std::{ffi::c_void, path::PathBuf};

use slowrank_sim::{clock, env, hub::HubClient, report::Report, rng::Rng};

use crate::spec::{Spec, SpecError, RELEASE_EVERY, RELEASE_FILE};

use self::{cuda::Cuda, groups::Groups, inject::Injector, nccl::Nccl};

#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("{0}")]
    Env(String),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("cannot load {lib} (is LD_LIBRARY_PATH set to the stand-in directory?): {source}")]
    Load {
        lib: &'static str,
        source: libloading::Error,
    },
    #[error("missing symbol {name}: {source}")]
    Symbol {
        name: &'static str,
        source: libloading::Error,
    },
    #[error("{call} failed with cudaError {code}")]
    Cuda { call: &'static str, code: i32 },
    #[error("{call} failed with ncclResult {code}")]
    Nccl { call: &'static str, code: i32 },
    #[error("hub: {0}")]
    Hub(#[from] slowrank_sim::hub::HubError),
}

/// One rank's job: libraries, groups, buffers and the fault injector.
pub struct Trainer {
    cuda: Cuda,
    nccl: Nccl,
    hub: HubClient,
    spec: Spec,
    rank: u32,
    groups: Groups,
    compute: cuda::Stream,
    injector: Injector,
    rng: Rng,
    grads: *mut c_void,
    act: *mut c_void,
    batch: *mut c_void,
    host_batch: Vec<u8>,
    optimizer_graph: Option<*mut c_void>,
    dp_pending: Vec<cuda::Event>,
}

fn var(name: &str) -> Result<u32, TrainerError> {
    env::u32_var(name).ok_or_else(|| {
        TrainerError::Env(format!(
            "{name} is not set (run me through slowrank-scenario)"
        ))
    })
}

impl Trainer {
    /// Sets up from the torchrun environment: libraries, device, groups.
    pub fn from_env() -> Result<Self, TrainerError> {
        let rank = var("RANK")?;
        let world = var("WORLD_SIZE")?;
        let local = var("LOCAL_RANK")?;
        let spec_path = std::env::var_os(env::SPEC)
            .map(PathBuf::from)
            .ok_or_else(|| TrainerError::Env(format!("{} is not set", env::SPEC)))?;
        let spec = Spec::load(&spec_path)?;
        if spec.world_size() != world {
            return Err(TrainerError::Env(format!(
                "WORLD_SIZE={world} but the spec has {} ranks",
                spec.world_size()
            )));
        }
        let layout = spec.layout();
        let mut hub = HubClient::from_env()?;
        hub.report(Report::Hello {
            rank,
            pid: std::process::id(),
            host: layout.host_of(rank),
        })?;
        let cuda = Cuda::load()?;
        let nccl = Nccl::load()?;
        cuda.set_device(local)?;
        let compute = cuda.stream()?;
        let groups = groups::create(&cuda, &nccl, &mut hub, &layout, rank)?;
        let step = &spec.step;
        let grads = cuda.malloc((step.bucket_bytes * u64::from(step.grad_buckets)) as usize)?;
        let act = cuda.malloc(step.activation_bytes as usize)?;
        let batch = cuda.malloc(step.batch_bytes as usize)?;
        Ok(Self {
            injector: Injector::new(&spec, rank),
            rng: Rng::new(slowrank_sim::rng::hash(&[spec.seed, u64::from(rank)])),
            host_batch: vec![0u8; step.batch_bytes as usize],
            cuda,
            nccl,
            hub,
            rank,
            groups,
            compute,
            grads,
            act,
            batch,
            optimizer_graph: None,
            dp_pending: Vec::new(),
            spec,
        })
    }

    /// One iteration; returns (start, end) monotonic ns.
    #[inline(never)]
    pub fn train_step(&mut self, iteration: u64) -> Result<(u64, u64), TrainerError> {
        self.injector.begin_iteration(iteration, &mut self.hub)?;
        let start = clock::mono_ns();
        self.load_batch()?;
        self.forward()?;
        self.backward()?;
        self.wait_gradients()?;
        self.optimizer_step()?;
        self.synchronize()?;
        Ok((start, clock::mono_ns()))
    }

    /// Runs every iteration, reporting step times.
    pub fn train(&mut self) -> Result<(), TrainerError> {
        for it in 0.. {
            if it >= self.spec.iterations && !self.goes_on(it)? {
                break;
            }
            let (start, end) = self.train_step(it)?;
            println!(
                "rank {} iteration {it} step {:.3} ms",
                self.rank,
                (end - start) as f64 / 1e6
            );
            self.hub.report(Report::Step {
                rank: self.rank,
                iteration: it,
                start_ns: start,
                end_ns: end,
                wall_ns: clock::wall_ns(),
            })?;
        }
        // Said in the rank's log too: a test that ended its job by release
        // waits for this line (the launcher itself learns it from the hub).
        println!("rank {} done", self.rank);
        self.hub.report(Report::Done { rank: self.rank })?;
        // `destroy_process_group()` at the end of the script.
        self.cuda.device_synchronize()?;
        self.groups.destroy(&self.nccl)
    }
}

impl Trainer {
    /// Past the spec's iterations, whether a job run with
    /// [`RunSpec::end_on_release`](crate::spec::RunSpec::end_on_release)
    /// goes on at `it`: every [`RELEASE_EVERY`] iterations each rank tells
    /// the others whether it sees the release file, and all of them end
    /// there once any does (each rank's own look could fall on either side
    /// of the file's creation).
    fn goes_on(&mut self, it: u64) -> Result<bool, TrainerError> {
        if !self.spec.run.end_on_release {
            return Ok(false);
        }
        if !it.is_multiple_of(RELEASE_EVERY) {
            return Ok(true);
        }
        let seen = std::env::var_os(env::RUN_DIR)
            .is_some_and(|d| PathBuf::from(d).join("sim").join(RELEASE_FILE).exists());
        let all = self.hub.exchange(
            &format!("end-on-release/{it}"),
            self.spec.world_size(),
            self.rank,
            serde_json::Value::Bool(seen),
        )?;
        Ok(!all.iter().any(|v| v.as_bool() == Some(true)))
    }
}

/// Entry point of the trainer binary.
pub fn main() -> Result<(), TrainerError> {
    clock::precise_sleeps();
    let mut t = Trainer::from_env()?;
    t.train()
}
