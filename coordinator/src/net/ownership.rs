//! Who may speak for a rank: the host that first reported it, until that
//! rank exits or its host's agent goes away. A token holder on another host
//! cannot take a live rank over by claiming an elastic restart (that alone
//! once silenced any rank with one batch).
//!
//! Pure rules over plain data; the analyzer asks them on ingest.

use std::sync::Mutex;

use foldhash::{HashMap, HashMapExt};

/// Hosts with a live agent connection, as `serve` reports them. Until it
/// reports anything (offline replays, in-process tests) liveness is
/// unknown and the older rule applies: a newer restart count may move a
/// rank.
#[derive(Debug, Default)]
pub struct LiveHosts {
    /// Live connections per host; `None` until the first report.
    live: Mutex<Option<HashMap<String, u32>>>,
}

impl LiveHosts {
    /// A connection of `host` came (`true`) or went (`false`).
    pub fn set(&self, host: &str, up: bool) {
        let mut g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let m = g.get_or_insert_with(HashMap::new);
        if up {
            *m.entry(host.to_owned()).or_insert(0) += 1;
        } else if let Some(n) = m.get_mut(host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(host);
            }
        }
    }

    /// Whether `host` has a live agent; `None` while nobody reports liveness.
    pub fn is_live(&self, host: &str) -> Option<bool> {
        let g = self.live.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|m| m.contains_key(host))
    }

    /// Whether liveness is reported at all.
    pub fn tracking(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// The rank's current owner, as the analyzer knows it.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub host: &'a str,
    pub exited: bool,
    pub restart_count: u32,
}

/// Whether `host`, announcing the rank with `restart_count`, may take it
/// from `owner`: always from the same host (a restart in place), once the
/// owner's process exited, or once the owner's agent is gone. With
/// liveness unknown, a newer restart count also may.
pub fn may_take(owner: &Owner<'_>, host: &str, restart_count: u32, live: &LiveHosts) -> bool {
    if owner.host == host || owner.exited {
        return true;
    }
    match live.is_live(owner.host) {
        Some(owner_live) => !owner_live,
        None => restart_count > owner.restart_count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(exited: bool) -> Owner<'static> {
        Owner {
            host: "a",
            exited,
            restart_count: 0,
        }
    }

    #[test]
    fn a_live_owner_keeps_its_rank_whatever_restart_count_is_claimed() {
        let live = LiveHosts::default();
        live.set("a", true);
        live.set("b", true);
        assert!(!may_take(&owner(false), "b", 1, &live));
        assert!(!may_take(&owner(false), "b", u32::MAX, &live));
        // The same host restarting in place, or the rank having exited.
        assert!(may_take(&owner(false), "a", 1, &live));
        assert!(may_take(&owner(true), "b", 0, &live));
    }

    #[test]
    fn the_rank_moves_once_its_owners_agent_is_gone() {
        let live = LiveHosts::default();
        live.set("a", true);
        live.set("a", true);
        live.set("a", false);
        assert!(
            !may_take(&owner(false), "b", 1, &live),
            "one connection of a is still up"
        );
        live.set("a", false);
        assert_eq!(live.is_live("a"), Some(false));
        assert!(may_take(&owner(false), "b", 0, &live));
    }

    #[test]
    fn without_liveness_a_newer_restart_moves_the_rank() {
        let live = LiveHosts::default();
        assert!(!live.tracking());
        assert!(!may_take(&owner(false), "b", 0, &live));
        assert!(may_take(&owner(false), "b", 1, &live));
    }
}
