//! Stand-in verbs provider `libmlx5.so.1`: one simulated NIC per device
//! (one per GPU, rail layout). Like rdma-core's providers it registers with
//! libibverbs from a constructor and fills each context's ops table with its
//! own `post_send` / `poll_cq`, which it does **not** export: a tool must find
//! them through `ctx->ops` (Trap 2 of the design).

mod nic;
mod objects;
mod ops;
mod port;
mod trace;

/// Runs when libibverbs dlopens us: register with it, as rdma-core's
/// `PROVIDER_DRIVER` constructor does.
extern "C" fn init() {
    let name = c"libibverbs.so.1";
    // SAFETY: NOLOAD returns the already-loaded libibverbs (the one loading
    // us) without loading anything; the symbol has the expected signature.
    unsafe {
        let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return;
        }
        let sym = libc::dlsym(h, c"verbs_register_driver_34".as_ptr());
        if !sym.is_null() {
            let register: unsafe extern "C" fn(*const slowrank_sim::abi::verbs::ProviderOps) =
                std::mem::transmute(sym);
            register(&ops::PROVIDER);
        }
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
