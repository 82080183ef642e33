#!/usr/bin/env python3
"""Summarises scripts/benchmarks.sh output (default /tmp/slowrank-bench) into the
numbers BENCHMARKS.md quotes, and writes two hand-made SVG plots next to
BENCHMARKS.md: detection latency vs slowdown factor, and step time per probe set.
Standard library only (matplotlib is not assumed)."""

import csv
import glob
import json
import os
import re
import statistics
import sys

B = sys.argv[1] if len(sys.argv) > 1 else "/tmp/slowrank-bench"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(p):
    with open(p) as f:
        return json.load(f)


def q(v, p):
    """Nearest-rank quantile."""
    if not v:
        return None
    s = sorted(v)
    k = max(1, min(len(s), -(-int(p * len(s) * 1000) // 1000)))
    return s[k - 1]


def fmt(x, d=1):
    return "-" if x is None else f"{x:.{d}f}"


def eval_section(name):
    p = os.path.join(B, name, "eval.json")
    if not os.path.exists(p):
        return None
    e = load(p)
    print(f"\n## {name}: {len(e['runs'])} runs, command: {e['command']}")
    for m, mm in e["methods"].items():
        print(f"\n{m}")
        print("| class | faults | matched | recall | findings | true | precision |")
        print("|---|---|---|---|---|---|---|")
        for c, cm in mm["per_class"].items():
            rec = "-" if cm["recall"] is None else f"{cm['recall']*100:.0f}%"
            pre = "-" if cm["precision"] is None else f"{cm['precision']*100:.0f}%"
            print(f"| {c} | {cm['faults']} | {cm['matched']} | {rec} | {cm['findings']} | {cm['true_findings']} | {pre} |")
        li, ls = mm["latency_iterations"], mm["latency_seconds"]
        print(f"false findings {mm['false_findings']}; healthy: {mm['healthy_false_findings']} in {mm['healthy_runs']} runs "
              f"({mm['healthy_hours']:.4f} h) = {fmt(mm['false_per_healthy_hour'])}/h; latency it median {fmt(li['median'])} "
              f"p90 {fmt(li['p90'])} (n={li['n']}), s median {fmt(ls['median'], 2)} p90 {fmt(ls['p90'], 2)}")
    return e


def first_in_agent_log(run_dir, host, pattern):
    """First match of `pattern` in the host's agent log, or None."""
    p = os.path.join(run_dir, "logs", f"agent-host-{host}.log")
    try:
        with open(p, errors="replace") as f:
            for line in f:
                m = re.search(pattern, line)
                if m:
                    return m
    except OSError:
        pass
    return None


def agent_clock_epoch_mono_ns(run_dir, host):
    """The simulated clock's drift epoch, as the agent logs it."""
    m = first_in_agent_log(run_dir, host, r"epoch_mono_ns(?:\x1b\[[0-9;]*m)*=(?:\x1b\[[0-9;]*m)*(\d+)")
    return int(m.group(1)) if m else None


def agent_start_wall_ns(run_dir, host):
    """Wall time of the agent's first log line (older agents' epoch proxy)."""
    m = first_in_agent_log(run_dir, host, r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d+)Z")
    if not m:
        return None
    import calendar
    y, mo, d, h, mi, s, frac = m.groups()
    secs = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(s)))
    return secs * 10**9 + int(frac.ljust(9, "0")[:9])


def clock_section():
    errs_drift, errs_nodrift, drift_errs, within = [], [], [], []
    for run in sorted(glob.glob(os.path.join(B, "eval", "*", ""))):
        try:
            t = load(os.path.join(run, "truth.json"))
            r = load(os.path.join(run, "report.json"))
        except (OSError, ValueError):
            continue
        for hc in t["hosts_clock"]:
            est = next((h for h in r["clock"]["hosts"] if h["host"] == f"host-{hc['host']}"), None)
            if est is None or est.get("source") != "probes":
                continue
            epoch_mono = agent_clock_epoch_mono_ns(run, hc["host"])
            if epoch_mono is None:
                # Older agents did not log it: their first log line, a second
                # or more after the epoch (probes load in between).
                start = agent_start_wall_ns(run, hc["host"])
                if start is None:
                    continue
                epoch_mono = t["started_mono_ns"] - (t["started_wall_ns"] - start)
            raw = est["reference_agent_ns"] - hc["offset_us"] * 1000
            true_us = -(hc["offset_us"] + hc["drift_ppm"] * 1e-6 * (raw - epoch_mono) / 1e3)
            err = est["offset_us"] - true_us
            (errs_drift if hc["drift_ppm"] else errs_nodrift).append(err)
            within.append(abs(err) <= est["error_bound_us"])
            if est.get("drift_ppm") is not None:
                drift_errs.append(est["drift_ppm"] - hc["drift_ppm"])
    print("\n## clock: estimated − injected offset (µs), per host per run")
    for name, v in (("with drift", errs_drift), ("no drift", errs_nodrift)):
        a = [abs(x) for x in v]
        print(f"{name}: n={len(v)} |err| p50 {fmt(q(a, .5))} p99 {fmt(q(a, .99))}; signed median {fmt(q(v, .5))}")
    if within:
        print(f"within the report's own error bound: {sum(within)}/{len(within)}")
    a = [abs(x) for x in drift_errs]
    print(f"drift estimate − injected (ppm): n={len(a)} |err| p50 {fmt(q(a, .5), 2)} p99 {fmt(q(a, .99), 2)}")


def step_durations_ms(path, skip=10):
    d = []
    with open(path) as f:
        next(f)
        for line in f:
            rank, it, s, e, dur, wall = line.strip().split(",")
            if int(it) >= skip:
                d.append(int(dur) / 1000.0)
    return d


def steps_median_ms(path, skip=10):
    d = step_durations_ms(path, skip)
    return statistics.median(d) if d else None


def steps_mean_ms(path, skip=10):
    # The mean carries what the median hides: the launch samples slow a
    # few seconds in thirty, which a median over the run's steps skips.
    d = step_durations_ms(path, skip)
    return statistics.fmean(d) if d else None


# benchmarks.sh overhead's modes, in the order the tables show them.
OVERHEAD_MODES = ("none", "always", "nostacks", "default", "coord-idle", "idle", "deep", "idle-deep")


def print_step_table(title, runs):
    """Per mode: its runs' figures, their median and spread, and the median
    against `none`'s; returns mode -> (median, min, max)."""
    print(f"\n## overhead: {title}")
    base = statistics.median(runs["none"]) if "none" in runs else None
    out = {}
    for mode in OVERHEAD_MODES:
        v = runs.get(mode)
        if not v:
            continue
        med = statistics.median(v)
        rel = "" if base is None else f" ({(med / base - 1) * 100:+.1f}% vs none)"
        print(f"{mode}: runs {[round(x, 2) for x in v]} median {med:.2f} spread {min(v):.2f}–{max(v):.2f}{rel}")
        out[mode] = (med, min(v), max(v))
    return out


def overhead_section():
    modes, means = {}, {}
    for p in sorted(glob.glob(os.path.join(B, "overhead", "*", "steps.csv"))):
        mode = os.path.basename(os.path.dirname(p)).rsplit("-", 1)[0]
        m = steps_median_ms(p)
        if m is not None:
            modes.setdefault(mode, []).append(m)
            means.setdefault(mode, []).append(steps_mean_ms(p))
    if not modes:
        return None
    out = print_step_table("median step time (ms) per run, dp8-healthy", modes)
    print_step_table("mean step time (ms) per run (every step counts, launch samples included)", means)
    overhead_cost_section(modes, statistics.median(modes["none"]) if "none" in modes else None)
    services_cpu_section()
    return out


def services_cpu_section():
    """The CPU the coordinator and the agents used beside the ranks, per
    mode (median over runs), as a share of the machine's cores."""
    rows = {}
    for p in sorted(glob.glob(os.path.join(B, "overhead", "*", "services-cpu.json"))):
        mode = os.path.basename(os.path.dirname(p)).rsplit("-", 1)[0]
        try:
            c = load(p)
        except (OSError, ValueError):
            continue
        if c.get("wall_s"):
            rows.setdefault(mode, []).append(c)
    if not rows:
        return
    cores = os.cpu_count() or 1
    print(f"\n## overhead: the services' CPU beside the ranks (share of {cores} cores, median over runs)")
    print("| mode | coordinator | agents | together | sched |")
    print("|---|---|---|---|---|")
    for mode in OVERHEAD_MODES:
        cs = rows.get(mode)
        if not cs:
            continue
        co = statistics.median(c["coordinator_s"] / c["wall_s"] for c in cs) / cores * 100
        ag = statistics.median(c["agents_s"] / c["wall_s"] for c in cs) / cores * 100
        print(f"| {mode} | {co:.1f} % | {ag:.1f} % | {co + ag:.1f} % | {cs[0].get('sched', '?')} |")


def overhead_cost_section(modes, base):
    """Probe calls per rank per step and the agents' self-reported cost,
    next to the measured step-time cost (same runs)."""
    for mode in OVERHEAD_MODES[1:]:
        runs = sorted(p for p in glob.glob(os.path.join(B, "overhead", f"{mode}-*", "agent-cost.txt"))
                      # `idle-*` must not take `idle-deep-*`'s runs.
                      if os.path.basename(os.path.dirname(p)).rsplit("-", 1)[0] == mode)
        if not runs:
            continue
        calls, steps, selfp, traps, agentp = {}, 0, [], [], []
        for p in runs:
            d = os.path.dirname(p)
            rows = list(csv.DictReader(open(os.path.join(d, "steps.csv"))))
            steps += len(rows)  # rank-steps
            for line in open(p):
                m = re.search(r'probe="?([^" ]+)"? calls=(\d+) windowed=(\w+)', line)
                if m:
                    k = (m.group(1), m.group(3) == "true")
                    calls[k] = calls.get(k, 0) + int(m.group(2))
                m = re.search(r"uprobe_ns=([\d.]+) uprobe_uretprobe_pair_ns=([\d.]+)", line)
                if m:
                    traps.append((float(m.group(1)), float(m.group(2))))
            try:
                o = load(os.path.join(d, "report.json")).get("overhead") or {}
                if o.get("job_percent") is not None:
                    selfp.append(o["job_percent"])
                if o.get("agent_cpu_percent") is not None:
                    agentp.append(o["agent_cpu_percent"])
            except (OSError, ValueError):
                pass
        print(f"\n## overhead, {mode} set: probe calls per rank per step ({len(runs)} runs, {steps} rank-steps)")
        print("| probe | calls trapped per rank-step | set |")
        print("|---|---|---|")
        for (probe, windowed), n in sorted(calls.items(), key=lambda x: -x[1]):
            name = ", ".join(f"`{x}`" for x in probe.split("|"))
            print(f"| {name} | {n / max(steps, 1):.2f} | {'windowed' if windowed else 'always-on'} |")
        if traps:
            print(f"trap cost measured by the agents: uprobe {statistics.median(t[0] for t in traps) / 1e3:.1f} µs, "
                  f"uprobe+uretprobe {statistics.median(t[1] for t in traps) / 1e3:.1f} µs (median over agents)")
        measured = None
        if base and modes.get(mode):
            measured = (statistics.median(modes[mode]) / base - 1) * 100
        sr = statistics.median(selfp) if selfp else None
        print(f"self-reported probe cost (report.json overhead.job_percent, median over runs): {fmt(sr, 2)}% "
              f"vs measured step-time cost {fmt(measured, 1)}%")
        if agentp:
            ac = statistics.median(agentp)
            both = sr + ac if sr is not None else None
            print(f"self-reported agent CPU (overhead.agent_cpu_percent, median over runs): {ac:.2f}%; "
                  f"probes + agent CPU {fmt(both, 2)}% vs measured {fmt(measured, 1)}%")


def wire_section():
    p = os.path.join(B, "wire", "metrics.txt")
    if not os.path.exists(p):
        return
    txt = open(p).read()
    m = re.search(r"^slowrank_batch_bytes_received_total (\S+)", txt, re.M)
    r = load(os.path.join(B, "wire", "report.json"))
    secs = r["job"]["observed_seconds"]
    n = r["job"]["world_size"]
    if m and secs:
        b = float(m.group(1))
        print(f"\n## wire: {b:.0f} bytes received (last scrape) over {secs:.1f} s observed, {n} ranks "
              f"= {b / n / secs:.0f} B/rank/s (records accepted {r['ingest']['records_accepted']})")


def flood_section():
    rows = []
    for p in sorted(glob.glob(os.path.join(B, "flood-*.json")), key=lambda x: int(re.findall(r"\d+", os.path.basename(x))[0])):
        try:
            f = load(p)
        except (OSError, ValueError):
            print(f"\n{p}: no result (see the .log next to it)")
            continue
        rows.append(f)
    if not rows:
        return
    print("\n## flood (100 collectives/s per rank)")
    print("| ranks | offered rec/s | sent rec/s | accepted rec/s | gen lag s | coord CPU % (mean) | RSS max MiB | RSS growth late MiB | verdict after onset s | B/rank/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f in rows:
        print(f"| {f['options']['ranks']} | {f['records_offered_per_s']:.0f} | {f['records_sent_per_s']:.0f} | "
              f"{fmt(f.get('ingest_per_s'), 0)} | {f['generator_lag_s']:.1f} | {f['cpu_percent_mean']:.0f} | "
              f"{f['rss_mib_max']:.0f} | {f['rss_growth_mib_late']:.0f} | {fmt(f.get('verdict_after_onset_s'), 2)} | "
              f"{fmt(f.get('wire_bytes_per_rank_s'), 0)} |")


def sweep_points(sweep):
    """(factor, median, p90) of slowrank's latency per swept factor."""
    pts = []
    for spec, ms in sweep["per_spec"].items():
        m = re.search(r"-x([0-9.]+)(-step[0-9.]+ms)?$", spec)
        if not m:
            continue
        li = ms.get("slowrank", {}).get("latency_iterations", {})
        pts.append((float(m.group(1)), li.get("median"), li.get("p90")))
    return sorted(pts)


def svg_latency(series):
    """series: [(label, eval.json of a sweep, colour)]."""
    series = [(lab, sweep_points(sw), c) for lab, sw, c in series if sw]
    factors = sorted({f for _, pts, _ in series for f, _, _ in pts})
    if not factors:
        return
    W, H, L, R, T, Bm = 520, 320, 60, 20, 30, 50
    vals = [v for _, pts, _ in series for _, a, b in pts for v in (a, b) if v is not None]
    ymax = max(vals + [10]) * 1.2
    xs = {f: L + 30 + i * (W - L - R - 60) / max(1, len(factors) - 1) for i, f in enumerate(factors)}
    y = lambda v: T + (H - T - Bm) * (1 - v / ymax)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<text x="{W/2}" y="18" text-anchor="middle">detection latency vs slowdown (dp8-compute-slow; dot median, square p90)</text>',
         f'<line x1="{L}" y1="{H-Bm}" x2="{W-R}" y2="{H-Bm}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-Bm}" stroke="black"/>',
         f'<text x="{W/2}" y="{H-12}" text-anchor="middle">slowdown factor</text>',
         f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">iterations, onset → verdict</text>',
         f'<line x1="{L}" y1="{y(10)}" x2="{W-R}" y2="{y(10)}" stroke="#2a2" stroke-dasharray="4 3"/>',
         f'<text x="{W-R-4}" y="{y(10)-4}" text-anchor="end" fill="#2a2">goal: 10</text>']
    for k in range(0, 5):
        v = ymax * k / 4
        o.append(f'<text x="{L-6}" y="{y(v)+4}" text-anchor="end">{v:.0f}</text>')
        o.append(f'<line x1="{L}" y1="{y(v)}" x2="{W-R}" y2="{y(v)}" stroke="#eee"/>')
    for f in factors:
        o.append(f'<text x="{xs[f]}" y="{H-Bm+16}" text-anchor="middle">{f}×</text>')
    for i, (label, pts, colour) in enumerate(series):
        dx = (i - (len(series) - 1) / 2) * 12
        for f, med, p90 in pts:
            x = xs[f] + dx
            if med is None:
                o.append(f'<text x="{x}" y="{H-Bm-8-14*i}" text-anchor="middle" fill="{colour}">none</text>')
                continue
            o.append(f'<circle cx="{x}" cy="{y(med)}" r="5" fill="{colour}"><title>{label}: median {med}</title></circle>')
            if p90 is not None:
                o.append(f'<rect x="{x-4}" y="{y(p90)-4}" width="8" height="8" fill="none" stroke="{colour}" stroke-width="2"><title>{label}: p90 {p90}</title></rect>')
        o.append(f'<circle cx="{L+20}" cy="{T+10+16*i}" r="5" fill="{colour}"/><text x="{L+30}" y="{T+14+16*i}">{label}</text>')
    o.append("</svg>")
    with open(os.path.join(REPO, "bench-latency.svg"), "w") as f:
        f.write("\n".join(o) + "\n")


def svg_overhead(oh):
    if not oh:
        return
    W, H, L, T, Bm = 420, 280, 60, 30, 40
    ymax = max(v[2] for v in oh.values()) * 1.15
    y = lambda v: T + (H - T - Bm) * (1 - v / ymax)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<text x="{W/2}" y="18" text-anchor="middle">step time per probe set (dp8-healthy, median of runs; bar = min–max)</text>',
         f'<line x1="{L}" y1="{H-Bm}" x2="{W-20}" y2="{H-Bm}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-Bm}" stroke="black"/>',
         f'<text x="14" y="{H/2}" transform="rotate(-90 14 {H/2})" text-anchor="middle">step time (ms)</text>']
    for k in range(0, 5):
        v = ymax * k / 4
        o.append(f'<text x="{L-6}" y="{y(v)+4}" text-anchor="end">{v:.0f}</text>')
    for i, (mode, (med, lo, hi)) in enumerate(oh.items()):
        x = L + 40 + i * 110
        o.append(f'<rect x="{x}" y="{y(med)}" width="60" height="{H-Bm-y(med)}" fill="#1f77b4"><title>{med:.2f} ms</title></rect>')
        o.append(f'<line x1="{x+30}" y1="{y(lo)}" x2="{x+30}" y2="{y(hi)}" stroke="black" stroke-width="2"/>')
        o.append(f'<text x="{x+30}" y="{H-Bm+16}" text-anchor="middle">{mode}</text>')
        o.append(f'<text x="{x+30}" y="{y(med)-6}" text-anchor="middle">{med:.1f}</text>')
    o.append("</svg>")
    with open(os.path.join(REPO, "bench-overhead.svg"), "w") as f:
        f.write("\n".join(o) + "\n")


if __name__ == "__main__":
    eval_section("eval")
    sweep = eval_section("sweep")
    sweep300 = eval_section("sweep-300ms")
    clock_section()
    oh = overhead_section()
    wire_section()
    flood_section()
    svg_latency([("≈ 60 ms steps", sweep, "#1f77b4"), ("≈ 330 ms steps", sweep300, "#d62728")])
    svg_overhead(oh)
