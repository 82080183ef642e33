//! The Prometheus text exposition format (version 0.0.4), built so that
//! each metric family appears once, with one `# HELP` and one `# TYPE`,
//! whichever part of the coordinator contributes samples to it.
//!
//! Several sources feed `/metrics` (the analyzer, the QUIC ingest, the
//! hooks); when two of them wrote the same family each with its own HELP
//! line, `promtool check metrics` rejected the page ("second HELP line for
//! metric name"). Here a family is declared once by name and later
//! contributions add samples to it.

use std::fmt::Write;

/// The metric type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// Only goes up (resets when the coordinator restarts); the name ends
    /// in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
        }
    }
}

/// One metric family: a name, its help text, its type and its samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: String,
    pub help: String,
    pub kind: Type,
    /// Rendered label set (`{a="x",b="y"}` or empty) → value, in insertion
    /// order.
    samples: Vec<(String, f64)>,
    /// Label set → its place in `samples`. A linear search for each new
    /// sample made a page of 16,384 ranks' gauges quadratic: a fifth of
    /// the coordinator's CPU went to comparing label strings.
    index: foldhash::HashMap<String, usize>,
}

impl Family {
    /// Adds a sample. A sample with the same labels as an earlier one is
    /// merged: counters add up (two sources counting the same thing, e.g.
    /// batches refused by the transport and by the analyzer for one
    /// reason), a gauge keeps the latest value.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let key = render_labels(labels);
        match self.index.get(&key) {
            Some(&i) if self.kind == Type::Counter => self.samples[i].1 += value,
            Some(&i) => self.samples[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.samples.len());
                self.samples.push((key, value));
            }
        }
        self
    }

    pub fn samples(&self) -> impl Iterator<Item = (&str, f64)> {
        self.samples.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

/// A whole `/metrics` page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// The family `name`, declared now if it is new. Declaring it again
    /// returns the existing family (its first help text stays): that is
    /// what keeps one HELP per family. A second declaration with another
    /// type is a programming error, caught in debug builds and tests.
    pub fn family(&mut self, name: &str, kind: Type, help: &str) -> &mut Family {
        debug_assert!(valid_name(name), "invalid metric name {name:?}");
        debug_assert!(
            kind != Type::Counter || name.ends_with("_total"),
            "counter {name} must end in _total"
        );
        debug_assert!(
            kind == Type::Counter || !name.ends_with("_total"),
            "gauge {name} must not end in _total"
        );
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => {
                debug_assert_eq!(self.families[i].kind, kind, "{name} declared twice");
                i
            }
            None => {
                self.families.push(Family {
                    name: name.to_owned(),
                    help: help.to_owned(),
                    kind,
                    samples: Vec::new(),
                    index: Default::default(),
                });
                self.families.len() - 1
            }
        };
        &mut self.families[i]
    }

    /// Shorthand: a family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Type, help: &str, value: f64) {
        self.family(name, kind, help).sample(&[], value);
    }

    pub fn families(&self) -> &[Family] {
        &self.families
    }

    pub fn get(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// The text format. A family without samples still gets its HELP and
    /// TYPE lines, so a dashboard query finds the name (with no data)
    /// before the first verdict.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for f in &self.families {
            let _ = writeln!(s, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(s, "# TYPE {} {}", f.name, f.kind.as_str());
            for (labels, v) in &f.samples {
                let _ = writeln!(s, "{}{} {}", f.name, labels, fmt_value(*v));
            }
        }
        s
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, the metric name grammar.
fn valid_name(name: &str) -> bool {
    let mut c = name.chars();
    c.next()
        .is_some_and(|x| x.is_ascii_alphabetic() || x == '_' || x == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

/// Label values come from agents (host names): escaped, never trusted to
/// be well-formed.
fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut s = String::from("{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k);
        s.push_str("=\"");
        for ch in v.chars() {
            match ch {
                '\\' => s.push_str("\\\\"),
                '"' => s.push_str("\\\""),
                '\n' => s.push_str("\\n"),
                c => s.push(c),
            }
        }
        s.push('"');
    }
    s.push('}');
    s
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Go's float syntax as Prometheus parses it (`+Inf`, `-Inf`, `NaN`).
fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_help_per_family_and_counters_merge() {
        let mut e = Exposition::new();
        e.family("x_rejected_total", Type::Counter, "first help")
            .sample(&[("reason", "a")], 1.0);
        e.family("x_rejected_total", Type::Counter, "second help")
            .sample(&[("reason", "a")], 2.0)
            .sample(&[("reason", "b")], 5.0);
        let text = e.render();
        assert_eq!(text.matches("# HELP x_rejected_total").count(), 1, "{text}");
        assert!(text.contains("# HELP x_rejected_total first help\n"));
        assert!(
            text.contains("x_rejected_total{reason=\"a\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("x_rejected_total{reason=\"b\"} 5\n"),
            "{text}"
        );
    }

    #[test]
    fn hostile_label_values_are_escaped_and_odd_values_spelled_as_go_does() {
        let mut e = Exposition::new();
        e.family("x_seconds", Type::Gauge, "h\nelp")
            .sample(&[("host", "a\"b\\c\nd")], f64::INFINITY)
            .sample(&[("host", "n")], f64::NAN);
        let text = e.render();
        assert!(text.contains("# HELP x_seconds h\\nelp\n"), "{text}");
        assert!(
            text.contains(r#"x_seconds{host="a\"b\\c\nd"} +Inf"#),
            "{text}"
        );
        assert!(text.contains("x_seconds{host=\"n\"} NaN"), "{text}");
        // Every line is a comment or one sample: nothing a host name can split.
        assert_eq!(text.lines().count(), 4, "{text}");
    }

    #[test]
    fn gauges_keep_the_latest_value() {
        let mut e = Exposition::new();
        e.family("g", Type::Gauge, "g")
            .sample(&[], 1.0)
            .sample(&[], 4.0);
        assert_eq!(e.render(), "# HELP g g\n# TYPE g gauge\ng 4\n");
    }

    #[test]
    fn names_follow_the_grammar() {
        assert!(valid_name("slowrank_step_seconds"));
        assert!(valid_name("a:b_c1"));
        assert!(!valid_name("1abc"));
        assert!(!valid_name("a-b"));
        assert!(!valid_name(""));
    }
}
