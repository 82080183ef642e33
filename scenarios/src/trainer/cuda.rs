//! The CUDA runtime, loaded by soname through the library path (as
//! PyTorch's wheels load `libcudart.so.12`).

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use libloading::Library;
use slowrank_sim::abi::cuda::{Dim3, MEMCPY_HOST_TO_DEVICE};

use super::TrainerError;

pub type Stream = *mut c_void;
pub type Event = *mut c_void;

type E = c_int;

/// Typed entry points of `libcudart.so.12`.
pub struct Cuda {
    _lib: Library,
    set_device: unsafe extern "C" fn(c_int) -> E,
    stream_create: unsafe extern "C" fn(*mut Stream) -> E,
    stream_wait_event: unsafe extern "C" fn(Stream, Event, c_uint) -> E,
    event_create: unsafe extern "C" fn(*mut Event) -> E,
    event_destroy: unsafe extern "C" fn(Event) -> E,
    event_record: unsafe extern "C" fn(Event, Stream) -> E,
    device_synchronize: unsafe extern "C" fn() -> E,
    launch_kernel:
        unsafe extern "C" fn(*const c_void, Dim3, Dim3, *mut *mut c_void, usize, Stream) -> E,
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> E,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, Stream) -> E,
    begin_capture: unsafe extern "C" fn(Stream, c_int) -> E,
    end_capture: unsafe extern "C" fn(Stream, *mut *mut c_void) -> E,
    graph_instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_ulonglong) -> E,
    graph_launch: unsafe extern "C" fn(*mut c_void, Stream) -> E,
}

fn check(call: &'static str, code: E) -> Result<(), TrainerError> {
    if code == 0 {
        Ok(())
    } else {
        Err(TrainerError::Cuda { call, code })
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the field's type is the symbol's C signature.
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
            TrainerError::Symbol {
                name: $name,
                source,
            }
        })?
    };
}

impl Cuda {
    pub fn load() -> Result<Self, TrainerError> {
        // SAFETY: loading the CUDA runtime runs no unusual initialisers.
        let lib =
            unsafe { Library::new("libcudart.so.12") }.map_err(|source| TrainerError::Load {
                lib: "libcudart.so.12",
                source,
            })?;
        Ok(Self {
            set_device: sym!(lib, "cudaSetDevice"),
            stream_create: sym!(lib, "cudaStreamCreate"),
            stream_wait_event: sym!(lib, "cudaStreamWaitEvent"),
            event_create: sym!(lib, "cudaEventCreate"),
            event_destroy: sym!(lib, "cudaEventDestroy"),
            event_record: sym!(lib, "cudaEventRecord"),
            device_synchronize: sym!(lib, "cudaDeviceSynchronize"),
            launch_kernel: sym!(lib, "cudaLaunchKernel"),
            malloc: sym!(lib, "cudaMalloc"),
            memcpy_async: sym!(lib, "cudaMemcpyAsync"),
            begin_capture: sym!(lib, "cudaStreamBeginCapture"),
            end_capture: sym!(lib, "cudaStreamEndCapture"),
            graph_instantiate: sym!(lib, "cudaGraphInstantiate"),
            graph_launch: sym!(lib, "cudaGraphLaunch"),
            _lib: lib,
        })
    }

    pub fn set_device(&self, d: u32) -> Result<(), TrainerError> {
        // SAFETY: plain value argument.
        check("cudaSetDevice", unsafe { (self.set_device)(d as c_int) })
    }

    pub fn stream(&self) -> Result<Stream, TrainerError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("cudaStreamCreate", unsafe { (self.stream_create)(&mut s) })?;
        Ok(s)
    }

    pub fn device_synchronize(&self) -> Result<(), TrainerError> {
        // SAFETY: no arguments.
        check("cudaDeviceSynchronize", unsafe {
            (self.device_synchronize)()
        })
    }

    /// Makes `waiter` wait for everything enqueued on `on` so far (the
    /// record/wait-event pair PyTorch puts around every NCCL call).
    pub fn stream_waits_for(&self, waiter: Stream, on: Stream) -> Result<(), TrainerError> {
        let ev = self.record(on)?;
        // SAFETY: our stream and event; the wait holds the event alive.
        check("cudaStreamWaitEvent", unsafe {
            (self.stream_wait_event)(waiter, ev, 0)
        })?;
        self.destroy(ev)
    }

    /// Records a new event on `s`.
    pub fn record(&self, s: Stream) -> Result<Event, TrainerError> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: valid out pointer, then our event and stream.
        unsafe {
            check("cudaEventCreate", (self.event_create)(&mut ev))?;
            check("cudaEventRecord", (self.event_record)(ev, s))?;
        }
        Ok(ev)
    }

    pub fn wait_event(&self, s: Stream, ev: Event) -> Result<(), TrainerError> {
        // SAFETY: our stream and event.
        check("cudaStreamWaitEvent", unsafe {
            (self.stream_wait_event)(s, ev, 0)
        })
    }

    pub fn destroy(&self, ev: Event) -> Result<(), TrainerError> {
        // SAFETY: an event of ours; pending waits keep their own reference.
        check("cudaEventDestroy", unsafe { (self.event_destroy)(ev) })
    }

    /// Launches `kernel` modelled to take `ns` at nominal speed.
    pub fn launch(&self, kernel: *const c_void, ns: u64, s: Stream) -> Result<(), TrainerError> {
        let mut dur = ns;
        let mut args = [&mut dur as *mut u64 as *mut c_void];
        let grid = Dim3 { x: 108, y: 1, z: 1 };
        let block = Dim3 { x: 256, y: 1, z: 1 };
        // SAFETY: arguments are read during the call (as CUDA copies them).
        check("cudaLaunchKernel", unsafe {
            (self.launch_kernel)(kernel, grid, block, args.as_mut_ptr(), 0, s)
        })
    }

    pub fn malloc(&self, bytes: usize) -> Result<*mut c_void, TrainerError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check("cudaMalloc", unsafe { (self.malloc)(&mut p, bytes) })?;
        Ok(p)
    }

    pub fn upload(&self, dst: *mut c_void, src: &[u8], s: Stream) -> Result<(), TrainerError> {
        // SAFETY: src is valid for its length; dst is a device address.
        check("cudaMemcpyAsync", unsafe {
            (self.memcpy_async)(
                dst,
                src.as_ptr().cast(),
                src.len(),
                MEMCPY_HOST_TO_DEVICE,
                s,
            )
        })
    }

    /// Captures what `body` enqueues on `s` into an instantiated graph.
    pub fn capture(
        &self,
        s: Stream,
        body: impl FnOnce() -> Result<(), TrainerError>,
    ) -> Result<*mut c_void, TrainerError> {
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: our stream; valid out pointers.
        unsafe {
            check("cudaStreamBeginCapture", (self.begin_capture)(s, 0))?;
            body()?;
            check("cudaStreamEndCapture", (self.end_capture)(s, &mut graph))?;
            check(
                "cudaGraphInstantiate",
                (self.graph_instantiate)(&mut exec, graph, 0),
            )?;
        }
        Ok(exec)
    }

    pub fn graph_launch(&self, exec: *mut c_void, s: Stream) -> Result<(), TrainerError> {
        // SAFETY: an instantiated graph of ours.
        check("cudaGraphLaunch", unsafe { (self.graph_launch)(exec, s) })
    }
}
