//! Per-rank step times (`DIR/steps.csv`).

use std::{collections::BTreeMap, io::Write, path::Path};

use serde::{Deserialize, Serialize};

/// One iteration of one rank; times are `CLOCK_MONOTONIC` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTime {
    pub rank: u32,
    pub iteration: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub wall_ns: u64,
}

impl StepTime {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// All step times of a run.
#[derive(Debug, Default, Clone)]
pub struct StepLog {
    /// (rank, iteration) -> step.
    pub steps: BTreeMap<(u32, u64), StepTime>,
}

pub const CSV_HEADER: &str = "rank,iteration,start_ns,end_ns,duration_us,wall_ns";

impl StepLog {
    pub fn add(&mut self, s: StepTime) {
        self.steps.insert((s.rank, s.iteration), s);
    }

    /// Iterations completed by `rank`.
    pub fn done_by(&self, rank: u32) -> u64 {
        self.steps.range((rank, 0)..(rank, u64::MAX)).count() as u64
    }

    /// Median step time (ns) over all ranks of the last `last` iterations.
    pub fn recent_median_ns(&self, last: u64) -> Option<u64> {
        let max_it = self.steps.keys().map(|k| k.1).max()?;
        let mut d: Vec<u64> = self
            .steps
            .values()
            .filter(|s| s.iteration + last > max_it)
            .map(StepTime::duration_ns)
            .collect();
        d.sort_unstable();
        d.get(d.len() / 2).copied()
    }

    pub fn of_rank(&self, rank: u32) -> Vec<StepTime> {
        self.steps
            .range((rank, 0)..(rank, u64::MAX))
            .map(|(_, s)| *s)
            .collect()
    }

    pub fn write_csv(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(f, "{CSV_HEADER}")?;
        for s in self.steps.values() {
            writeln!(
                f,
                "{},{},{},{},{},{}",
                s.rank,
                s.iteration,
                s.start_ns,
                s.end_ns,
                s.duration_ns() / 1000,
                s.wall_ns
            )?;
        }
        f.flush()
    }

    pub fn read_csv(path: &Path) -> std::io::Result<StepLog> {
        let text = std::fs::read_to_string(path)?;
        let bad = |l: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad steps.csv line: {l}"),
            )
        };
        let mut log = StepLog::default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != 6 {
                return Err(bad(line));
            }
            let n = |i: usize| f[i].parse::<u64>().map_err(|_| bad(line));
            log.add(StepTime {
                rank: n(0)? as u32,
                iteration: n(1)?,
                start_ns: n(2)?,
                end_ns: n(3)?,
                wall_ns: n(5)?,
            });
        }
        Ok(log)
    }
}
