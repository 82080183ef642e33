//! NCCL, loaded by soname through the library path.

use std::ffi::{c_int, c_void};

use libloading::Library;
use slowrank_sim::abi::nccl::{NcclUniqueId, NCCL_BFLOAT16, NCCL_SUM, NCCL_UNIQUE_ID_BYTES};

use super::{cuda::Stream, TrainerError};

pub type Comm = *mut c_void;
type R = c_int;

/// Typed entry points of `libnccl.so.2`.
pub struct Nccl {
    _lib: Library,
    get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> R,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> R,
    comm_split: unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> R,
    comm_destroy: unsafe extern "C" fn(Comm) -> R,
    all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> R,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> R,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> R,
    group_start: unsafe extern "C" fn() -> R,
    group_end: unsafe extern "C" fn() -> R,
}

fn check(call: &'static str, code: R) -> Result<(), TrainerError> {
    if code == 0 {
        Ok(())
    } else {
        Err(TrainerError::Nccl { call, code })
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

/// bf16 elements in `bytes`.
fn count(bytes: u64) -> usize {
    (bytes / 2) as usize
}

impl Nccl {
    pub fn load() -> Result<Self, TrainerError> {
        // SAFETY: loading NCCL runs no unusual initialisers.
        let lib = unsafe { Library::new("libnccl.so.2") }.map_err(|source| TrainerError::Load {
            lib: "libnccl.so.2",
            source,
        })?;
        Ok(Self {
            get_unique_id: sym!(lib, "ncclGetUniqueId"),
            comm_init_rank: sym!(lib, "ncclCommInitRank"),
            comm_split: sym!(lib, "ncclCommSplit"),
            comm_destroy: sym!(lib, "ncclCommDestroy"),
            all_reduce: sym!(lib, "ncclAllReduce"),
            send: sym!(lib, "ncclSend"),
            recv: sym!(lib, "ncclRecv"),
            group_start: sym!(lib, "ncclGroupStart"),
            group_end: sym!(lib, "ncclGroupEnd"),
            _lib: lib,
        })
    }

    pub fn unique_id(&self) -> Result<NcclUniqueId, TrainerError> {
        let mut id = NcclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out pointer.
        check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    pub fn init_rank(
        &self,
        nranks: u32,
        id: NcclUniqueId,
        rank: u32,
    ) -> Result<Comm, TrainerError> {
        let mut c = std::ptr::null_mut();
        // SAFETY: valid out pointer; the id is passed by value.
        check("ncclCommInitRank", unsafe {
            (self.comm_init_rank)(&mut c, nranks as c_int, id, rank as c_int)
        })?;
        Ok(c)
    }

    pub fn split(&self, parent: Comm, color: u32, key: u32) -> Result<Comm, TrainerError> {
        let mut c = std::ptr::null_mut();
        // SAFETY: our communicator; valid out pointer; default config.
        check("ncclCommSplit", unsafe {
            (self.comm_split)(
                parent,
                color as c_int,
                key as c_int,
                &mut c,
                std::ptr::null_mut(),
            )
        })?;
        Ok(c)
    }

    pub fn destroy(&self, c: Comm) -> Result<(), TrainerError> {
        // SAFETY: our communicator.
        check("ncclCommDestroy", unsafe { (self.comm_destroy)(c) })
    }

    pub fn all_reduce(
        &self,
        buf: *mut c_void,
        bytes: u64,
        c: Comm,
        s: Stream,
    ) -> Result<(), TrainerError> {
        // SAFETY: device buffer of `bytes`; our communicator and stream.
        check("ncclAllReduce", unsafe {
            (self.all_reduce)(buf, buf, count(bytes), NCCL_BFLOAT16, NCCL_SUM, c, s)
        })
    }

    pub fn send(
        &self,
        buf: *mut c_void,
        bytes: u64,
        peer: u32,
        c: Comm,
        s: Stream,
    ) -> Result<(), TrainerError> {
        // SAFETY: as above.
        check("ncclSend", unsafe {
            (self.send)(buf, count(bytes), NCCL_BFLOAT16, peer as c_int, c, s)
        })
    }

    pub fn recv(
        &self,
        buf: *mut c_void,
        bytes: u64,
        peer: u32,
        c: Comm,
        s: Stream,
    ) -> Result<(), TrainerError> {
        // SAFETY: as above.
        check("ncclRecv", unsafe {
            (self.recv)(buf, count(bytes), NCCL_BFLOAT16, peer as c_int, c, s)
        })
    }

    pub fn group_start(&self) -> Result<(), TrainerError> {
        // SAFETY: no arguments.
        check("ncclGroupStart", unsafe { (self.group_start)() })
    }

    pub fn group_end(&self) -> Result<(), TrainerError> {
        // SAFETY: no arguments.
        check("ncclGroupEnd", unsafe { (self.group_end)() })
    }
}
