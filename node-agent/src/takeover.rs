//! What a restarted agent takes over from the one before it: each running
//! rank's communicator table (communicator pointer → identity and record).
//!
//! NCCL names a communicator only when it is created, and a training job
//! creates them once, at start. An agent that restarts mid-job (a crash, an
//! upgrade) would otherwise see every later collective on a pointer it
//! cannot name, and lose them all for the rest of the job (the coordinator
//! then saw the host's ranks missing from every instance). The table is
//! small and changes only when a communicator is created or destroyed, so
//! it is rewritten whole, atomically, on each change.
//!
//! A process is known by its pid *and* its start time (`/proc/PID/stat`
//! field 22): a reused pid is never taken for the old rank. The sequence
//! numbers are not kept: the collectives issued while no agent watched are
//! unknown, so a taken-over communicator counts again from 0 and its record
//! says [`CommRecord::resumed`]; the coordinator lines the new numbers up
//! with the other members'.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use slowrank_shared::wire::CommRecord;

/// A state file larger than this is not read (a rank has a few dozen
/// communicators; 1,024 per rank at most in the fold).
const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an agent state file: {source}")]
    Format {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: {size} bytes, more than an agent state file can hold ({MAX_FILE_BYTES})")]
    TooLarge { path: PathBuf, size: u64 },
}

/// One communicator of one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedComm {
    /// The `ncclComm_t` the process passes to every call.
    pub ptr: u64,
    /// `ncclCommSplit` calls made on it so far (its next split's ordinal).
    pub splits: u64,
    pub comm_id: u64,
    pub parent_id: u64,
    pub color: i32,
    pub nranks: u32,
    pub rank_in_comm: u32,
    pub created_ns: u64,
    pub split_ordinal: u32,
    pub split_key: i32,
}

impl SavedComm {
    /// The record a taken-over communicator is announced with again.
    pub fn record(&self, pid: u32, rank: u32) -> CommRecord {
        CommRecord {
            pid,
            rank,
            comm_id: self.comm_id,
            parent_id: self.parent_id,
            color: self.color,
            nranks: self.nranks,
            rank_in_comm: self.rank_in_comm,
            created_ns: self.created_ns,
            split_ordinal: self.split_ordinal,
            split_key: self.split_key,
            resumed: true,
        }
    }
}

/// A followed process's live communicator table, from the fold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTable {
    pub pid: u32,
    pub rank: u32,
    /// (pointer, communicator id, splits made on it).
    pub comms: Vec<(u64, u64, u64)>,
}

/// One rank process's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedProc {
    pub pid: u32,
    /// Clock ticks since boot at which the process started.
    pub start_ticks: u64,
    pub rank: u32,
    pub comms: Vec<SavedComm>,
}

/// The whole state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    pub host: String,
    pub procs: Vec<SavedProc>,
}

impl Saved {
    /// The table of `pid`, if it is the same process (same start time).
    pub fn take(&mut self, pid: u32, start_ticks: u64) -> Option<SavedProc> {
        let i = self
            .procs
            .iter()
            .position(|p| p.pid == pid && p.start_ticks == start_ticks)?;
        Some(self.procs.swap_remove(i))
    }
}

/// The state file of `host` in `dir`.
pub fn path(dir: &Path, host: &str) -> PathBuf {
    let safe: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("agent-{safe}.comms.json"))
}

/// A process's start time (field 22 of `/proc/PID/stat`), or None when it
/// is gone.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_ticks(&stat)
}

fn parse_start_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Reads the state file; a missing file is an empty state.
pub fn load(path: &Path) -> Result<Saved, TakeoverError> {
    let io = |source| TakeoverError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Saved::default()),
        Err(e) => return Err(io(e)),
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(TakeoverError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
        });
    }
    let raw = std::fs::read(path).map_err(io)?;
    serde_json::from_slice(&raw).map_err(|source| TakeoverError::Format {
        path: path.to_owned(),
        source,
    })
}

/// Writes the state file atomically: a temporary file, fsync, rename. On
/// error the temporary file is removed and the previous state stays.
pub fn save(path: &Path, saved: &Saved) -> Result<(), TakeoverError> {
    let tmp = path.with_extension("json.tmp");
    let io = |source| TakeoverError::Io {
        path: path.to_owned(),
        source,
    };
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(saved).map_err(std::io::Error::other)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}

/// Builds the state from the fold's communicator tables and the records
/// announced for them (by pid, then communicator id).
pub fn build(
    host: &str,
    tables: Vec<LiveTable>,
    records: &BTreeMap<(u32, u64), CommRecord>,
    start: impl Fn(u32) -> Option<u64>,
) -> Saved {
    let mut procs = Vec::new();
    for LiveTable { pid, rank, comms } in tables {
        let Some(start_ticks) = start(pid) else {
            continue;
        };
        let comms: Vec<SavedComm> = comms
            .into_iter()
            .filter_map(|(ptr, comm_id, splits)| {
                // A split whose size is not known yet is taken over once
                // it is (its record comes with the size).
                let r = records.get(&(pid, comm_id)).filter(|r| r.nranks > 0)?;
                Some(SavedComm {
                    ptr,
                    splits,
                    comm_id,
                    parent_id: r.parent_id,
                    color: r.color,
                    nranks: r.nranks,
                    rank_in_comm: r.rank_in_comm,
                    created_ns: r.created_ns,
                    split_ordinal: r.split_ordinal,
                    split_key: r.split_key,
                })
            })
            .collect();
        if !comms.is_empty() {
            procs.push(SavedProc {
                pid,
                start_ticks,
                rank,
                comms,
            });
        }
    }
    Saved {
        host: host.to_owned(),
        procs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(pid: u32, comm_id: u64, nranks: u32) -> CommRecord {
        CommRecord {
            pid,
            rank: 3,
            comm_id,
            parent_id: 0,
            color: 0,
            nranks,
            rank_in_comm: 1,
            created_ns: 5,
            split_ordinal: 0,
            split_key: 0,
            resumed: false,
        }
    }

    #[test]
    fn start_time_is_read_past_a_name_with_spaces_and_parens() {
        let stat = "4242 (py (main) x) S 1 4242 4242 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 3 0 987654 1000 200";
        assert_eq!(parse_start_ticks(stat), Some(987_654));
        let own = start_ticks(std::process::id()).expect("own stat");
        assert!(own > 0);
    }

    #[test]
    fn saved_state_round_trips_and_only_the_same_process_takes_it() {
        let dir = std::env::temp_dir().join(format!("slowrank-takeover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = path(&dir, "host/1");
        assert!(p.ends_with("agent-host_1.comms.json"));
        assert_eq!(load(&p).unwrap(), Saved::default(), "no file: empty");
        let mut records = BTreeMap::new();
        records.insert((10, 0xab), rec(10, 0xab, 8));
        // A split still without its size is left out.
        records.insert((10, 0xcd), rec(10, 0xcd, 0));
        let saved = build(
            "host-1",
            vec![
                LiveTable {
                    pid: 10,
                    rank: 3,
                    comms: vec![(0x1000, 0xab, 2), (0x2000, 0xcd, 0)],
                },
                LiveTable {
                    pid: 11,
                    rank: 4,
                    comms: vec![(0x3000, 0xab, 0)],
                },
            ],
            &records,
            |pid| (pid == 10).then_some(77),
        );
        assert_eq!(saved.procs.len(), 1, "pid 11 is gone and has no record");
        assert_eq!(saved.procs[0].comms.len(), 1);
        save(&p, &saved).unwrap();
        assert!(!p.with_extension("json.tmp").exists());
        let mut back = load(&p).unwrap();
        assert_eq!(back, saved);
        assert!(
            back.take(10, 78).is_none(),
            "a reused pid is not the old rank"
        );
        let t = back.take(10, 77).expect("same process");
        let r = t.comms[0].record(t.pid, t.rank);
        assert!(r.resumed);
        assert_eq!((r.comm_id, r.nranks, t.comms[0].splits), (0xab, 8, 2));
        std::fs::write(&p, b"{not json").unwrap();
        assert!(matches!(load(&p), Err(TakeoverError::Format { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
