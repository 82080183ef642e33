//! A C program written against the real prototypes (`cuda_runtime_api.h`,
//! `nccl.h`), linked against the stand-ins by soname, behaves as on real
//! hardware: launches return before the GPU work ends, synchronize waits for
//! it, and by-value / on-stack arguments (`dim3`, the 128-byte
//! `ncclUniqueId`, the 7th argument of `ncclAllReduce`) arrive intact.

use std::process::Command;

use slowrank_scenarios::{libs::prepare, sim::hub::Hub};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
#include <time.h>
typedef struct { unsigned int x, y, z; } dim3;
typedef void *cudaStream_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int cudaStreamCreate(cudaStream_t *);
int cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem, cudaStream_t stream);
int cudaStreamQuery(cudaStream_t);
int cudaStreamSynchronize(cudaStream_t);
int ncclGetVersion(int *);
int ncclGetUniqueId(ncclUniqueId *);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, ncclComm_t comm, cudaStream_t stream);
int ncclReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, int root, ncclComm_t comm, cudaStream_t stream);
static void kernel(void) {}
static uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
int main(void) {
  cudaStream_t s;
  if (cudaStreamCreate(&s)) return 10;
  uint64_t dur = 10000000; /* 10 ms per kernel */
  void *args[1] = { &dur };
  dim3 grid = { 108, 1, 1 }, block = { 256, 1, 1 };
  uint64_t t0 = now();
  for (int i = 0; i < 10; i++)
    if (cudaLaunchKernel((const void *)kernel, grid, block, args, 0, s)) return 11;
  uint64_t t1 = now();
  int busy = cudaStreamQuery(s);
  if (cudaStreamSynchronize(s)) return 12;
  uint64_t t2 = now();
  int version = 0;
  ncclGetVersion(&version);
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id)) return 13;
  if (ncclCommInitRank(&comm, 1, id, 0)) return 14;
  int ar = ncclAllReduce(0, 0, 1024, 9 /* ncclBfloat16 */, 0 /* ncclSum */, comm, s);
  int rd = ncclReduce(0, 0, 1024, 7 /* ncclFloat32 */, 2 /* ncclMax */, 0, comm, s);
  int bad = ncclAllReduce(0, 0, 1024, 42, 0, comm, s);
  if (cudaStreamSynchronize(s)) return 15;
  printf("%llu %llu %d %d %d %d %d\n", (unsigned long long)(t1 - t0), (unsigned long long)(t2 - t0), busy, version, ar, rd, bad);
  return 0;
}
"#;

#[test]
fn a_c_program_sees_real_semantics_through_the_real_prototypes() {
    let dir = slowrank_scenarios::scratch::ScratchDir::new("cabi").expect("scratch dir");
    let libs = prepare(&dir.join("lib")).expect("stand-ins are built");
    let src = dir.join("prog.c");
    let exe = dir.join("prog");
    std::fs::write(&src, PROGRAM).unwrap();
    let st = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", libs.dir.display()))
        .args(["-l:libcudart.so.12", "-l:libnccl.so.2"])
        .status()
        .expect("cc");
    assert!(
        st.success(),
        "cannot link a C program against the stand-ins"
    );
    let hub = Hub::start(&dir.join("hub.sock"), None).unwrap();
    let trace = dir.join("coll.log");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &libs.dir)
        .env("SLOWRANK_SIM_HUB", hub.path())
        .env("SLOWRANK_SIM_COLL_TRACE", &trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let f: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let (launch, total, busy, version, ar, rd, bad) = (f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    // 100 ms of modelled GPU work: sleeping never ends early.
    assert!(
        total >= 100_000_000,
        "synchronize returned after {total} ns"
    );
    assert!(
        launch * 4 < total,
        "10 launches took {launch} ns of {total} ns"
    );
    assert_eq!(
        busy, 600,
        "cudaStreamQuery right after launching: cudaErrorNotReady"
    );
    assert_eq!(version, 22105);
    assert_eq!((ar, rd), (0, 0), "collectives with on-stack arguments");
    assert_eq!(bad, 4, "unknown datatype is ncclInvalidArgument");
    // Both collectives ran on the stream.
    let lines = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(lines.lines().count(), 2, "{lines}");
}
