//! The launcher's progress line: what a watcher can use — the job's
//! iteration, its median step, and the coordinator's open verdicts (read
//! from the `report.json` it keeps current in the run directory).
//!
//! It used to name "the slowest rank": the rank with the fewest finished
//! iterations, which in a synchronous job is a tie broken by rank number —
//! "(slowest rank 0)" on every line while rank 2 was the slow one.

/// What the coordinator's `report.json` says is open now, as short
/// phrases ("rank 2 host-slow"). `None` when the text is not a report
/// (not written yet, or half a file from another writer).
pub fn open_verdicts(report_json: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(report_json).ok()?;
    let verdicts = v.get("verdicts")?.as_array()?;
    let mut out: Vec<String> = verdicts
        .iter()
        .filter(|x| x.get("active").and_then(|a| a.as_bool()) == Some(true))
        .map(|x| {
            let kind = x.get("kind").and_then(|k| k.as_str()).unwrap_or("?");
            let link = x
                .get("link")
                .and_then(|l| l.get("ranks"))
                .and_then(|r| r.as_array())
                .filter(|r| r.len() == 2);
            match link {
                Some(r) => format!("link {}↔{} {kind}-slow", r[0], r[1]),
                None => format!(
                    "rank {} {kind}-slow",
                    x.get("rank").map_or("?".into(), |r| r.to_string())
                ),
            }
        })
        .collect();
    let hangs = v
        .get("hangs")
        .and_then(|h| h.as_array())
        .map_or(0, |h| h.len());
    if hangs > 0 {
        out.push(format!("{hangs} hang(s)"));
    }
    Some(out)
}

/// One progress line. `open` is `None` when there is no coordinator report
/// to read (job-only runs, or before its first write).
pub fn line(
    name: &str,
    iteration: u64,
    iterations: u64,
    median_step_ms: Option<f64>,
    elapsed_s: f64,
    open: Option<&[String]>,
) -> String {
    let step = median_step_ms.map_or("median step —".to_owned(), |m| {
        format!("median step {m:.1} ms")
    });
    let verdicts = match open {
        None => String::new(),
        Some([]) => "; coordinator: no open verdict".to_owned(),
        Some(v) => format!("; coordinator: {}", v.join(", ")),
    };
    format!("{name}: iteration {iteration}/{iterations}, {step}, {elapsed_s:.1} s{verdicts}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_open_verdicts_not_a_tie_broken_by_rank_number() {
        let report = r#"{"verdicts":[
            {"rank":2,"kind":"host","active":true,"link":null},
            {"rank":5,"kind":"compute","active":false,"link":null},
            {"rank":1,"kind":"communication","active":true,"link":{"ranks":[1,4]}}],
            "hangs":[]}"#;
        let open = open_verdicts(report).unwrap();
        assert_eq!(
            open,
            vec!["rank 2 host-slow", "link 1↔4 communication-slow"]
        );
        let l = line("dp8", 140, 200, Some(41.25), 12.34, Some(&open));
        assert_eq!(
            l,
            "dp8: iteration 140/200, median step 41.2 ms, 12.3 s; coordinator: rank 2 host-slow, link 1↔4 communication-slow"
        );
        assert!(!l.contains("slowest"));
    }

    #[test]
    fn no_report_or_a_torn_one_says_nothing_about_verdicts() {
        assert_eq!(open_verdicts("{\"verdicts\": [ {\"rank\""), None);
        assert_eq!(
            line("x", 1, 2, None, 0.5, None),
            "x: iteration 1/2, median step —, 0.5 s"
        );
        assert_eq!(
            line("x", 1, 2, Some(3.0), 0.5, Some(&[])),
            "x: iteration 1/2, median step 3.0 ms, 0.5 s; coordinator: no open verdict"
        );
        let hang = open_verdicts(r#"{"verdicts":[],"hangs":[{"op":"all_reduce"}]}"#).unwrap();
        assert_eq!(hang, vec!["1 hang(s)"]);
    }
}
