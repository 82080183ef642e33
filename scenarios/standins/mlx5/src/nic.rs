//! The simulated NIC: a send takes its wire time on the port (sends
//! serialise) plus the hop latency, both from the hardware model and the
//! live fault knobs (NIC-wide and per destination link); the NIC-wide
//! bandwidth also includes what the port monitor measured on the port's
//! replica when the launcher shapes ports with `tc` (`port.rs`).
//!
//! A reliable-connection send completes when the receiver acknowledges it,
//! so the *receiving* NIC's bandwidth and latency count as well (the cost
//! model's edge does the same): a slow NIC shows on the links into it, not
//! only on the ones out of it, which is what tells it from one slow link.

use std::{collections::HashMap, sync::Mutex};

use slowrank_sim::{clock, control::Control, model::Model};

pub struct Nic {
    pub lid: u16,
    model: Model,
    ctl: &'static Control,
    /// When the port finishes serialising what was posted so far.
    busy_until: Mutex<u64>,
    /// Receiving NICs' control blocks by LID (`None`: not in the harness).
    peers: Mutex<HashMap<u16, Option<&'static Control>>>,
}

impl Nic {
    pub fn new(lid: u16) -> Self {
        Self {
            lid,
            model: Model::from_env(),
            ctl: Control::current(),
            busy_until: Mutex::new(0),
            peers: Mutex::new(HashMap::new()),
        }
    }

    /// Posts `bytes` to the NIC with LID `dlid` now; returns when the
    /// completion becomes visible (monotonic ns).
    pub fn send(&self, bytes: u64, dlid: u16) -> u64 {
        let (link_lat, link_bw) = self.ctl.link(dlid);
        let (peer_lat, peer_bw) = self
            .peer(dlid)
            .map_or((0, 1.0), |p| (p.nic_extra_latency_ns(), p.nic_bw()));
        let extra = self.ctl.nic_extra_latency_ns() + peer_lat + link_lat;
        let lat = self.model.nic_latency_us * 1e3 + extra as f64;
        let bw = self.model.nic_gbps * self.ctl.nic_bw().min(peer_bw) * link_bw;
        let wire = Model::wire_ns(bytes, bw) as u64;
        let mut busy = self.busy_until.lock().unwrap_or_else(|p| p.into_inner());
        let start = (*busy).max(clock::mono_ns());
        *busy = start + wire;
        start + wire + lat as u64
    }

    fn peer(&self, lid: u16) -> Option<&'static Control> {
        *self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(lid)
            .or_insert_with(|| Control::peer(lid))
    }
}
