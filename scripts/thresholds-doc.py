#!/usr/bin/env python3
"""Writes docs/thresholds.md: every key `slowrank thresholds` prints, with its
default and the doc comment its stage gives it (the one place each is
explained). Run after a build:  python3 scripts/thresholds-doc.py"""
import re, subprocess, sys, tomllib, os

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bin_ = os.environ.get("SLOWRANK_BIN", os.path.join(root, "target/debug/slowrank"))
defaults = tomllib.loads(subprocess.run([bin_, "thresholds"], check=True, capture_output=True, text=True).stdout)

# section -> (struct, file)
SECTIONS = {
    "": ("AnalyzerConfig", "coordinator/src/analyzer/mod.rs"),
    "clock": ("ClockConfig", "coordinator/src/clock/mod.rs"),
    "join": ("JoinConfig", "coordinator/src/join/mod.rs"),
    "iteration": ("IterationConfig", "coordinator/src/graph/iteration/mod.rs"),
    "stats": ("StatsConfig", "coordinator/src/classify/stats/mod.rs"),
    "links": ("LinkConfig", "coordinator/src/classify/links/mod.rs"),
    "lifecycle": ("LifecycleConfig", "coordinator/src/verdict/mod.rs"),
    "sequential": ("SequentialConfig", "coordinator/src/classify/sequential.rs"),
    "structure": ("StructureConfig", "coordinator/src/graph/structure/mod.rs"),
    "pace": ("PaceConfig", "coordinator/src/classify/pace.rs"),
    "stretches": ("StretchConfig", "coordinator/src/classify/stretches.rs"),
    "victims": ("VictimsConfig", "coordinator/src/verdict/victims.rs"),
    "limits": ("Limits", "coordinator/src/analyzer/mod.rs"),
}

def fields(struct, path):
    src = open(os.path.join(root, path)).read().split("\n")
    start = next(i for i, l in enumerate(src) if re.match(r"pub struct %s \{" % struct, l))
    out, doc = [], []
    for l in src[start + 1:]:
        if l.startswith("}"):
            break
        m = re.match(r"\s+/// ?(.*)", l)
        if m:
            doc.append(m.group(1))
            continue
        m = re.match(r"\s+pub (\w+):", l)
        if m:
            out.append((m.group(1), " ".join(doc).strip()))
        doc = []
    return out

def fmt(v):
    if isinstance(v, float):
        return repr(v)
    return str(v).lower() if isinstance(v, bool) else str(v)

lines = ["# Thresholds", "",
         "Every threshold and window the analyzer uses, with its default and why "
         "(the doc comment of the field, where its stage defines it). "
         "`slowrank thresholds` prints them as a TOML file; `slowrank serve "
         "--thresholds FILE` and `slowrank analyze --thresholds FILE` read one, "
         "and a key it leaves out keeps its default. An unknown key is an error. "
         "Written by `scripts/thresholds-doc.py`; a test checks it lists every key.", ""]
for sec, (struct, path) in SECTIONS.items():
    table = defaults if sec == "" else defaults.get(sec, {})
    lines += ["## " + (f"`[{sec}]`" if sec else "top level") + f" — `{struct}` ({path})", "",
              "| key | default | meaning |", "|---|---|---|"]
    for name, doc in fields(struct, path):
        if sec == "" and name in SECTIONS:
            continue
        if name not in table and not (sec == "" and name == "whatif_groups"):
            val = "(none)"
        else:
            val = fmt(table.get(name, []))
        cell = doc.replace("|", "\\|")
        lines.append(f"| `{name}` | `{val}` | {cell} |")
    lines.append("")
open(os.path.join(root, "docs/thresholds.md"), "w").write("\n".join(lines))
print("wrote docs/thresholds.md")
