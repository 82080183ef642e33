//! A clock probe as measured: the four times one round trip gives. The
//! coordinator fits each host's clock from these (`slowrank_coordinator::clock`);
//! they are plain data so that generators and replays can make them too.

/// One round-trip clock probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClockSample {
    /// Coordinator monotonic ns when the probe left.
    pub coord_send_ns: u64,
    /// Agent ns when the probe arrived: the kernel's stamp on the UDP clock
    /// port, the one read while answering on the QUIC control stream.
    pub agent_mono_ns: u64,
    /// Agent ns between the probe's arrival and its answer leaving (NTP's
    /// t3 − t2), taken out of the round trip; 0 on the control stream,
    /// where one read stands for both.
    #[serde(default)]
    pub agent_hold_ns: u64,
    /// Coordinator monotonic ns when the answer arrived.
    pub coord_recv_ns: u64,
    /// Came through the kernel-stamped UDP clock port.
    #[serde(default)]
    pub udp: bool,
}
