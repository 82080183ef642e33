//! Stand-in `libibverbs.so.1`, laid out like rdma-core: the verbs calls a
//! job makes through the library, forwarded to the provider that registered
//! itself with `verbs_register_driver_34` from its constructor. The data path
//! (`ibv_post_send`, `ibv_poll_cq`) is *not* here: in `verbs.h` those are
//! `static inline` and jump straight through `ctx->ops` into the provider.

mod api;
mod devices;
