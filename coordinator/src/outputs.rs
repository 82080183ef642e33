//! The files `slowrank serve --out DIR` keeps current: `report.json`,
//! `report.txt` and `trace.json`. Each is written to a temporary file in the
//! same directory and renamed over the old one, so a reader (or a crash)
//! never sees half a report.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use crate::report::{render_human, render_json, Report};

pub const REPORT_JSON: &str = "report.json";
pub const REPORT_TXT: &str = "report.txt";
pub const TRACE_JSON: &str = "trace.json";

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
    let mut f = fs::File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&tmp, &path).map_err(io)
}

/// Writes the report (JSON and human) and the trace into `dir`.
pub fn write_all(
    dir: &Path,
    report: &Report,
    trace: &serde_json::Value,
) -> Result<(), OutputError> {
    write_atomic(dir, REPORT_JSON, render_json(report)?.as_bytes())?;
    write_atomic(dir, REPORT_TXT, render_human(report).as_bytes())?;
    write_atomic(dir, TRACE_JSON, serde_json::to_string(trace)?.as_bytes())
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
}
