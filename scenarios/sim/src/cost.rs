//! Transfer-time model of NCCL collectives on the simulated cluster.
//!
//! Topology follows a rail-optimised cluster with one NIC per GPU and NCCL's
//! multi-channel rings: inside a host, neighbours talk over NVLink; across
//! hosts, channel `c` leaves host `h` from its GPU `c-1` and enters host
//! `h+1` at GPU `c`, so member `j` of a host sends to member `j+1` of the
//! next host ([`ring_send_peer`]). Every NIC of a communicator carries a
//! share of the traffic, and a collective is as slow as its slowest edge.
//!
//! Every member computes the same result from the same inputs (arrival
//! payloads from the hub), so completion times agree without more messages.

use serde::{Deserialize, Serialize};

use crate::{control::Control, model::Model, rng};

/// What one member's NIC looked like when its GPU reached the collective.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetState {
    /// Extra per-hop latency of this member's NIC (ns).
    pub lat_ns: u64,
    /// Fraction of nominal NIC bandwidth (injected knob × measured port).
    pub bw: f64,
    /// Non-default links from this NIC: (peer LID, extra ns, bandwidth fraction).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<(u16, u64, f64)>,
}

impl NetState {
    /// Reads `ctl` for a member whose peers have `peer_lids`.
    pub fn read(ctl: &Control, peer_lids: impl IntoIterator<Item = u16>) -> Self {
        let links = peer_lids
            .into_iter()
            .filter_map(|lid| {
                let (lat, bw) = ctl.link(lid);
                (lat != 0 || bw != 1.0).then_some((lid, lat, bw))
            })
            .collect();
        Self {
            lat_ns: ctl.nic_extra_latency_ns(),
            bw: ctl.nic_bw(),
            links,
        }
    }

    fn link(&self, lid: u16) -> (u64, f64) {
        self.links
            .iter()
            .find(|l| l.0 == lid)
            .map(|l| (l.1, l.2))
            .unwrap_or((0, 1.0))
    }
}

/// A communicator member as the cost model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub host: u32,
    pub lid: u16,
    pub net: NetState,
}

/// Collective kinds with their traffic patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
}

/// Latency (ns) and bandwidth (GB/s) of the edge `a → b`.
pub fn edge(model: &Model, a: &Member, b: &Member) -> (f64, f64) {
    if a.host == b.host {
        return (model.nvlink_latency_us * 1e3, model.nvlink_gbps);
    }
    let (la, ba) = a.net.link(b.lid);
    let (lb, bb) = b.net.link(a.lid);
    let lat = model.nic_latency_us * 1e3 + (a.net.lat_ns + b.net.lat_ns + la.max(lb)) as f64;
    let bw = model.nic_gbps * a.net.bw.min(b.net.bw) * ba.min(bb);
    (lat, bw.max(1e-6))
}

/// Members grouped by host, hosts in ascending order, members in comm order.
fn by_host(hosts: &[u32]) -> Vec<Vec<usize>> {
    let mut ids: Vec<u32> = hosts.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids.iter()
        .map(|h| (0..hosts.len()).filter(|&i| hosts[i] == *h).collect())
        .collect()
}

/// The member that `me` sends to over the network in a ring collective of a
/// communicator whose members live on `hosts`, or `None` when the
/// communicator is inside one host.
pub fn ring_send_peer(hosts: &[u32], me: usize) -> Option<usize> {
    let groups = by_host(hosts);
    if groups.len() < 2 {
        return None;
    }
    let hp = groups.iter().position(|g| g.contains(&me))?;
    let j = groups[hp].iter().position(|&m| m == me)?;
    let next = &groups[(hp + 1) % groups.len()];
    Some(next[(j + 1) % next.len()])
}

/// Edges `(from, to)` a ring collective uses: NVLink neighbours inside each
/// host and the channel edges between hosts.
fn ring_edges(hosts: &[u32]) -> Vec<(usize, usize)> {
    let groups = by_host(hosts);
    let mut edges = Vec::new();
    for g in &groups {
        for w in g.windows(2) {
            edges.push((w[0], w[1]));
        }
    }
    if groups.len() > 1 {
        for g in &groups {
            for &m in g {
                if let Some(p) = ring_send_peer(hosts, m) {
                    edges.push((m, p));
                }
            }
        }
    } else if hosts.len() > 1 {
        edges.push((hosts.len() - 1, 0));
    }
    edges
}

/// Parallel channels of a ring collective: one per GPU of the smallest host
/// when the ring crosses hosts (each channel leaves through its own NIC),
/// one inside a host.
pub fn channels(hosts: &[u32]) -> usize {
    let groups = by_host(hosts);
    if groups.len() > 1 {
        groups.iter().map(Vec::len).min().unwrap_or(1).max(1)
    } else {
        1
    }
}

/// Bytes one member sends over its inter-host channel edge in a collective
/// of `n` members moving `bytes`.
pub fn send_volume(kind: Kind, bytes: u64, n: usize, channels: usize) -> u64 {
    let n = n.max(1) as f64;
    let per_channel = bytes as f64 / channels.max(1) as f64;
    let v = match kind {
        Kind::AllReduce => 2.0 * (n - 1.0) / n * per_channel,
        Kind::AllGather | Kind::ReduceScatter => (n - 1.0) / n * per_channel,
        Kind::Broadcast | Kind::Reduce => per_channel,
    };
    v as u64
}

/// Transfer time (ns) of one collective moving `bytes` (the full buffer:
/// all-reduce/broadcast/reduce count, or the gathered total) once every
/// member has arrived. `noise_key` names the instance for jitter.
pub fn collective_ns(
    model: &Model,
    kind: Kind,
    bytes: u64,
    members: &[Member],
    noise_key: u64,
) -> u64 {
    let n = members.len();
    let jitter = rng::jitter_factor(rng::hash(&[model.seed, noise_key]), model.jitter);
    if n <= 1 {
        return (Model::wire_ns(bytes, model.nvlink_gbps) * jitter) as u64;
    }
    let hosts: Vec<u32> = members.iter().map(|m| m.host).collect();
    let channels = channels(&hosts);
    let (mut lat, mut bw) = (0f64, f64::INFINITY);
    for (a, b) in ring_edges(&hosts) {
        let (l, w) = edge(model, &members[a], &members[b]);
        lat = lat.max(l);
        bw = bw.min(w);
    }
    let nf = n as f64;
    let per_channel = bytes as f64 / channels as f64;
    let ns = match kind {
        Kind::AllReduce => 2.0 * (nf - 1.0) * (lat + Model::wire_ns((per_channel / nf) as u64, bw)),
        Kind::AllGather | Kind::ReduceScatter => {
            (nf - 1.0) * (lat + Model::wire_ns((per_channel / nf) as u64, bw))
        }
        Kind::Broadcast | Kind::Reduce => (nf - 1.0) * lat + Model::wire_ns(per_channel as u64, bw),
    };
    (ns * jitter) as u64
}

/// Transfer time (ns) of a point-to-point send of `bytes` from `a` to `b`.
pub fn p2p_ns(model: &Model, bytes: u64, a: &Member, b: &Member, noise_key: u64) -> u64 {
    let jitter = rng::jitter_factor(rng::hash(&[model.seed, noise_key]), model.jitter);
    let (lat, bw) = edge(model, a, b);
    ((lat + Model::wire_ns(bytes, bw)) * jitter) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::lid_of;

    fn cluster(hosts: u32, per_host: u32) -> Vec<Member> {
        (0..hosts * per_host)
            .map(|r| Member {
                host: r / per_host,
                lid: lid_of(r / per_host, r % per_host),
                net: NetState {
                    bw: 1.0,
                    ..Default::default()
                },
            })
            .collect()
    }

    const MB25: u64 = 25 << 20;

    #[test]
    fn channel_peers_follow_the_rails() {
        let hosts = [0, 0, 0, 0, 1, 1, 1, 1];
        assert_eq!(ring_send_peer(&hosts, 3), Some(4));
        assert_eq!(ring_send_peer(&hosts, 0), Some(5));
        assert_eq!(ring_send_peer(&hosts, 7), Some(0));
        assert_eq!(ring_send_peer(&[0, 0, 0], 1), None);
        // Every member sends to exactly one and receives from exactly one.
        let mut recv: Vec<usize> = (0..8).filter_map(|m| ring_send_peer(&hosts, m)).collect();
        recv.sort_unstable();
        assert_eq!(recv, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn network_is_slower_than_nvlink_and_bytes_cost_time() {
        let m = Model::default();
        let one_host = collective_ns(&m, Kind::AllReduce, MB25, &cluster(1, 8), 0);
        let two_hosts = collective_ns(&m, Kind::AllReduce, MB25, &cluster(2, 4), 0);
        assert!(two_hosts > one_host, "{two_hosts} <= {one_host}");
        let small = collective_ns(&m, Kind::AllReduce, MB25 / 8, &cluster(2, 4), 0);
        assert!(small < two_hosts);
    }

    #[test]
    fn a_slow_nic_slows_its_collectives_only() {
        let m = Model::default();
        let healthy = collective_ns(&m, Kind::AllReduce, MB25, &cluster(2, 4), 0);
        let mut c = cluster(2, 4);
        c[5].net.bw = 0.25;
        c[5].net.lat_ns = 50_000;
        let slow = collective_ns(&m, Kind::AllReduce, MB25, &c, 0);
        assert!(slow as f64 > 2.0 * healthy as f64, "{slow} vs {healthy}");
        // A communicator of host 0 only never touches rank 5's NIC.
        let host0 = &c[..4];
        assert_eq!(
            collective_ns(&m, Kind::AllReduce, MB25, host0, 0),
            collective_ns(&m, Kind::AllReduce, MB25, &cluster(1, 4), 0)
        );
    }

    #[test]
    fn a_slow_link_matters_only_when_used() {
        let m = Model::default();
        let base = cluster(2, 4);
        let healthy = collective_ns(&m, Kind::AllReduce, MB25, &base, 0);
        // 3 -> 4 is a channel edge; 3 <-> 5 is not.
        let mut used = base.clone();
        used[3].net.links.push((base[4].lid, 0, 0.2));
        let mut unused = base.clone();
        unused[3].net.links.push((base[5].lid, 0, 0.2));
        assert!(collective_ns(&m, Kind::AllReduce, MB25, &used, 0) > 2 * healthy);
        assert_eq!(
            collective_ns(&m, Kind::AllReduce, MB25, &unused, 0),
            healthy
        );
        assert!(
            p2p_ns(&m, MB25, &used[3], &used[4], 0) > 2 * p2p_ns(&m, MB25, &base[3], &base[4], 0)
        );
    }

    #[test]
    fn jitter_is_shared_by_members_and_bounded() {
        let m = Model {
            jitter: 0.1,
            ..Model::default()
        };
        let c = cluster(2, 2);
        let plain = collective_ns(&Model::default(), Kind::AllGather, MB25, &c, 9) as f64;
        let a = collective_ns(&m, Kind::AllGather, MB25, &c, 9);
        assert_eq!(a, collective_ns(&m, Kind::AllGather, MB25, &c, 9));
        assert!((a as f64 / plain - 1.0).abs() <= 0.1 + 1e-9);
    }
}
