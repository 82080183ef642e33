//! Hardware model of the simulated cluster: link speeds, latencies and the
//! proxy's polling rate. Passed to every rank as JSON in [`crate::env::MODEL`].

use serde::{Deserialize, Serialize};

/// Nominal speeds. Bandwidths are in GB/s (10⁹ bytes per second).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Model {
    /// Intra-host GPU↔GPU bandwidth (NVLink), per direction.
    pub nvlink_gbps: f64,
    /// Intra-host per-hop latency.
    pub nvlink_latency_us: f64,
    /// Inter-host bandwidth of one rank's NIC (one NIC per GPU, rail layout).
    pub nic_gbps: f64,
    /// Inter-host per-hop latency (NIC + switch).
    pub nic_latency_us: f64,
    /// Host↔device copy bandwidth (PCIe).
    pub pcie_gbps: f64,
    /// Sleep between two `poll_cq` calls of the NCCL proxy while a transfer is
    /// in flight. Real NCCL spins; this machine has 2 cores.
    pub poll_interval_us: u64,
    /// Largest RDMA write the proxy posts (NCCL's chunk size).
    pub chunk_bytes: u64,
    /// Cap on writes posted per collective and peer, to bound CPU use.
    pub max_chunks: u32,
    /// Relative noise on every transfer time (0.05 = ±5 %).
    pub jitter: f64,
    /// Seed for deterministic noise.
    pub seed: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            nvlink_gbps: 150.0,
            nvlink_latency_us: 3.0,
            nic_gbps: 25.0,
            nic_latency_us: 8.0,
            pcie_gbps: 25.0,
            poll_interval_us: 100,
            chunk_bytes: 4 << 20,
            max_chunks: 8,
            jitter: 0.0,
            seed: 0,
        }
    }
}

impl Model {
    /// The model from [`crate::env::MODEL`], or the defaults.
    pub fn from_env() -> Self {
        std::env::var(crate::env::MODEL)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default()
    }

    /// Nanoseconds to move `bytes` at `gbps` GB/s.
    pub fn wire_ns(bytes: u64, gbps: f64) -> f64 {
        bytes as f64 / gbps.max(1e-6)
    }
}
