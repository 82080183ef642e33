//! Every threshold and window the analyzer uses, in one place: the
//! [`AnalyzerConfig`] tree (clock, join, iteration, stats, links,
//! lifecycle, sequential test, limits). Each field is documented where its
//! stage defines it, with why it has its default. A run takes the
//! defaults, then a TOML file (`slowrank serve|analyze --thresholds FILE`)
//! that names only what it changes, then the command line's own flags
//! (`--warmup-iterations`). `slowrank thresholds` prints the defaults in
//! that file's format, so a file starts as a copy of them.
//!
//! An unknown key is an error, not ignored: a misspelled threshold that
//! silently kept its default would be worse than none.

use std::path::{Path, PathBuf};

use crate::analyzer::AnalyzerConfig;

#[derive(Debug, thiserror::Error)]
pub enum ThresholdsError {
    #[error("cannot read the thresholds file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("thresholds file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot print the default thresholds: {0}")]
    Print(String),
}

/// The defaults with the file's values over them.
pub fn load(path: &Path) -> Result<AnalyzerConfig, ThresholdsError> {
    let text = std::fs::read_to_string(path).map_err(|source| ThresholdsError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|message| ThresholdsError::Parse {
        path: path.to_owned(),
        message,
    })
}

/// Parses a thresholds file's text (keys left out keep their defaults).
pub fn parse(text: &str) -> Result<AnalyzerConfig, String> {
    toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())
}

/// The defaults as a thresholds file.
pub fn defaults_toml() -> Result<String, ThresholdsError> {
    toml::to_string(&AnalyzerConfig::default()).map_err(|e| ThresholdsError::Print(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_printed_defaults_read_back_as_the_defaults() {
        let text = defaults_toml().unwrap();
        let back = parse(&text).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(AnalyzerConfig::default()).unwrap()
        );
    }

    #[test]
    fn a_file_changes_only_what_it_names() {
        let c = parse("[lifecycle]\nwarmup_iterations = 5\n").unwrap();
        assert_eq!(c.lifecycle.warmup_iterations, 5);
        let d = AnalyzerConfig::default();
        assert_eq!(c.lifecycle.close_after, d.lifecycle.close_after);
        assert_eq!(c.stats.min_robust_z, d.stats.min_robust_z);
    }

    /// docs/thresholds.md (scripts/thresholds-doc.py) lists every key.
    #[test]
    fn the_docs_list_every_key() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/thresholds.md"
        ))
        .unwrap();
        let all: toml::Table = toml::from_str(&defaults_toml().unwrap()).unwrap();
        let mut keys = Vec::new();
        for (k, v) in &all {
            match v.as_table() {
                Some(t) => keys.extend(t.keys().cloned()),
                None => keys.push(k.clone()),
            }
        }
        for k in keys {
            assert!(
                doc.contains(&format!("| `{k}` |")),
                "docs/thresholds.md does not list `{k}`: run scripts/thresholds-doc.py"
            );
        }
    }

    #[test]
    fn a_misspelled_key_is_an_error_that_names_it() {
        let e = parse("[lifecycle]\nwarmup_iteration = 5\n").unwrap_err();
        assert!(e.contains("warmup_iteration"), "{e}");
        let e = parse("[lifecycel]\n").unwrap_err();
        assert!(e.contains("lifecycel"), "{e}");
    }
}
