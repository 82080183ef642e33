//! Verbs link statistics: which queue pairs complete slowly.
//!
//! Each [`LinkRecord`](slowrank_shared::wire::LinkRecord) gives a QP's mean
//! post→completion latency over an interval. Links are compared
//! cross-sectionally (each interval against the median link at the same
//! moment), so a persistent fault never becomes its own baseline, and a
//! link is slow when most of its last few intervals are. Only like is compared
//! with like: a QP's latency includes its chunks' wire time, so links are
//! grouped by bytes per completion (sizes within 25% of the next smaller one
//! form a class) and each is judged against its class's median when the
//! class has enough links (a 3-D job's pipeline sends and data-parallel
//! rings move different chunk sizes). A rank whose NIC is slow
//! makes *most* of its links slow; a bad cable or switch port makes one pair
//! slow while both ends' other links are fine — the pair is named. When
//! every link one host *measures* is slow at once, no pair is named: the
//! common cause is on that host (late completion polls from a starved CPU,
//! or its whole network path), and blaming each pair would print one false
//! "bad cable" per NIC. Such hosts are listed in the findings instead.

use foldhash::{HashMap, HashMapExt};
use std::collections::VecDeque;

use crate::clock::{median, CoordNs};

/// One QP interval on the coordinator clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkObs {
    pub rank: u32,
    pub peer: u32,
    pub start: CoordNs,
    pub end: CoordNs,
    pub completions: u64,
    pub latency_sum_ns: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkConfig {
    /// Latency / median latency at which a link is slow.
    pub slow_ratio: f64,
    /// And at least this much slower in absolute terms (ns).
    pub min_excess_ns: f64,
    /// Completions needed in the window to judge a link.
    pub min_completions: u64,
    /// Share of a rank's peers that must be slow to blame its NIC: slow on
    /// their own, or at the same moments as one of its links that is.
    pub rank_share: f64,
    /// Links a chunk-size class needs for its own median.
    pub min_class_links: usize,
    /// Observations kept per pair; pairs kept at most.
    pub per_pair: usize,
    pub max_pairs: usize,
    /// Share of the iteration's GPU time a slow link or NIC must be seen to
    /// cost (its collectives' measured transfer time beyond the baseline)
    /// to count as a finding in that iteration. Slow post→completion
    /// latencies whose transfers were not measured, or cost nothing, name
    /// nobody: right after the deep probes attach, a loaded host's late
    /// polls look like a slow pair.
    pub min_cost_fraction: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            slow_ratio: 1.5,
            min_excess_ns: 5_000.0,
            min_completions: 4,
            rank_share: 0.75,
            min_class_links: 3,
            per_pair: 16,
            max_pairs: 1 << 20,
            min_cost_fraction: 0.001,
        }
    }
}

/// A slow pair of ranks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlowLink {
    pub a: u32,
    pub b: u32,
    /// Median of its recent intervals' mean latencies.
    pub latency_ns: f64,
    /// Median of what it was judged against in those intervals: its
    /// chunk-size class's (or all links') median at the same moments.
    pub baseline_ns: f64,
    /// Median of the intervals' latency / baseline.
    pub ratio: f64,
}

/// A rank whose links are mostly slow (its NIC or its network path).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlowNic {
    pub rank: u32,
    pub slow_peers: Vec<u32>,
    pub peers: usize,
    pub latency_ns: f64,
    /// Median of the baselines its slow links were judged against.
    pub baseline_ns: f64,
    pub ratio: f64,
}

/// A host whose measured links are all (or nearly all) slow together.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CommonModeHost {
    pub host: String,
    pub slow_links: usize,
    pub measured_links: usize,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LinkFindings {
    pub median_latency_ns: f64,
    pub links_judged: usize,
    pub nics: Vec<SlowNic>,
    pub links: Vec<SlowLink>,
    /// Hosts whose slow links were not named as pairs (see module docs).
    pub common_mode: Vec<CommonModeHost>,
}

/// Mean latency of a pair over a window, its completions, and the ranks
/// that measured it (the posting side of each QP).
#[derive(Debug, Clone)]
struct PairLatency {
    latency_ns: f64,
    /// Mean bytes per completion.
    chunk_bytes: f64,
    measured_by: Vec<u32>,
    /// The pair's last few intervals up to the window's end, newest first.
    recent: Vec<Recent>,
}

/// One past interval of a pair: its span and mean latency.
#[derive(Debug, Clone, Copy)]
struct Recent {
    start: CoordNs,
    end: CoordNs,
    latency_ns: f64,
}

impl Recent {
    fn mid(&self) -> CoordNs {
        self.start + (self.end - self.start) / 2
    }
}

/// Intervals looked back over (newest first, at most this far back, ns).
/// A link is slow when most of its recent intervals are slow against their
/// class's median *at the same moment*: a bad cable is slow in most
/// intervals, while a loaded host's late polls make one link look 1.5–1.8×
/// slow for an interval or two (seen on healthy runs in CI), and a load
/// wave lifts every link at once, which a baseline taken at another moment
/// would call slow.
const RECENT_INTERVALS: usize = 4;
/// How many of the recent intervals must be slow: one may dip (a weak
/// fault, 1.3–2.5× from interval to interval, would flicker otherwise).
const SLOW_RECENT: usize = 3;
const RECENT_NS: i64 = 5_000_000_000;
/// Intervals the second rule looks back over (newest first, within
/// [`RECENT_NS`]): a link is also slow when, over these, it took
/// `slow_ratio` × what its class took at the same moments in all, and was
/// slow in at least [`SLOW_BURSTS`] of them. A NIC whose bandwidth is cut
/// slows only the intervals that move much data, a step's gradient
/// all-reduce: 2 of every 4–5 intervals at 4–5× (random 4242-45, a NIC at
/// 13 % costing the job 12.7 %), never three in four. A loaded host's late
/// polls, one or two intervals at 1.5–1.8×, do not add up to 1.5× over
/// eight.
const LONG_INTERVALS: usize = 8;
const SLOW_BURSTS: usize = 2;

/// Per size class, the median latency of its links' intervals by time
/// bucket (as wide as the class's median interval): what the class took at
/// the moment of a given interval. Linear in the intervals, so it holds at
/// tens of thousands of links.
struct SpanMedians {
    width: HashMap<usize, i64>,
    median: HashMap<(usize, i64), f64>,
}

impl SpanMedians {
    /// Over each pair's newest `depth` intervals.
    fn new(
        lats: &HashMap<(u32, u32), PairLatency>,
        class_of: &HashMap<(u32, u32), usize>,
        min_links: usize,
        depth: usize,
    ) -> Self {
        let mut by_class: HashMap<usize, Vec<Recent>> = HashMap::new();
        for (k, p) in lats {
            by_class
                .entry(class_of[k])
                .or_default()
                .extend(p.recent.iter().take(depth).copied());
        }
        let (mut width, mut median_of) = (HashMap::new(), HashMap::new());
        for (class, rs) in by_class {
            let mut lens: Vec<f64> = rs.iter().map(|r| (r.end - r.start) as f64).collect();
            let w = (median(&mut lens).unwrap_or(1.0) as i64).max(1);
            let mut buckets: HashMap<i64, Vec<f64>> = HashMap::new();
            for r in &rs {
                buckets
                    .entry(r.mid().div_euclid(w))
                    .or_default()
                    .push(r.latency_ns);
            }
            for (b, mut v) in buckets {
                if v.len() >= min_links {
                    if let Some(m) = median(&mut v) {
                        median_of.insert((class, b), m);
                    }
                }
            }
            width.insert(class, w);
        }
        Self {
            width,
            median: median_of,
        }
    }

    fn at(&self, class: usize, r: &Recent) -> Option<f64> {
        let w = *self.width.get(&class)?;
        self.median.get(&(class, r.mid().div_euclid(w))).copied()
    }
}

/// Per pair of ranks (lower first).
type Pairs<T> = HashMap<(u32, u32), T>;

/// A pair judged over its recent intervals: the medians of their latencies,
/// of their moments' baselines and of the ratios between the two, and
/// whether [`SLOW_RECENT`] of them were slow.
#[derive(Debug, Clone, Copy)]
struct Judged {
    latency_ns: f64,
    baseline_ns: f64,
    ratio: f64,
    slow: bool,
}

/// A pair slow by the second rule: its recent intervals' mean latency and
/// their moments' mean baseline.
#[derive(Debug, Clone, Copy)]
struct Burst {
    latency_ns: f64,
    baseline_ns: f64,
}

/// One recent interval of a pair and whether it was slow against its
/// moment's baseline.
#[derive(Debug, Clone, Copy)]
struct Moment {
    at: Recent,
    slow: bool,
}

/// Whether a link was slow when `spans` (another link's slow intervals at
/// the same rank) were: at least two of its intervals overlap them, and
/// more than half of the time they overlap is in its slow intervals. A bad
/// cable leaves the rank's other links fast at those moments; a slow NIC
/// slows them all at once. Weighed by time, not counted: the links' intervals
/// do not share boundaries, and one that only grazes a slow span says
/// little (random 6317-7, a NIC slow half of each second).
fn slow_along(mine: &[Moment], spans: &[Recent]) -> bool {
    let mut union: Vec<(CoordNs, CoordNs)> = spans.iter().map(|s| (s.start, s.end)).collect();
    union.sort_unstable();
    let mut merged: Vec<(CoordNs, CoordNs)> = Vec::new();
    for (a, b) in union {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let (mut n, mut total, mut slow) = (0usize, 0i64, 0i64);
    for m in mine {
        let ov: i64 = merged
            .iter()
            .map(|(a, b)| (m.at.end.min(*b) - m.at.start.max(*a)).max(0))
            .sum();
        if ov > 0 {
            n += 1;
            total += ov;
            if m.slow {
                slow += ov;
            }
        }
    }
    n >= 2 && 2 * slow > total
}

/// Chunk sizes a class may span between neighbours (sorted by size).
const CLASS_STEP: f64 = 1.25;

/// Size class of each pair: sorted by chunk size, a new class starts where
/// a size exceeds the previous one by more than [`CLASS_STEP`].
fn size_classes(lats: &HashMap<(u32, u32), PairLatency>) -> HashMap<(u32, u32), usize> {
    let mut by_size: Vec<((u32, u32), f64)> =
        lats.iter().map(|(k, p)| (*k, p.chunk_bytes)).collect();
    by_size.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let mut out = HashMap::new();
    let (mut class, mut prev) = (0usize, None::<f64>);
    for (k, size) in by_size {
        if prev.is_some_and(|p| size > CLASS_STEP * p.max(1.0)) {
            class += 1;
        }
        prev = Some(size);
        out.insert(k, class);
    }
    out
}

#[derive(Debug)]
pub struct LinkStats {
    cfg: LinkConfig,
    pairs: HashMap<(u32, u32), VecDeque<LinkObs>>,
    pub dropped: u64,
}

impl LinkStats {
    pub fn new(cfg: LinkConfig) -> Self {
        Self {
            cfg,
            pairs: HashMap::new(),
            dropped: 0,
        }
    }

    pub fn add(&mut self, o: LinkObs) {
        if o.rank == o.peer {
            self.dropped += 1;
            return;
        }
        let key = (o.rank.min(o.peer), o.rank.max(o.peer));
        if !self.pairs.contains_key(&key) && self.pairs.len() >= self.cfg.max_pairs {
            self.dropped += 1;
            return;
        }
        let q = self.pairs.entry(key).or_default();
        q.push_back(o);
        while q.len() > self.cfg.per_pair {
            q.pop_front();
        }
    }

    /// Mean latency per pair over `[from, to]`; a pair with nothing in the
    /// window uses its latest interval if it ended less than `stale_ns` ago.
    fn latencies(
        &self,
        from: CoordNs,
        to: CoordNs,
        stale_ns: i64,
    ) -> HashMap<(u32, u32), PairLatency> {
        let mut out = HashMap::new();
        for (k, q) in &self.pairs {
            let (mut lat, mut n, mut bytes) = (0u64, 0u64, 0u64);
            let mut measured_by = Vec::new();
            for o in q.iter().filter(|o| o.end >= from && o.start <= to) {
                lat += o.latency_sum_ns;
                n += o.completions;
                bytes += o.bytes;
                measured_by.push(o.rank);
            }
            if n == 0 {
                if let Some(o) = q
                    .iter()
                    .rev()
                    .find(|o| o.end <= to && to - o.end <= stale_ns)
                {
                    lat = o.latency_sum_ns;
                    n = o.completions;
                    bytes = o.bytes;
                    measured_by.push(o.rank);
                }
            }
            if n >= self.cfg.min_completions {
                measured_by.sort_unstable();
                measured_by.dedup();
                let recent = q
                    .iter()
                    .rev()
                    .filter(|o| o.start <= to && to - o.end <= RECENT_NS)
                    .filter(|o| o.completions >= self.cfg.min_completions)
                    .take(LONG_INTERVALS)
                    .map(|o| Recent {
                        start: o.start,
                        end: o.end,
                        latency_ns: o.latency_sum_ns as f64 / o.completions as f64,
                    })
                    .collect();
                out.insert(
                    *k,
                    PairLatency {
                        latency_ns: lat as f64 / n as f64,
                        chunk_bytes: bytes as f64 / n as f64,
                        measured_by,
                        recent,
                    },
                );
            }
        }
        out
    }

    /// Judges the links over `[from, to]`; `host_of` names the host a rank
    /// runs on (for the common-mode rule).
    pub fn evaluate(
        &self,
        from: CoordNs,
        to: CoordNs,
        host_of: impl Fn(u32) -> String,
    ) -> LinkFindings {
        let lats = self.latencies(from, to, 2_000_000_000);
        let Some((med, judged, moments)) = self.judge(&lats) else {
            return LinkFindings::default();
        };
        let is_slow = |k: &(u32, u32)| judged[k].slow;
        let nics = self.slow_nics(&judged, &moments);
        let nic_ranks: Vec<u32> = nics.iter().map(|n| n.rank).collect();
        let common_mode = self.common_mode_hosts(&lats, &judged, &host_of);
        let on_common_host = |p: &PairLatency| {
            p.measured_by
                .iter()
                .any(|&r| common_mode.iter().any(|c| c.host == host_of(r)))
        };
        let mut links: Vec<SlowLink> = lats
            .iter()
            .filter(|(k, p)| {
                let (a, b) = **k;
                is_slow(k)
                    && !nic_ranks.contains(&a)
                    && !nic_ranks.contains(&b)
                    && !on_common_host(p)
            })
            .map(|(k, _)| {
                let j = judged[k];
                SlowLink {
                    a: k.0,
                    b: k.1,
                    latency_ns: j.latency_ns,
                    baseline_ns: j.baseline_ns,
                    ratio: j.ratio,
                }
            })
            .collect();
        links.sort_by_key(|l| (l.a, l.b));
        LinkFindings {
            median_latency_ns: med,
            links_judged: lats.len(),
            nics,
            links,
            common_mode,
        }
    }

    /// Every measured link against the links of its size class (their
    /// median, over the same spans): the median latency of all, and each
    /// link's verdict. `None` with nothing measured.
    fn judge(
        &self,
        lats: &HashMap<(u32, u32), PairLatency>,
    ) -> Option<(f64, Pairs<Judged>, Pairs<Vec<Moment>>)> {
        let mut all: Vec<f64> = lats.values().map(|v| v.latency_ns).collect();
        let med = median(&mut all)?;
        // Per size class, its median when it has enough links.
        let class_of = size_classes(lats);
        let mut classes: HashMap<usize, Vec<f64>> = HashMap::new();
        for (k, p) in lats {
            classes.entry(class_of[k]).or_default().push(p.latency_ns);
        }
        let class_med: HashMap<usize, f64> = classes
            .into_iter()
            .filter(|(_, v)| v.len() >= self.cfg.min_class_links)
            .filter_map(|(k, mut v)| median(&mut v).map(|m| (k, m)))
            .collect();
        let baseline = |k: &(u32, u32)| class_med.get(&class_of[k]).copied().unwrap_or(med);
        // The first rule's moments as they always were (a bucket's width is
        // the median interval); the second rule's over its longer look-back.
        let spans = SpanMedians::new(lats, &class_of, self.cfg.min_class_links, RECENT_INTERVALS);
        let long_spans =
            SpanMedians::new(lats, &class_of, self.cfg.min_class_links, LONG_INTERVALS);
        let moments: Pairs<Vec<Moment>> = lats
            .iter()
            .map(|(k, p)| {
                let now = baseline(k);
                let m = p
                    .recent
                    .iter()
                    .take(RECENT_INTERVALS)
                    .map(|r| Moment {
                        at: *r,
                        slow: self.slow_at(r.latency_ns, spans.at(class_of[k], r).unwrap_or(now)),
                    })
                    .collect();
                (*k, m)
            })
            .collect();
        let judged = lats
            .iter()
            .map(|(k, p)| {
                let now = baseline(k);
                let at = |r: &Recent| spans.at(class_of[k], r).unwrap_or(now);
                let last = &p.recent[..p.recent.len().min(RECENT_INTERVALS)];
                let mut l: Vec<f64> = last.iter().map(|r| r.latency_ns).collect();
                let mut b: Vec<f64> = last.iter().map(at).collect();
                let mut q: Vec<f64> = l.iter().zip(&b).map(|(l, b)| l / b.max(1.0)).collect();
                // The SLOW_RECENT-th largest ratio: that many intervals reached it.
                q.sort_by(|x, y| y.total_cmp(x));
                let reached = q.get(SLOW_RECENT - 1).copied().unwrap_or(0.0);
                let long_at = |r: &Recent| long_spans.at(class_of[k], r).unwrap_or(now);
                let bursts = self.slow_in_bursts(&p.recent, long_at);
                let j = match (median(&mut l), median(&mut b), median(&mut q)) {
                    (Some(l), Some(b), Some(q)) if p.recent.len() >= SLOW_RECENT => {
                        let steady =
                            reached >= self.cfg.slow_ratio && l - b >= self.cfg.min_excess_ns;
                        match bursts {
                            Some(Burst {
                                latency_ns,
                                baseline_ns,
                            }) if !steady => Judged {
                                latency_ns,
                                baseline_ns,
                                ratio: latency_ns / baseline_ns.max(1.0),
                                slow: true,
                            },
                            _ => Judged {
                                latency_ns: l,
                                baseline_ns: b,
                                ratio: q,
                                slow: steady,
                            },
                        }
                    }
                    _ => Judged {
                        latency_ns: p.latency_ns,
                        baseline_ns: now,
                        ratio: p.latency_ns / now.max(1.0),
                        slow: false,
                    },
                };
                (*k, j)
            })
            .collect();
        Some((med, judged, moments))
    }

    /// The second rule ([`LONG_INTERVALS`]): over a pair's recent intervals,
    /// their mean latency and their moments' mean baseline, where the one is
    /// `slow_ratio` × the other, `min_excess_ns` beyond it, and at least
    /// [`SLOW_BURSTS`] intervals were slow on their own.
    fn slow_in_bursts(&self, recent: &[Recent], at: impl Fn(&Recent) -> f64) -> Option<Burst> {
        if recent.len() < LONG_INTERVALS / 2 {
            return None;
        }
        let n = recent.len() as f64;
        let latency_ns = recent.iter().map(|r| r.latency_ns).sum::<f64>() / n;
        let baseline_ns = recent.iter().map(&at).sum::<f64>() / n;
        let bursts = recent
            .iter()
            .filter(|r| self.slow_at(r.latency_ns, at(r)))
            .count();
        (bursts >= SLOW_BURSTS && self.slow_at(latency_ns, baseline_ns)).then_some(Burst {
            latency_ns,
            baseline_ns,
        })
    }

    /// Whether one interval's latency is slow against its moment's baseline.
    fn slow_at(&self, latency_ns: f64, baseline_ns: f64) -> bool {
        latency_ns / baseline_ns.max(1.0) >= self.cfg.slow_ratio
            && latency_ns - baseline_ns >= self.cfg.min_excess_ns
    }

    /// A rank with at least two slow links, and slow on `rank_share` of
    /// its links: its NIC, not each pair, is the finding. A link of the
    /// rank not judged slow on its own still counts when it was slow at the
    /// same moments as one that is ([`slow_along`]): a NIC slow now and
    /// then (or only just slow enough) puts one of its links over the
    /// three-in-four rule in one window and another in the next, and naming
    /// each in turn as a bad cable split one fault into subjects none of
    /// which stayed long enough to be named (random 6317-7: link 3↔4, then
    /// 3↔6, then NIC 3, for 25 iterations).
    fn slow_nics(
        &self,
        judged: &HashMap<(u32, u32), Judged>,
        moments: &Pairs<Vec<Moment>>,
    ) -> Vec<SlowNic> {
        let mut peers: HashMap<u32, Vec<(u32, Judged)>> = HashMap::new();
        for (k, j) in judged {
            let (a, b) = *k;
            peers.entry(a).or_default().push((b, *j));
            peers.entry(b).or_default().push((a, *j));
        }
        let mut nics = Vec::new();
        let pair = |r: u32, q: u32| (r.min(q), r.max(q));
        let no_moments = Vec::new();
        let moments_of = |r: u32, q: u32| moments.get(&pair(r, q)).unwrap_or(&no_moments);
        for (&r, ps) in &peers {
            let slow: Vec<&(u32, Judged)> = ps.iter().filter(|p| p.1.slow).collect();
            if slow.is_empty() {
                continue;
            }
            let slow_spans: Vec<Recent> = slow
                .iter()
                .flat_map(|(q, _)| moments_of(r, *q).iter().filter(|m| m.slow).map(|m| m.at))
                .collect();
            let along = ps
                .iter()
                .filter(|p| !p.1.slow && slow_along(moments_of(r, p.0), &slow_spans))
                .map(|p| p.0);
            let mut sp: Vec<u32> = slow.iter().map(|p| p.0).chain(along).collect();
            if sp.len() >= 2 && sp.len() as f64 >= self.cfg.rank_share * ps.len() as f64 {
                let mid = |f: fn(&Judged) -> f64| {
                    let mut v: Vec<f64> = slow.iter().map(|p| f(&p.1)).collect();
                    median(&mut v).unwrap_or(0.0)
                };
                sp.sort_unstable();
                nics.push(SlowNic {
                    rank: r,
                    slow_peers: sp,
                    peers: ps.len(),
                    latency_ns: mid(|j| j.latency_ns),
                    baseline_ns: mid(|j| j.baseline_ns),
                    ratio: mid(|j| j.ratio),
                });
            }
        }
        nics.sort_by_key(|n| n.rank);
        nics
    }

    /// Hosts on which most links they measure are slow: a host-side cause
    /// (its agent or its CPUs), no pair to name.
    fn common_mode_hosts(
        &self,
        lats: &HashMap<(u32, u32), PairLatency>,
        judged: &HashMap<(u32, u32), Judged>,
        host_of: &impl Fn(u32) -> String,
    ) -> Vec<CommonModeHost> {
        // Per measuring host: links it measured, and how many were slow.
        let mut by_host: HashMap<String, (usize, usize)> = HashMap::new();
        for (k, p) in lats {
            let mut hosts: Vec<String> = p.measured_by.iter().map(|&r| host_of(r)).collect();
            hosts.sort_unstable();
            hosts.dedup();
            for h in hosts {
                let e = by_host.entry(h).or_default();
                e.0 += 1;
                e.1 += usize::from(judged[k].slow);
            }
        }
        let mut common_mode: Vec<CommonModeHost> = by_host
            .into_iter()
            .filter(|(_, (n, slow))| *slow >= 2 && *slow as f64 >= self.cfg.rank_share * *n as f64)
            .map(|(host, (n, slow))| CommonModeHost {
                host,
                slow_links: slow,
                measured_links: n,
            })
            .collect();
        common_mode.sort_by(|a, b| a.host.cmp(&b.host));
        common_mode
    }
}

#[cfg(test)]
mod tests;
