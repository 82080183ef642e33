//! Where each rank lives and which groups it belongs to.
//!
//! Ranks are numbered like torchrun: host `h`, local rank `l` is global rank
//! `h * ranks_per_host + l`. Parallel coordinates follow Megatron-LM's order
//! (tensor fastest, then data, then pipeline):
//! `rank = pp_idx * (dp * tp) + dp_idx * tp + tp_idx`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub hosts: u32,
    pub ranks_per_host: u32,
}

/// A rank's coordinates in the parallel layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coords {
    pub tp: u32,
    pub dp: u32,
    pub pp: u32,
}

impl Layout {
    pub fn world(&self) -> u32 {
        self.hosts * self.ranks_per_host
    }

    pub fn host_of(&self, rank: u32) -> u32 {
        rank / self.ranks_per_host
    }

    pub fn local_of(&self, rank: u32) -> u32 {
        rank % self.ranks_per_host
    }

    pub fn coords(&self, rank: u32) -> Coords {
        Coords {
            tp: rank % self.tp,
            dp: (rank / self.tp) % self.dp,
            pp: rank / (self.tp * self.dp),
        }
    }

    pub fn rank_of(&self, c: Coords) -> u32 {
        c.pp * self.dp * self.tp + c.dp * self.tp + c.tp
    }

    /// Tensor-parallel group of `rank`: (group index, members in order).
    pub fn tp_group(&self, rank: u32) -> (u32, Vec<u32>) {
        let c = self.coords(rank);
        let members = (0..self.tp)
            .map(|tp| self.rank_of(Coords { tp, ..c }))
            .collect();
        (c.pp * self.dp + c.dp, members)
    }

    /// Data-parallel group of `rank`.
    pub fn dp_group(&self, rank: u32) -> (u32, Vec<u32>) {
        let c = self.coords(rank);
        let members = (0..self.dp)
            .map(|dp| self.rank_of(Coords { dp, ..c }))
            .collect();
        (c.pp * self.tp + c.tp, members)
    }

    /// Pipeline group of `rank`, members ordered by stage.
    pub fn pp_group(&self, rank: u32) -> (u32, Vec<u32>) {
        let c = self.coords(rank);
        let members = (0..self.pp)
            .map(|pp| self.rank_of(Coords { pp, ..c }))
            .collect();
        (c.dp * self.tp + c.tp, members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_partition_the_world() {
        let l = Layout {
            tp: 2,
            pp: 2,
            dp: 4,
            hosts: 4,
            ranks_per_host: 4,
        };
        for r in 0..16 {
            assert_eq!(l.rank_of(l.coords(r)), r);
            for (_, g) in [l.tp_group(r), l.dp_group(r), l.pp_group(r)] {
                assert!(g.contains(&r));
            }
        }
        assert_eq!(l.tp_group(5).1, vec![4, 5]);
        assert_eq!(l.dp_group(5).1, vec![1, 3, 5, 7]);
        assert_eq!(l.pp_group(5).1, vec![5, 13]);
        assert_eq!(l.host_of(13), 3);
        assert_eq!(l.local_of(13), 1);
    }
}
