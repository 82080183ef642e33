//! What the join still holds open of a communicator, for the stages that
//! must line other records up with it ([`crate::join::realign`]).

use super::*;

impl Joiner {
    /// Every collective instance of `comm_id` still open (or kept as a
    /// hang candidate) that a member on a host other than `restarted`
    /// entered: its number, operation, size and that member's earliest
    /// entry (`to_coord` maps an agent time of a host). What the other
    /// hosts' members reported while a member's agent was away: a
    /// restarted agent that could connect only after they had shipped
    /// everything has nothing else to be lined up with
    /// ([`crate::join::realign`]). The restarted host's own old records
    /// are no reference: a communicator all on that host must be lined up
    /// within itself, and stale half-open instances of it once kept its
    /// members held and called them hung.
    pub fn open_collectives(
        &self,
        comm_id: u64,
        restarted: &str,
        to_coord: impl Fn(&str, u64) -> CoordNs,
    ) -> Vec<(u64, CollOp, u64, CoordNs)> {
        let Some(st) = self.comms.get(&comm_id) else {
            return Vec::new();
        };
        st.open
            .iter()
            .chain(st.stalled.iter())
            .filter_map(|(k, o)| {
                let InstanceKey::Coll(seq) = k else {
                    return None;
                };
                let entry = o
                    .records
                    .iter()
                    .filter(|m| &*m.host != restarted)
                    .map(|m| to_coord(&m.host, m.rec.host_entry_ns))
                    .min()?;
                Some((*seq, o.op, o.bytes, entry))
            })
            .collect()
    }
}
