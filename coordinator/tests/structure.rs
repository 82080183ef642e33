//! The coordinator's layout rules (issue 22), checked on its source: no
//! file over 800 lines, the robust-z constant in one file, and no two
//! files that import each other through a loop (data flows one way, from
//! the wire to the report).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use petgraph::{algo::tarjan_scc, graph::DiGraph};

const MAX_LINES: usize = 800;

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("source folder") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out.sort();
    assert!(out.len() > 20, "coordinator sources not found");
    out
}

/// `src/join/realign/mod.rs` → `join::realign`; `src/lib.rs` → ``.
fn module_of(path: &Path) -> String {
    let rel = path
        .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .expect("under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without its comments and its inline test module.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_file_is_over_800_lines() {
    let long: Vec<String> = sources()
        .iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(p).expect("read").lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

#[test]
fn the_robust_z_constant_lives_in_one_file() {
    let with: Vec<String> = sources()
        .iter()
        .filter(|p| std::fs::read_to_string(p).expect("read").contains("1.4826"))
        .map(|p| module_of(p))
        .collect();
    assert_eq!(
        with,
        vec!["robust".to_owned()],
        "MAD × 1.4826 outside robust.rs"
    );
}

#[test]
fn no_files_import_each_other_in_a_loop() {
    let files = sources();
    let modules: BTreeMap<String, usize> = files
        .iter()
        .enumerate()
        .map(|(i, p)| (module_of(p), i))
        .collect();
    let mut g: DiGraph<usize, ()> = DiGraph::new();
    let nodes: Vec<_> = (0..files.len()).map(|i| g.add_node(i)).collect();
    let path_re = |s: &str| -> BTreeSet<String> {
        // Every `crate::a::b::c` written in the code.
        let mut out = BTreeSet::new();
        for (i, _) in s.match_indices("crate::") {
            let rest = &s[i + 7..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            out.insert(rest[..end].trim_end_matches(':').to_owned());
        }
        out
    };
    for (i, p) in files.iter().enumerate() {
        let me = module_of(p);
        if me.ends_with("tests") {
            continue;
        }
        let text = code(&std::fs::read_to_string(p).expect("read"));
        for path in path_re(&text) {
            // The longest module the path names.
            let segs: Vec<&str> = path.split("::").collect();
            let target = (1..=segs.len())
                .rev()
                .map(|k| segs[..k].join("::"))
                .find(|m| modules.contains_key(m));
            let Some(t) = target else { continue };
            // A folder's files and its `mod.rs` belong together.
            let related =
                t == me || me.starts_with(&format!("{t}::")) || t.starts_with(&format!("{me}::"));
            if !related {
                g.update_edge(nodes[i], nodes[modules[&t]], ());
            }
        }
    }
    let circles: Vec<Vec<String>> = tarjan_scc(&g)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|n| module_of(&files[g[*n]])).collect())
        .collect();
    assert!(
        circles.is_empty(),
        "modules importing each other in a loop: {circles:?}"
    );
}
