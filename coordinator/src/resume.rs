//! What a coordinator keeps across a restart, in its `--out` directory.
//!
//! Two files, both in `--out`:
//! - `report.json` (written atomically by [`crate::report::outputs`]): the verdicts,
//!   open and closed, with their evidence, and the ingest counters. A new
//!   life reads it back and carries every verdict of the earlier lives into
//!   its own reports ([`Earlier::merge_into`]), each once.
//! - [`MARKS_FILE`], an append-only journal: one JSON line per ingested
//!   batch (agent, host, sequence, drop counters), appended *before* the
//!   batch is acknowledged to its agent. A batch the agent resends after a
//!   restart (it never saw the answer) is then known as ingested and
//!   counted as a duplicate instead of being ingested twice. A line is
//!   written with one `write` and survives a SIGKILL of the coordinator (it
//!   is in the page cache); the journal is fsync'ed when it is compacted
//!   at startup. A torn last line (a host crash mid-append) is skipped.
//!
//! - [`CLOCKS_FILE`]: each host's clock model (offset, drift, error bound,
//!   when it was estimated), rewritten atomically with the report. A new
//!   life on the same boot of the coordinator's host (both clocks are
//!   CLOCK_MONOTONIC) seeds its clocks with them, the bound widened for the
//!   time since, so the resent spools map at once instead of waiting for
//!   this life's first probe answers; the first fresh probe replaces a seed.
//!
//! - [`BASELINES_FILE`]: the job's pace (the baseline its slowdowns are
//!   told against, the last [`crate::analyzer::KEPT_HISTORY`] steps the slow
//!   stretches read), the recent steps and the spread between ranks
//!   ([`crate::graph::spread`]), rewritten atomically with the
//!   report ([`crate::analyzer::Baselines`]). With `timeline.json` (the
//!   report page's series) it is handed to the new life, which applies both
//!   at its first sealed iteration if they are this job's.
//!
//! What does not survive: open collective instances and the per-rank
//! windows of the tests (the last few iterations per rank, relearned within
//! the new life's warm-up); see `docs/operations.md`, "What survives a
//! restart".

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::analyzer::Baselines;
pub use crate::analyzer::Mark;
use crate::clock::ClockSeed;
use crate::report::outputs::{self, OutputError, ReadError};
use crate::report::timeline::Timeline;
use crate::report::IngestCounters;
use crate::report::Report;
pub use crate::report::ResumeInfo;
use crate::verdict::Verdict;

/// The ingest journal's file name in `--out`.
pub const MARKS_FILE: &str = "ingested.jsonl";

/// The clock models' file name in `--out`.
pub const CLOCKS_FILE: &str = "clocks.json";

/// The job's baselines' file name in `--out`.
pub const BASELINES_FILE: &str = "baselines.json";

/// Iterations a new life must analyse before a verdict that was active
/// when the earlier life died, and that it has not raised again, is shown
/// closed. The lifecycle needs about as many iterations to open a verdict
/// after its warm-up (baselines, then a few slow iterations in a row), so
/// fewer would close a verdict the new life simply has not reached yet.
pub const RECONFIRM_ITERATIONS: u64 = 60;

#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the ingest journal {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot compact the ingest journal")]
    Compact(#[from] OutputError),
    #[error("cannot write the clock models")]
    Clocks(#[source] OutputError),
    #[error("cannot write the job's baselines")]
    Baselines(#[source] OutputError),
}

/// The clock models an earlier life kept ([`CLOCKS_FILE`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockFile {
    /// The coordinator host's boot (`/proc/sys/kernel/random/boot_id`):
    /// coordinator times of another boot are another clock.
    pub boot_id: String,
    /// Per host.
    pub hosts: BTreeMap<String, ClockSeed>,
}

/// This boot of the coordinator's host; `None` where the kernel does not
/// say (then clock models are neither kept nor seeded).
pub fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Writes the clock models atomically (temp file, fsync, rename).
pub fn save_clocks(dir: &Path, file: &ClockFile) -> Result<(), ResumeError> {
    let bytes =
        serde_json::to_vec_pretty(file).map_err(|e| ResumeError::Clocks(OutputError::Json(e)))?;
    outputs::write_atomic(dir, CLOCKS_FILE, &bytes).map_err(ResumeError::Clocks)
}

/// Writes the job's baselines atomically (temp file, fsync, rename).
pub fn save_baselines(dir: &Path, b: &Baselines) -> Result<(), ResumeError> {
    let bytes = serde_json::to_vec(b).map_err(|e| ResumeError::Baselines(OutputError::Json(e)))?;
    outputs::write_atomic(dir, BASELINES_FILE, &bytes).map_err(ResumeError::Baselines)
}

/// The seeds to start this life's clocks from: those an earlier life kept
/// on this same boot (`boot`), none otherwise.
pub fn clock_seeds(earlier: &Earlier, boot: Option<&str>) -> BTreeMap<String, ClockSeed> {
    match (&earlier.clocks, boot) {
        (Some(f), Some(b)) if f.boot_id == b => f.hosts.clone(),
        _ => BTreeMap::new(),
    }
}

/// One line of the journal: a batch ingested, or a life started (written
/// before that life serves anything, so a life killed before its first
/// report still counts).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Line {
    Mark(Mark),
    Life {
        life_started: chrono::DateTime<chrono::Utc>,
    },
    /// The iteration period an earlier life decided.
    Period {
        iteration_period: crate::graph::iteration::Period,
    },
}

/// What the earlier lives left in `--out`.
#[derive(Debug, Default, Clone)]
pub struct Earlier {
    /// When each earlier life started (from the journal).
    pub lives: Vec<chrono::DateTime<chrono::Utc>>,
    /// The iteration period the earlier lives decided (the latest).
    pub period: Option<crate::graph::iteration::Period>,
    /// Per agent, its last ingested batch.
    pub marks: BTreeMap<String, Mark>,
    /// The last report an earlier life wrote.
    pub report: Option<Report>,
    /// Journal lines that could not be read (a torn last line).
    pub bad_lines: usize,
    /// An unreadable previous report, moved aside to this path (kept, not
    /// overwritten).
    pub moved_aside: Option<PathBuf>,
    /// The clock models the last earlier life kept.
    pub clocks: Option<ClockFile>,
    /// The job's baselines the last earlier life kept.
    pub baselines: Option<Baselines>,
    /// The report page's series it last wrote.
    pub timeline: Timeline,
}

/// Reads what earlier lives left in `dir` (nothing there: an empty
/// [`Earlier`]). An unreadable `report.json` is moved aside, not lost.
pub fn load(dir: &Path) -> Result<Earlier, ResumeError> {
    let mut e = Earlier::default();
    let journal = dir.join(MARKS_FILE);
    match fs::read_to_string(&journal) {
        Ok(text) => {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Line>(line) {
                    Ok(Line::Mark(m)) => {
                        let keep = e.marks.get(&m.agent_id).is_none_or(|old| old.seq < m.seq);
                        if keep {
                            e.marks.insert(m.agent_id.clone(), m);
                        }
                    }
                    Ok(Line::Life { life_started }) => e.lives.push(life_started),
                    Ok(Line::Period { iteration_period }) => e.period = Some(iteration_period),
                    Err(_) => e.bad_lines += 1,
                }
            }
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ResumeError::Read {
                path: journal,
                source,
            })
        }
    }
    let clocks = dir.join(CLOCKS_FILE);
    match fs::read(&clocks) {
        Ok(bytes) => match serde_json::from_slice::<ClockFile>(&bytes) {
            Ok(f) => e.clocks = Some(f),
            // Only a head start is lost: the clocks are learned again.
            Err(err) => tracing::warn!(
                path = %clocks.display(),
                error = %err,
                "unreadable clock models; learning the clocks again"
            ),
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ResumeError::Read {
                path: clocks,
                source,
            })
        }
    }
    let baselines = dir.join(BASELINES_FILE);
    match fs::read(&baselines) {
        Ok(bytes) => match serde_json::from_slice::<Baselines>(&bytes) {
            Ok(b) => e.baselines = Some(b),
            // Only a head start is lost: the baselines are learned again.
            Err(err) => tracing::warn!(
                path = %baselines.display(),
                error = %err,
                "unreadable baselines; learning the job's pace again"
            ),
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ResumeError::Read {
                path: baselines,
                source,
            })
        }
    }
    match outputs::read_timeline(dir) {
        Ok(t) => e.timeline = t,
        Err(ReadError::Io { path, source }) => return Err(ResumeError::Read { path, source }),
        // The page's series starts again; the report keeps the verdicts.
        Err(err) => tracing::warn!("{err}; the report page's series starts again"),
    }
    let report = dir.join(outputs::REPORT_JSON);
    if report.exists() {
        match outputs::read_report(&report) {
            Ok(r) => e.report = Some(r),
            Err(ReadError::Io { path, source }) => return Err(ResumeError::Read { path, source }),
            Err(err) => {
                let aside = dir.join(format!(
                    "{}.unreadable-{}",
                    outputs::REPORT_JSON,
                    chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
                ));
                tracing::warn!(
                    "{err}; moved to {} and starting without the earlier verdicts",
                    aside.display()
                );
                fs::rename(&report, &aside).map_err(|source| ResumeError::Write {
                    path: aside.clone(),
                    source,
                })?;
                e.moved_aside = Some(aside);
            }
        }
    }
    Ok(e)
}

/// The append-only ingest journal.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: fs::File,
    /// The period last written (written again only when it changes).
    period: Option<crate::graph::iteration::Period>,
}

impl Journal {
    /// Rewrites the journal as one line per agent and per life, this one's
    /// (`started`) last (atomically: temp file, fsync, rename), then opens
    /// it for appending.
    pub fn open(
        dir: &Path,
        earlier: &Earlier,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Result<Self, ResumeError> {
        let mut text = String::new();
        for life_started in earlier.lives.iter().copied().chain([started]) {
            text.push_str(&to_line(&Line::Life { life_started }));
        }
        if let Some(p) = earlier.period {
            text.push_str(&to_line(&Line::Period {
                iteration_period: p,
            }));
        }
        for m in earlier.marks.values() {
            text.push_str(&line(m));
        }
        outputs::write_atomic(dir, MARKS_FILE, text.as_bytes())?;
        let path = dir.join(MARKS_FILE);
        let file = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|source| ResumeError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            path,
            file,
            period: earlier.period,
        })
    }

    /// Records the iteration period once decided (or changed).
    pub fn note_period(&mut self, p: crate::graph::iteration::Period) -> Result<(), ResumeError> {
        if self.period == Some(p) {
            return Ok(());
        }
        self.period = Some(p);
        self.file
            .write_all(
                to_line(&Line::Period {
                    iteration_period: p,
                })
                .as_bytes(),
            )
            .map_err(|source| ResumeError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Appends `marks` with one write (so a SIGKILL leaves whole lines).
    pub fn append(&mut self, marks: &[Mark]) -> Result<(), ResumeError> {
        if marks.is_empty() {
            return Ok(());
        }
        let text: String = marks.iter().map(line).collect();
        self.file
            .write_all(text.as_bytes())
            .map_err(|source| ResumeError::Write {
                path: self.path.clone(),
                source,
            })
    }
}

fn line(m: &Mark) -> String {
    to_line(&Line::Mark(m.clone()))
}

fn to_line(l: &Line) -> String {
    // Always serializes (strings, integers, a timestamp).
    let mut s = serde_json::to_string(l).unwrap_or_default();
    s.push('\n');
    s
}

/// Same subject: the same rank (or link, or host) with the same class.
fn same_subject(a: &Verdict, b: &Verdict) -> bool {
    a.kind == b.kind
        && a.rank == b.rank
        && a.host == b.host
        && a.link.as_ref().map(|l| l.ranks) == b.link.as_ref().map(|l| l.ranks)
}

impl Earlier {
    /// Lives before this one (0: a first start).
    fn lives(&self) -> u32 {
        let reported = self
            .report
            .as_ref()
            .map_or(0, |r| r.resumed.as_ref().map_or(1, |i| i.lives));
        reported.max(self.lives.len() as u32)
    }

    /// Puts the earlier lives' verdicts and counters into `r` (this life's
    /// report): a verdict this life raised again is merged into the earlier
    /// one (its id, its first sighting, costs added); the others are kept
    /// as they were, except that one still active at the restart and not
    /// raised again within [`RECONFIRM_ITERATIONS`] is shown closed.
    pub fn merge_into(&self, r: &mut Report, started: chrono::DateTime<chrono::Utc>) {
        let Some(prev) = &self.report else {
            if !self.lives.is_empty() {
                // Earlier lives died before their first report.
                r.resumed = Some(ResumeInfo {
                    lives: self.lives() + 1,
                    restarted_at: self.restarts_by_lives(started),
                    ..Default::default()
                });
            }
            return;
        };
        // Another job's report in the same --out is not this job's history.
        if let (Some(a), Some(b)) = (&prev.job.job_id, &r.job.job_id) {
            if a != b {
                return;
            }
        }
        let prev_info = prev.resumed.clone().unwrap_or_else(|| ResumeInfo {
            lives: 1,
            ..Default::default()
        });
        let mut earlier_ingest = prev_info.earlier_ingest.clone();
        add_counters(&mut earlier_ingest, &prev.ingest.counters);
        let restarted_at = if self.lives.len() > 1 {
            self.restarts_by_lives(started)
        } else {
            let mut v = prev_info.restarted_at.clone();
            v.push(started);
            v
        };
        let observed = r.job.iterations_observed;
        let current = std::mem::take(&mut r.verdicts);
        // Ids go on after every earlier one, transients' included.
        let offset = prev
            .verdicts
            .iter()
            .chain(&prev.transients)
            .map(|v| v.id)
            .max()
            .unwrap_or(0);
        r.verdicts = merged_verdicts(&prev.verdicts, current, observed, started, offset);
        // Earlier lives' transients, then this life's.
        let mut transients = prev.transients.clone();
        transients.extend(std::mem::take(&mut r.transients).into_iter().map(|mut t| {
            t.id += offset;
            t
        }));
        r.transients = transients;
        r.resumed = Some(ResumeInfo {
            lives: self.lives() + 1,
            restarted_at,
            verdicts_carried: prev.verdicts.len(),
            earlier_ingest,
        });
    }

    /// When each life after the first began, from the lives recorded, this
    /// one (`started`) last.
    fn restarts_by_lives(
        &self,
        started: chrono::DateTime<chrono::Utc>,
    ) -> Vec<chrono::DateTime<chrono::Utc>> {
        self.lives
            .iter()
            .skip(1)
            .copied()
            .chain([started])
            .collect()
    }
}

/// The earlier lives' verdicts (`prev`) with this life's (`current`): one
/// raised again merged into the earlier, the earlier others carried, this
/// life's new ones numbered after the earlier; active first, then by id.
fn merged_verdicts(
    prev: &[Verdict],
    mut current: Vec<Verdict>,
    observed: u64,
    started: chrono::DateTime<chrono::Utc>,
    offset: u64,
) -> Vec<Verdict> {
    let mut out = Vec::with_capacity(prev.len() + current.len());
    for e in prev {
        match current.iter().position(|c| same_subject(c, e)) {
            Some(i) => out.push(raised_again(current.remove(i), e, started)),
            None => out.push(carried_over(e, observed, started)),
        }
    }
    for mut c in current {
        c.id += offset;
        out.push(c);
    }
    out.sort_by(|a, b| b.active.cmp(&a.active).then(a.id.cmp(&b.id)));
    out
}

/// This life's verdict `c` merged into the earlier one `e` it repeats: its
/// id, its first sighting, costs and episodes added.
fn raised_again(mut c: Verdict, e: &Verdict, started: chrono::DateTime<chrono::Utc>) -> Verdict {
    c.id = e.id;
    c.first_seen = e.first_seen.or(c.first_seen);
    c.lost_gpu_seconds += e.lost_gpu_seconds;
    // An episode open at the restart continues in this life.
    c.episodes += e.episodes.saturating_sub(u32::from(e.active));
    c.evidence.push(format!(
        "also found before the coordinator restarted at {} ({} episode(s), {:.1} GPU-s lost then)",
        started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        e.episodes,
        e.lost_gpu_seconds
    ));
    if c.flamegraph.is_none() {
        c.flamegraph = e.flamegraph.clone();
    }
    c
}

/// An earlier verdict not raised again: kept as it was, except that one
/// still active is shown closed once [`RECONFIRM_ITERATIONS`] went by.
fn carried_over(e: &Verdict, observed: u64, started: chrono::DateTime<chrono::Utc>) -> Verdict {
    let mut v = e.clone();
    if v.active && observed >= RECONFIRM_ITERATIONS {
        v.active = false;
        v.evidence.push(format!(
            "not seen again in the {observed} iterations after the coordinator restarted at {}",
            started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    v
}

/// `into += more`, field by field.
pub fn add_counters(into: &mut IngestCounters, more: &IngestCounters) {
    let add_map = |a: &mut BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        for (k, v) in b {
            *a.entry(k.clone()).or_default() += v;
        }
    };
    into.batches += more.batches;
    into.duplicate_batches += more.duplicate_batches;
    into.missing_batches += more.missing_batches;
    into.records_accepted += more.records_accepted;
    add_map(&mut into.records_rejected, &more.records_rejected);
    add_map(&mut into.batches_rejected, &more.batches_rejected);
    into.recent_rejections = more.recent_rejections.clone();
    into.ringbuf_drops += more.ringbuf_drops;
    into.spool_drops += more.spool_drops;
    into.nccl_errors += more.nccl_errors;
    into.clock_samples_refused += more.clock_samples_refused;
    into.replayed_unjoinable += more.replayed_unjoinable;
    let (p, q) = (&mut into.parking, &more.parking);
    p.parked += q.parked;
    p.released += q.released;
    p.expired += q.expired;
    p.overflow += q.overflow;
    // Held records of a dead life are gone with it: lost.
    p.expired += q.held;
    let (t, u) = (&mut into.takeover, &more.takeover);
    t.taken_over += u.taken_over;
    t.lined_up += u.lined_up;
    t.records += u.records;
    t.lost += u.lost + u.held;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("slowrank-resume-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn mark(agent: &str, seq: u64) -> Mark {
        Mark {
            agent_id: agent.into(),
            host: "h".into(),
            seq,
            ringbuf_drops: 0,
            spool_drops: seq / 10,
        }
    }

    #[test]
    fn journal_keeps_the_highest_mark_and_skips_a_torn_line() {
        let d = dir("journal");
        assert!(load(&d).unwrap().marks.is_empty());
        let t = chrono::Utc::now();
        let mut j = Journal::open(&d, &Earlier::default(), t).unwrap();
        j.append(&[mark("a", 1), mark("b", 1)]).unwrap();
        j.append(&[mark("a", 7), mark("a", 3)]).unwrap();
        drop(j);
        // A crash in the middle of an append.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(d.join(MARKS_FILE))
            .unwrap();
        f.write_all(b"{\"agent_id\":\"a\",\"ho").unwrap();
        let e = load(&d).unwrap();
        assert_eq!(e.marks["a"], mark("a", 7));
        assert_eq!(e.marks["b"], mark("b", 1));
        assert_eq!(e.bad_lines, 1);
        assert_eq!(e.lives, vec![t]);
        // Compacted: one line per life and per agent, and appendable again.
        let mut j = Journal::open(&d, &e, chrono::Utc::now()).unwrap();
        j.append(&[mark("b", 2)]).unwrap();
        let text = fs::read_to_string(d.join(MARKS_FILE)).unwrap();
        assert_eq!(text.lines().count(), 5, "{text}");
        let p = crate::graph::iteration::Period {
            comm_id: 9,
            comm_nranks: 8,
            instances_per_iteration: 4,
            phase: 1,
            method: crate::graph::iteration::Method::SyncMarker,
        };
        j.note_period(p).unwrap();
        j.note_period(p).unwrap();
        let again = load(&d).unwrap();
        assert_eq!(again.marks["b"].seq, 2);
        assert_eq!(again.lives.len(), 2);
        assert_eq!(again.period, Some(p));
        let text = fs::read_to_string(d.join(MARKS_FILE)).unwrap();
        assert_eq!(text.matches("iteration_period").count(), 1, "{text}");
        let _ = fs::remove_dir_all(&d);
    }

    /// Clock models kept atomically and read back; used only on the same
    /// boot; an unreadable file costs the head start, not the resume.
    #[test]
    fn clock_models_round_trip_on_the_same_boot_only() {
        let d = dir("clocks");
        assert!(load(&d).unwrap().clocks.is_none());
        let seed = ClockSeed {
            ref_agent_ns: 5_000_000_000,
            offset_ns: -1_234_567.5,
            drift: 3e-5,
            error_bound_ns: 4_000.0,
            first_agent_ns: 1_000_000_000,
            extrapolation_rate: 2e-6,
            samples_used: 4,
            estimated_coord_ns: 4_998_765_432,
        };
        let file = ClockFile {
            boot_id: "boot-a".into(),
            hosts: [("host-0".to_string(), seed)].into_iter().collect(),
        };
        save_clocks(&d, &file).unwrap();
        assert!(!d.join(format!(".{CLOCKS_FILE}.tmp")).exists());
        let e = load(&d).unwrap();
        assert_eq!(e.clocks.as_ref(), Some(&file));
        assert_eq!(clock_seeds(&e, Some("boot-a"))["host-0"], seed);
        assert!(clock_seeds(&e, Some("boot-b")).is_empty());
        assert!(clock_seeds(&e, None).is_empty());
        fs::write(d.join(CLOCKS_FILE), b"{\"boot_id\":").unwrap();
        let e = load(&d).unwrap();
        assert!(e.clocks.is_none());
        let _ = fs::remove_dir_all(&d);
    }

    /// The report of a synthetic 8-rank job, `iterations` long, with rank
    /// 5 compute-slow from iteration 10 when `fault`.
    fn life(fault: bool, iterations: u64) -> Report {
        crate::synthjob::analyzed(fault.then_some(10), iterations).report()
    }

    fn earlier(prev: Report) -> Earlier {
        Earlier {
            report: Some(prev),
            ..Default::default()
        }
    }

    #[test]
    fn a_verdict_raised_in_both_lives_is_reported_once() {
        let first = life(true, 40);
        assert_eq!(first.verdicts.len(), 1, "{:?}", first.verdicts);
        let mut second = life(true, 40);
        let t = chrono::Utc::now();
        earlier(first.clone()).merge_into(&mut second, t);
        assert_eq!(second.verdicts.len(), 1, "{:?}", second.verdicts);
        let v = &second.verdicts[0];
        assert_eq!((v.rank, v.id, v.active), (5, first.verdicts[0].id, true));
        assert_eq!(v.first_seen, first.verdicts[0].first_seen);
        assert!(v
            .evidence
            .iter()
            .any(|e| e.contains("before the coordinator restarted")));
        let info = second.resumed.as_ref().expect("resumed");
        assert_eq!((info.lives, info.verdicts_carried), (2, 1));
        assert_eq!(info.earlier_ingest.batches, first.ingest.counters.batches);
        // A third life reads the second's report: still once, three lives.
        let mut third = life(true, 40);
        earlier(second.clone()).merge_into(&mut third, t);
        assert_eq!(third.verdicts.len(), 1);
        assert_eq!(third.resumed.as_ref().unwrap().lives, 3);
        assert_eq!(
            third.resumed.as_ref().unwrap().earlier_ingest.batches,
            first.ingest.counters.batches + second.ingest.counters.batches
        );
    }

    /// An earlier life's transient stays a transient, once, and this
    /// life's verdicts are numbered after it.
    #[test]
    fn an_earlier_lifes_transient_is_kept_apart() {
        let mut first = life(false, 40);
        let mut t = life(true, 40).verdicts[0].clone();
        t.id = 7;
        t.active = false;
        first.transients = vec![t.clone()];
        let mut second = life(true, 40);
        earlier(first).merge_into(&mut second, chrono::Utc::now());
        assert_eq!(second.transients, vec![t]);
        assert_eq!(second.verdicts.len(), 1);
        assert!(second.verdicts[0].id > 7, "{}", second.verdicts[0].id);
    }

    #[test]
    fn a_verdict_of_an_earlier_life_is_kept_and_closed_once_not_seen_again() {
        let first = life(true, 40);
        let t = chrono::Utc::now();
        // Too early to tell: kept as it was.
        let mut short = life(false, 20);
        earlier(first.clone()).merge_into(&mut short, t);
        assert_eq!(short.verdicts.len(), 1);
        assert!(short.verdicts[0].active);
        // Long enough: shown closed, with why.
        let mut long = life(false, RECONFIRM_ITERATIONS + 5);
        earlier(first.clone()).merge_into(&mut long, t);
        assert_eq!(long.verdicts.len(), 1);
        let v = &long.verdicts[0];
        assert!(!v.active && v.rank == 5);
        assert!(v.evidence.iter().any(|e| e.contains("not seen again")));
        // Survives a JSON round trip (what the next life reads).
        let text = crate::report::render_json(&long).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(
            serde_json::to_value(&back.verdicts).unwrap(),
            serde_json::to_value(&long.verdicts).unwrap()
        );
        assert_eq!(back.resumed, long.resumed);
    }

    #[test]
    fn an_unreadable_report_is_moved_aside_not_lost() {
        let d = dir("bad-report");
        fs::write(
            d.join(outputs::REPORT_JSON),
            "{\"schema\": \"slowrank.report/v1\"",
        )
        .unwrap();
        let e = load(&d).unwrap();
        assert!(e.report.is_none());
        let aside = e.moved_aside.expect("moved aside");
        assert!(aside.is_file());
        assert!(!d.join(outputs::REPORT_JSON).exists());
        let _ = fs::remove_dir_all(&d);
    }
}
