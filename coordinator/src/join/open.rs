//! What the join still holds open of a communicator, for the stages that
//! must line other records up with it ([`crate::join::realign`]).

use super::*;

impl Joiner {
    /// Every collective instance of `comm_id` still open (or kept as a
    /// hang candidate): its number, operation, size and when its first
    /// member entered (`to_coord` maps an agent time of a host). What the
    /// other members reported while a member's agent was away: a restarted
    /// agent that could connect only after they had shipped everything has
    /// nothing else to be lined up with ([`crate::join::realign`]).
    pub fn open_collectives(
        &self,
        comm_id: u64,
        to_coord: impl Fn(&str, u64) -> CoordNs,
    ) -> Vec<(u64, CollOp, u64, CoordNs)> {
        let Some(st) = self.comms.get(&comm_id) else {
            return Vec::new();
        };
        st.open
            .iter()
            .chain(st.stalled.iter())
            .filter_map(|(k, o)| match k {
                InstanceKey::Coll(seq) => Some((
                    *seq,
                    o.op,
                    o.bytes,
                    to_coord(&o.first_host, o.first_agent_ns),
                )),
                InstanceKey::P2p { .. } => None,
            })
            .collect()
    }
}
