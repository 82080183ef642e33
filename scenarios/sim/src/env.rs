//! Environment variables through which the launcher configures the stand-ins.
//!
//! The torchrun variables (`RANK`, `LOCAL_RANK`, ...) are what a real job
//! sees; the `SLOWRANK_SIM_*` ones exist only in simulation and say where the
//! simulated cluster's shared pieces are.

/// Path of the hub's Unix-domain socket (rendezvous, store, reports).
pub const HUB: &str = "SLOWRANK_SIM_HUB";
/// Path of this rank's mmap'd control block ([`crate::control::Control`]).
pub const CONTROL: &str = "SLOWRANK_SIM_CTL";
/// Global rank of this process (same value as `RANK`).
pub const RANK: &str = "SLOWRANK_SIM_RANK";
/// Index of the simulated host this rank lives on (same value as `GROUP_RANK`).
pub const HOST: &str = "SLOWRANK_SIM_HOST";
/// Rank's index on its host (same value as `LOCAL_RANK`).
pub const LOCAL: &str = "SLOWRANK_SIM_LOCAL";
/// JSON of [`crate::model::Model`].
pub const MODEL: &str = "SLOWRANK_SIM_MODEL";
/// `ADDR:PORT` of the launcher's echo sink, as reached from this rank's
/// host. Set only when the launcher shapes each NIC's port replica with
/// `tc` ([`crate::wire`]): the NIC then measures its port, and the fault
/// injector leaves a communication fault's bandwidth to `tc`.
pub const WIRE: &str = "SLOWRANK_SIM_WIRE";
/// Scenario spec path, read by the trainer.
pub const SPEC: &str = "SLOWRANK_SPEC";
/// Run directory of the scenario.
pub const RUN_DIR: &str = "SLOWRANK_RUN_DIR";

/// Reads an integer variable, `None` when unset or malformed.
pub fn u32_var(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}
