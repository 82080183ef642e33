//! The exported CUDA runtime entry points (aliased to their C names in
//! `lib.rs`). Signatures follow `cuda_runtime_api.h` (CUDA 12).

use std::{
    ffi::{c_char, c_float, c_int, c_uint, c_ulonglong, c_void},
    sync::{
        atomic::{AtomicI32, Ordering},
        Arc, OnceLock,
    },
};

use slowrank_sim::{
    abi::cuda::{
        CudaError, Dim3, HostFn, LaunchConfig, MemcpyKind, CUDART_VERSION,
        CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_RESOURCE_HANDLE, CUDA_ERROR_INVALID_VALUE,
        CUDA_ERROR_MEMORY_ALLOCATION, CUDA_ERROR_NOT_READY, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        CUDA_SUCCESS, KERNEL_DURATION_ARG, MEMCPY_DEVICE_TO_DEVICE,
    },
    model::Model,
};

use crate::{
    event::Event,
    graph::Graph,
    memory,
    registry::Registry,
    stream::{self, model, Op, Stream},
};

/// Kernel duration when the launch carries none (see KERNEL_DURATION_ARG).
const DEFAULT_KERNEL_NS: u64 = 5_000;
/// Device-to-device copy bandwidth (HBM), GB/s.
const HBM_GBPS: f64 = 1500.0;

fn events() -> &'static Registry<Event> {
    static E: OnceLock<Registry<Event>> = OnceLock::new();
    E.get_or_init(Registry::new)
}

fn graphs() -> &'static Registry<Graph> {
    static G: OnceLock<Registry<Graph>> = OnceLock::new();
    G.get_or_init(Registry::new)
}

static DEVICE: AtomicI32 = AtomicI32::new(0);

fn device_count() -> c_int {
    slowrank_sim::env::u32_var("LOCAL_WORLD_SIZE").map_or(8, |n| n.max(1) as c_int)
}

/// Duration carried by a launch's first kernel argument.
unsafe fn kernel_ns(args: *mut *mut c_void) -> u64 {
    if args.is_null() {
        return DEFAULT_KERNEL_NS;
    }
    // SAFETY: the caller passes a valid argument array per the convention.
    let first = unsafe { *args.add(KERNEL_DURATION_ARG) };
    if first.is_null() {
        DEFAULT_KERNEL_NS
    } else {
        // SAFETY: as above; the argument points to a u64.
        unsafe { *(first as *const u64) }
    }
}

fn enqueue(stream: *mut c_void, op: Op) -> CudaError {
    match stream::resolve(stream) {
        Some(s) => {
            s.push(op);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim,
/// void** args, size_t sharedMem, cudaStream_t stream)`.
pub unsafe extern "C" fn launch_kernel(
    func: *const c_void,
    _grid: Dim3,
    _block: Dim3,
    args: *mut *mut c_void,
    _shared_mem: usize,
    stream: *mut c_void,
) -> CudaError {
    if func.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: forwarded caller contract.
    let ns = unsafe { kernel_ns(args) };
    enqueue(stream, Op::Kernel { ns })
}

/// `cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args)`.
pub unsafe extern "C" fn launch_kernel_ex_c(
    config: *const LaunchConfig,
    func: *const c_void,
    args: *mut *mut c_void,
) -> CudaError {
    if config.is_null() || func.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null config from the caller.
    let stream = unsafe { (*config).stream };
    // SAFETY: forwarded caller contract.
    let ns = unsafe { kernel_ns(args) };
    enqueue(stream, Op::Kernel { ns })
}

/// `cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData)`.
pub unsafe extern "C" fn launch_host_func(
    stream: *mut c_void,
    f: Option<HostFn>,
    data: *mut c_void,
) -> CudaError {
    match f {
        Some(f) => enqueue(
            stream,
            Op::Host {
                f,
                data: data as usize,
            },
        ),
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

/// `cudaStreamCreate(cudaStream_t* pStream)`.
pub unsafe extern "C" fn stream_create(out: *mut *mut c_void) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = stream::streams().insert(Stream::spawn());
    // SAFETY: non-null out pointer from the caller.
    unsafe { *out = h };
    CUDA_SUCCESS
}

/// `cudaStreamCreateWithFlags(cudaStream_t*, unsigned int flags)`.
pub unsafe extern "C" fn stream_create_with_flags(
    out: *mut *mut c_void,
    _flags: c_uint,
) -> CudaError {
    // SAFETY: forwarded.
    unsafe { stream_create(out) }
}

/// `cudaStreamCreateWithPriority(cudaStream_t*, unsigned int flags, int priority)`.
pub unsafe extern "C" fn stream_create_with_priority(
    out: *mut *mut c_void,
    _flags: c_uint,
    _priority: c_int,
) -> CudaError {
    // SAFETY: forwarded.
    unsafe { stream_create(out) }
}

/// `cudaStreamDestroy(cudaStream_t)`: pending work still runs (as in CUDA);
/// the executor thread stays parked afterwards.
pub unsafe extern "C" fn stream_destroy(s: *mut c_void) -> CudaError {
    match stream::streams().remove(s) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaStreamSynchronize(cudaStream_t)`.
pub unsafe extern "C" fn stream_synchronize(s: *mut c_void) -> CudaError {
    match stream::resolve(s) {
        Some(s) => {
            s.synchronize();
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaStreamQuery(cudaStream_t)`.
pub unsafe extern "C" fn stream_query(s: *mut c_void) -> CudaError {
    match stream::resolve(s) {
        Some(s) if s.is_idle() => CUDA_SUCCESS,
        Some(_) => CUDA_ERROR_NOT_READY,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int flags)`.
pub unsafe extern "C" fn stream_wait_event(
    s: *mut c_void,
    ev: *mut c_void,
    _flags: c_uint,
) -> CudaError {
    let Some(ev) = events().get(ev) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    let gen = ev.latest_generation();
    enqueue(s, Op::Wait { ev, gen })
}

/// `cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode)`.
pub unsafe extern "C" fn stream_begin_capture(s: *mut c_void, _mode: c_int) -> CudaError {
    match stream::resolve(s) {
        Some(st) if !s.is_null() && st.begin_capture() => CUDA_SUCCESS,
        Some(_) => CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaStreamEndCapture(cudaStream_t, cudaGraph_t* pGraph)`.
pub unsafe extern "C" fn stream_end_capture(s: *mut c_void, out: *mut *mut c_void) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(st) = stream::resolve(s) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    match st.end_capture() {
        Some(ops) => {
            // SAFETY: non-null out pointer.
            unsafe { *out = graphs().insert(Arc::new(Graph { ops })) };
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    }
}

/// `cudaEventCreate(cudaEvent_t*)`.
pub unsafe extern "C" fn event_create(out: *mut *mut c_void) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = events().insert(Arc::new(Event::default())) };
    CUDA_SUCCESS
}

/// `cudaEventCreateWithFlags(cudaEvent_t*, unsigned int flags)`.
pub unsafe extern "C" fn event_create_with_flags(
    out: *mut *mut c_void,
    _flags: c_uint,
) -> CudaError {
    // SAFETY: forwarded.
    unsafe { event_create(out) }
}

/// `cudaEventDestroy(cudaEvent_t)`.
pub unsafe extern "C" fn event_destroy(ev: *mut c_void) -> CudaError {
    match events().remove(ev) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaEventRecord(cudaEvent_t, cudaStream_t)`.
pub unsafe extern "C" fn event_record(ev: *mut c_void, s: *mut c_void) -> CudaError {
    let Some(ev) = events().get(ev) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    let gen = ev.next_generation();
    enqueue(s, Op::Record { ev, gen })
}

/// `cudaEventSynchronize(cudaEvent_t)`.
pub unsafe extern "C" fn event_synchronize(ev: *mut c_void) -> CudaError {
    let Some(ev) = events().get(ev) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    ev.wait(ev.latest_generation());
    CUDA_SUCCESS
}

/// `cudaEventQuery(cudaEvent_t)`.
pub unsafe extern "C" fn event_query(ev: *mut c_void) -> CudaError {
    match events().get(ev) {
        Some(ev) if ev.is_done() => CUDA_SUCCESS,
        Some(_) => CUDA_ERROR_NOT_READY,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end)`.
pub unsafe extern "C" fn event_elapsed_time(
    ms: *mut c_float,
    start: *mut c_void,
    end: *mut c_void,
) -> CudaError {
    let (Some(a), Some(b)) = (events().get(start), events().get(end)) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    if ms.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match (a.time_ns(), b.time_ns()) {
        (Some(a), Some(b)) => {
            // SAFETY: non-null out pointer.
            unsafe { *ms = (b as f64 - a as f64) as f32 / 1e6 };
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_NOT_READY,
    }
}

/// `cudaDeviceSynchronize(void)`.
pub unsafe extern "C" fn device_synchronize() -> CudaError {
    stream::default_stream().synchronize();
    for s in stream::streams().all() {
        s.synchronize();
    }
    CUDA_SUCCESS
}

/// `cudaSetDevice(int)`.
pub unsafe extern "C" fn set_device(dev: c_int) -> CudaError {
    if dev < 0 || dev >= device_count() {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    DEVICE.store(dev, Ordering::Relaxed);
    CUDA_SUCCESS
}

/// `cudaGetDevice(int*)`.
pub unsafe extern "C" fn get_device(out: *mut c_int) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = DEVICE.load(Ordering::Relaxed) };
    CUDA_SUCCESS
}

/// `cudaGetDeviceCount(int*)`: one GPU per local rank.
pub unsafe extern "C" fn get_device_count(out: *mut c_int) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = device_count() };
    CUDA_SUCCESS
}

/// `cudaGetLastError(void)` / `cudaPeekAtLastError(void)`: errors are
/// returned directly, never left sticky.
pub unsafe extern "C" fn get_last_error() -> CudaError {
    CUDA_SUCCESS
}

fn error_name(e: CudaError) -> &'static [u8] {
    match e {
        CUDA_SUCCESS => b"cudaSuccess\0",
        CUDA_ERROR_INVALID_VALUE => b"cudaErrorInvalidValue\0",
        CUDA_ERROR_MEMORY_ALLOCATION => b"cudaErrorMemoryAllocation\0",
        CUDA_ERROR_INVALID_DEVICE => b"cudaErrorInvalidDevice\0",
        CUDA_ERROR_INVALID_RESOURCE_HANDLE => b"cudaErrorInvalidResourceHandle\0",
        CUDA_ERROR_NOT_READY => b"cudaErrorNotReady\0",
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => b"cudaErrorStreamCaptureUnsupported\0",
        _ => b"cudaErrorUnknown\0",
    }
}

/// `cudaGetErrorName(cudaError_t)`.
pub unsafe extern "C" fn get_error_name(e: CudaError) -> *const c_char {
    error_name(e).as_ptr().cast()
}

/// `cudaGetErrorString(cudaError_t)`.
pub unsafe extern "C" fn get_error_string(e: CudaError) -> *const c_char {
    let s: &'static [u8] = match e {
        CUDA_SUCCESS => b"no error\0",
        CUDA_ERROR_INVALID_VALUE => b"invalid argument\0",
        CUDA_ERROR_MEMORY_ALLOCATION => b"out of memory\0",
        CUDA_ERROR_INVALID_DEVICE => b"invalid device ordinal\0",
        CUDA_ERROR_INVALID_RESOURCE_HANDLE => b"invalid resource handle\0",
        CUDA_ERROR_NOT_READY => b"device not ready\0",
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            b"operation not permitted when stream is capturing\0"
        }
        _ => b"unknown error\0",
    };
    s.as_ptr().cast()
}

/// `cudaRuntimeGetVersion(int*)` / `cudaDriverGetVersion(int*)`.
pub unsafe extern "C" fn runtime_get_version(out: *mut c_int) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = CUDART_VERSION };
    CUDA_SUCCESS
}

/// `cudaMalloc(void** devPtr, size_t size)`.
pub unsafe extern "C" fn malloc(out: *mut *mut c_void, size: usize) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: non-null out pointer.
    unsafe { *out = memory::alloc(size) as *mut c_void };
    CUDA_SUCCESS
}

/// `cudaFree(void*)`.
pub unsafe extern "C" fn free(_ptr: *mut c_void) -> CudaError {
    CUDA_SUCCESS
}

fn copy_ns(count: usize, kind: MemcpyKind) -> u64 {
    let gbps = if kind == MEMCPY_DEVICE_TO_DEVICE {
        HBM_GBPS
    } else {
        model().pcie_gbps
    };
    Model::wire_ns(count as u64, gbps) as u64
}

/// `cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind)`.
pub unsafe extern "C" fn memcpy(
    _dst: *mut c_void,
    _src: *const c_void,
    count: usize,
    kind: MemcpyKind,
) -> CudaError {
    let s = stream::default_stream();
    s.push(Op::Copy {
        ns: copy_ns(count, kind),
    });
    s.synchronize();
    CUDA_SUCCESS
}

/// `cudaMemcpyAsync(void* dst, const void* src, size_t count,
/// cudaMemcpyKind kind, cudaStream_t stream)`.
pub unsafe extern "C" fn memcpy_async(
    _dst: *mut c_void,
    _src: *const c_void,
    count: usize,
    kind: MemcpyKind,
    s: *mut c_void,
) -> CudaError {
    enqueue(
        s,
        Op::Copy {
            ns: copy_ns(count, kind),
        },
    )
}

/// `cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream)`.
pub unsafe extern "C" fn memset_async(
    _ptr: *mut c_void,
    _value: c_int,
    count: usize,
    s: *mut c_void,
) -> CudaError {
    enqueue(
        s,
        Op::Copy {
            ns: copy_ns(count, MEMCPY_DEVICE_TO_DEVICE),
        },
    )
}

/// `cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
/// unsigned long long flags)`.
pub unsafe extern "C" fn graph_instantiate(
    out: *mut *mut c_void,
    graph: *mut c_void,
    _flags: c_ulonglong,
) -> CudaError {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some(g) = graphs().get(graph) else {
        return CUDA_ERROR_INVALID_RESOURCE_HANDLE;
    };
    let exec = Arc::new(Graph { ops: g.ops.clone() });
    // SAFETY: non-null out pointer.
    unsafe { *out = graphs().insert(exec) };
    CUDA_SUCCESS
}

/// `cudaGraphLaunch(cudaGraphExec_t, cudaStream_t)`.
pub unsafe extern "C" fn graph_launch(exec: *mut c_void, s: *mut c_void) -> CudaError {
    match graphs().get(exec) {
        Some(g) => enqueue(s, Op::Graph(g)),
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaGraphDestroy(cudaGraph_t)`.
pub unsafe extern "C" fn graph_destroy(g: *mut c_void) -> CudaError {
    match graphs().remove(g) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    }
}

/// `cudaGraphExecDestroy(cudaGraphExec_t)`.
pub unsafe extern "C" fn graph_exec_destroy(g: *mut c_void) -> CudaError {
    // SAFETY: forwarded.
    unsafe { graph_destroy(g) }
}

// `.set` only resolves within one object file, so the aliases must live in
// the module (codegen unit) that defines the functions.
/// Exports `$f` as the versioned C symbol `$name`.
macro_rules! export {
    ($($name:literal => $f:path),* $(,)?) => {
        $(core::arch::global_asm!(
            concat!(".globl ", $name),
            concat!(".type ", $name, ", @function"),
            concat!(".set ", $name, ", {f}"),
            f = sym $f,
        );)*
    };
}

export! {
    "cudaLaunchKernel" => launch_kernel,
    "cudaLaunchKernelExC" => launch_kernel_ex_c,
    "cudaLaunchHostFunc" => launch_host_func,
    "cudaStreamCreate" => stream_create,
    "cudaStreamCreateWithFlags" => stream_create_with_flags,
    "cudaStreamCreateWithPriority" => stream_create_with_priority,
    "cudaStreamDestroy" => stream_destroy,
    "cudaStreamSynchronize" => stream_synchronize,
    "cudaStreamQuery" => stream_query,
    "cudaStreamWaitEvent" => stream_wait_event,
    "cudaStreamBeginCapture" => stream_begin_capture,
    "cudaStreamEndCapture" => stream_end_capture,
    "cudaEventCreate" => event_create,
    "cudaEventCreateWithFlags" => event_create_with_flags,
    "cudaEventDestroy" => event_destroy,
    "cudaEventRecord" => event_record,
    "cudaEventSynchronize" => event_synchronize,
    "cudaEventQuery" => event_query,
    "cudaEventElapsedTime" => event_elapsed_time,
    "cudaDeviceSynchronize" => device_synchronize,
    "cudaSetDevice" => set_device,
    "cudaGetDevice" => get_device,
    "cudaGetDeviceCount" => get_device_count,
    "cudaGetLastError" => get_last_error,
    "cudaPeekAtLastError" => get_last_error,
    "cudaGetErrorString" => get_error_string,
    "cudaGetErrorName" => get_error_name,
    "cudaRuntimeGetVersion" => runtime_get_version,
    "cudaDriverGetVersion" => runtime_get_version,
    "cudaMalloc" => malloc,
    "cudaFree" => free,
    "cudaMemcpy" => memcpy,
    "cudaMemcpyAsync" => memcpy_async,
    "cudaMemsetAsync" => memset_async,
    "cudaGraphInstantiate" => graph_instantiate,
    "cudaGraphLaunch" => graph_launch,
    "cudaGraphDestroy" => graph_destroy,
    "cudaGraphExecDestroy" => graph_exec_destroy,
}
