//! `deploy/grafana/slowrank.json` and `deploy/prometheus/*.yml` against what
//! `/metrics` really exports: every metric a panel or an alert queries is a
//! family of the page, counters are only read through `rate`/`increase`,
//! and the dashboard is well-formed (unique panel ids, a grid that fits
//! and does not overlap, one Prometheus datasource variable).

use std::{collections::HashMap, path::PathBuf};

use slowrank_coordinator::{
    net::ingest::IngestStats, report::alert::HookStats, report::metrics_text::serve_exposition,
    report::prom::Type, Analyzer, AnalyzerConfig,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_owned()
}

/// Family name → type, from a real page.
fn families() -> HashMap<String, Type> {
    let a = Analyzer::new(AnalyzerConfig::default());
    let e = serve_exposition(
        &a.metrics(),
        &IngestStats::default(),
        &HookStats::default(),
        0,
        &slowrank_coordinator::report::metrics_text::Guards {
            stacks: &slowrank_coordinator::verdict::stackstore::StackStore::default(),
            http: &slowrank_coordinator::net::metrics_http::HttpStats::default(),
        },
    );
    e.families()
        .iter()
        .map(|f| (f.name.clone(), f.kind))
        .collect()
}

/// `slowrank_…` identifiers in a PromQL expression, each with whether it
/// sits directly inside `rate(` or `increase(`.
fn metric_refs(expr: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = expr[i..].find("slowrank_") {
        let start = i + p;
        let end = start
            + expr[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(expr.len() - start);
        let before = expr[..start].trim_end();
        let in_rate = before.ends_with("rate(") || before.ends_with("increase(");
        out.push((expr[start..end].to_owned(), in_rate));
        i = end;
    }
    out
}

fn check_exprs(what: &str, exprs: &[String], fams: &HashMap<String, Type>) {
    assert!(!exprs.is_empty(), "{what}: no expressions");
    for e in exprs {
        let refs = metric_refs(e);
        assert!(!refs.is_empty(), "{what}: `{e}` queries no slowrank metric");
        for (name, in_rate) in refs {
            let kind = fams.get(&name).unwrap_or_else(|| {
                panic!("{what}: `{e}` queries {name}, which /metrics does not export")
            });
            match kind {
                Type::Counter => assert!(
                    in_rate,
                    "{what}: counter {name} read raw in `{e}` (use rate or increase)"
                ),
                Type::Gauge => assert!(!in_rate, "{what}: rate() of gauge {name} in `{e}`"),
            }
        }
    }
}

#[test]
fn grafana_dashboard_queries_only_exported_metrics_and_is_well_formed() {
    let fams = families();
    let path = repo().join("deploy/grafana/slowrank.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/slowrank.json");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 30));
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "a Prometheus datasource variable named datasource"
    );
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = std::collections::HashSet::new();
    let mut cells = std::collections::HashSet::new();
    let mut titles = Vec::new();
    for p in panels {
        let title = p["title"].as_str().expect("panel title").to_owned();
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "{title}: duplicate id"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().unwrap(),
            g["y"].as_u64().unwrap(),
            g["w"].as_u64().unwrap(),
            g["h"].as_u64().unwrap(),
        );
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{title} overlaps another panel at {cx},{cy}"
                );
            }
        }
        let exprs: Vec<String> = p["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| t["expr"].as_str().expect("target expr").to_owned())
            .collect();
        check_exprs(&title, &exprs, &fams);
        titles.push(title.to_lowercase());
    }
    // What the dashboard is for (issue 24).
    for want in [
        "open verdicts",
        "lost gpu-seconds",
        "step time",
        "clock error",
        "ingest drops",
        "agent",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(want)),
            "no panel for {want}: {titles:?}"
        );
    }
}

#[test]
fn alert_rules_query_only_exported_metrics() {
    let fams = families();
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/slowrank-alerts.yml"))
        .expect("deploy/prometheus/slowrank-alerts.yml");
    let exprs: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().to_owned())
        .collect();
    assert_eq!(exprs.len(), 3, "{exprs:?}");
    check_exprs("alert rules", &exprs, &fams);
}

#[test]
fn the_checker_catches_unknown_and_misused_metrics() {
    let fams = families();
    let bad = |e: &str| {
        let e = e.to_owned();
        let f = fams.clone();
        std::panic::catch_unwind(move || check_exprs("t", &[e], &f)).is_err()
    };
    assert!(bad("slowrank_no_such_metric"));
    assert!(bad("slowrank_ingest_total"));
    assert!(bad("rate(slowrank_step_seconds[1m])"));
    assert!(!bad("rate(slowrank_ingest_total[1m])"));
    assert!(!bad("max by (rank) (slowrank_verdict_active) == 1"));
}
