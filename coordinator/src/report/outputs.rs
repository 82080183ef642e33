//! The files `slowrank serve --out DIR` keeps current: `report.json`,
//! `report.txt`, `trace.json`, `timeline.json` and `report.html`. Each is written to a temporary file in the
//! same directory and renamed over the old one, so a reader (or a crash)
//! never sees half a report.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use crate::report::timeline::Timeline;
use crate::report::{render_human, render_json, Report};

pub const REPORT_JSON: &str = "report.json";
pub const REPORT_TXT: &str = "report.txt";
pub const TRACE_JSON: &str = "trace.json";
pub const TIMELINE_JSON: &str = "timeline.json";
pub const REPORT_HTML: &str = "report.html";

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot write {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serialize the report")]
    Json(#[from] serde_json::Error),
}

/// Writes `bytes` to `dir/name` atomically (tmp + fsync + rename).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let io = |source| OutputError::Io {
        path: path.clone(),
        source,
    };
    fs::create_dir_all(dir).map_err(io)?;
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        // A half-written temp file on a full disk would keep it full, and
        // the next write (of a smaller file first) would fail too.
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// Writes the report (JSON and human) and the trace into `dir`: the report
/// first, so a disk with room for only the small files keeps it current.
pub fn write_all(
    dir: &Path,
    report: &Report,
    trace: &serde_json::Value,
) -> Result<(), OutputError> {
    write_atomic(dir, REPORT_JSON, render_json(report)?.as_bytes())?;
    write_atomic(dir, REPORT_TXT, render_human(report).as_bytes())?;
    write_atomic(dir, TRACE_JSON, serde_json::to_string(trace)?.as_bytes())
}

/// The diff flame graphs' SVG text for the page: a CPU diff's parts
/// (training thread on-CPU, off-CPU, all threads), else its one diff. A
/// graph is looked for where the report says it was written, then under
/// `dir/flame/` (a run directory copied elsewhere); one that cannot be read
/// is left out of the page (its verdict still says where it was).
pub fn load_flames(dir: &Path, report: &Report) -> Vec<crate::report::html::FlameSvg> {
    let read = |path: &str| {
        let p = PathBuf::from(path);
        let moved = p.file_name().map(|n| dir.join("flame").join(n));
        fs::read_to_string(&p)
            .ok()
            .or_else(|| moved.and_then(|m| fs::read_to_string(m).ok()))
    };
    let mut out = Vec::new();
    for v in &report.verdicts {
        let Some(f) = &v.flamegraph else { continue };
        let graphs: Vec<(String, &str)> = if f.views.is_empty() {
            vec![(format!("{} view", f.view), f.diff_svg.as_str())]
        } else {
            f.views
                .iter()
                .map(|p| (p.title.clone(), p.diff_svg.as_str()))
                .collect()
        };
        for (title, path) in graphs {
            if let Some(svg) = read(path) {
                out.push(crate::report::html::FlameSvg {
                    verdict: v.id,
                    title,
                    svg,
                });
            }
        }
    }
    out
}

/// Writes `timeline.json` (the page's series, for `slowrank report
/// --html` later) and `report.html` into `dir`; returns the page.
pub fn write_timeline_and_page(
    dir: &Path,
    report: &Report,
    timeline: &Timeline,
) -> Result<String, OutputError> {
    let mut json = serde_json::to_string(timeline)?;
    // Bounded whatever agents announce; the page shows the same series.
    let cut;
    let timeline = if json.len() > crate::report::timeline::MAX_TIMELINE_BYTES {
        let mut t = timeline.clone();
        t.bound_size(crate::report::timeline::MAX_TIMELINE_BYTES);
        json = serde_json::to_string(&t)?;
        cut = t;
        &cut
    } else {
        timeline
    };
    write_atomic(dir, TIMELINE_JSON, json.as_bytes())?;
    write_page(dir, report, timeline)
}

/// Writes `report.html` into `dir`; returns the page.
pub fn write_page(dir: &Path, report: &Report, timeline: &Timeline) -> Result<String, OutputError> {
    let html = crate::report::html::render(&crate::report::html::Page {
        report,
        timeline,
        flames: load_flames(dir, report),
        refresh_s: None,
    });
    write_atomic(dir, REPORT_HTML, html.as_bytes())?;
    Ok(html)
}

/// Reads `dir/timeline.json`; a directory without one (written before the
/// page existed) gives an empty series, a malformed one an error.
pub fn read_timeline(dir: &Path) -> Result<Timeline, ReadError> {
    let file = dir.join(TIMELINE_JSON);
    let text = match fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Timeline::default()),
        Err(source) => return Err(ReadError::Io { path: file, source }),
    };
    let t: Timeline = serde_json::from_str(&text).map_err(|source| ReadError::Json {
        path: file.clone(),
        source,
    })?;
    if t.schema != crate::report::timeline::SCHEMA {
        return Err(ReadError::TimelineSchema {
            path: file,
            found: t.schema,
        });
    }
    Ok(t)
}

/// Reads `dir/report.json` (or a report file given directly) back.
pub fn read_report(path: &Path) -> Result<Report, ReadError> {
    let file = if path.is_dir() {
        path.join(REPORT_JSON)
    } else {
        path.to_path_buf()
    };
    let text = fs::read_to_string(&file).map_err(|source| ReadError::Io {
        path: file.clone(),
        source,
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| ReadError::Json {
        path: file.clone(),
        source,
    })?;
    match v.get("schema").and_then(|s| s.as_str()) {
        Some(crate::report::SCHEMA) => {}
        other => {
            return Err(ReadError::Schema {
                path: file,
                found: other.unwrap_or("none").to_owned(),
            })
        }
    }
    serde_json::from_value(v).map_err(|source| ReadError::Json { path: file, source })
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid slowrank report")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{path} has schema {found:?}; this build reads {}",
        crate::report::SCHEMA
    )]
    Schema { path: PathBuf, found: String },
    #[error(
        "{path} has schema {found:?}; this build reads {}",
        crate::report::timeline::SCHEMA
    )]
    TimelineSchema { path: PathBuf, found: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Analyzer;

    fn analyzer_with_verdict() -> Analyzer {
        crate::synthjob::analyzed(Some(10), 40)
    }

    #[test]
    fn files_are_written_and_read_back_unchanged() {
        let dir = std::env::temp_dir().join(format!("slowrank-outputs-{}", std::process::id()));
        let a = analyzer_with_verdict();
        let r = a.report();
        assert_eq!(r.verdicts.len(), 1, "{:?}", r.verdicts);
        write_all(&dir, &r, &a.trace_json()).unwrap();
        for f in [REPORT_JSON, REPORT_TXT, TRACE_JSON] {
            assert!(dir.join(f).is_file(), "{f}");
            assert!(
                !dir.join(format!(".{f}.tmp")).exists(),
                "{f} temp left behind"
            );
        }
        let back = read_report(&dir).unwrap();
        // Same JSON after a round trip, and the same table.
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&r).unwrap()
        );
        assert_eq!(render_human(&back), render_human(&r));
        assert!(render_human(&back).contains("rank 5 on node-1 is compute-slow"));
        let trace: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(dir.join(TRACE_JSON)).unwrap()).unwrap();
        assert!(trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty()));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn unreadable_or_foreign_reports_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("slowrank-outputs-bad-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert!(matches!(read_report(&dir), Err(ReadError::Io { .. })));
        fs::write(
            dir.join(REPORT_JSON),
            "{\"schema\": \"slowrank.report/v9\"}",
        )
        .unwrap();
        assert!(matches!(read_report(&dir), Err(ReadError::Schema { .. })));
        fs::write(dir.join(REPORT_JSON), "{\"schema\": \"slowrank.report/v1\"").unwrap();
        assert!(matches!(read_report(&dir), Err(ReadError::Json { .. })));
        let _ = fs::remove_dir_all(&dir);
    }
}
