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
    /// Share of a rank's peers that must be slow to blame its NIC.
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

/// Per size class, the median latency of its links' intervals by time
/// bucket (as wide as the class's median interval): what the class took at
/// the moment of a given interval. Linear in the intervals, so it holds at
/// tens of thousands of links.
struct SpanMedians {
    width: HashMap<usize, i64>,
    median: HashMap<(usize, i64), f64>,
}

impl SpanMedians {
    fn new(
        lats: &HashMap<(u32, u32), PairLatency>,
        class_of: &HashMap<(u32, u32), usize>,
        min_links: usize,
    ) -> Self {
        let mut by_class: HashMap<usize, Vec<Recent>> = HashMap::new();
        for (k, p) in lats {
            by_class
                .entry(class_of[k])
                .or_default()
                .extend(p.recent.iter().copied());
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
                    .take(RECENT_INTERVALS)
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
        let Some((med, judged)) = self.judge(&lats) else {
            return LinkFindings::default();
        };
        let is_slow = |k: &(u32, u32)| judged[k].slow;
        let nics = self.slow_nics(&judged);
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
    fn judge(&self, lats: &HashMap<(u32, u32), PairLatency>) -> Option<(f64, Pairs<Judged>)> {
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
        let spans = SpanMedians::new(lats, &class_of, self.cfg.min_class_links);
        let judged = lats
            .iter()
            .map(|(k, p)| {
                let now = baseline(k);
                let at = |r: &Recent| spans.at(class_of[k], r).unwrap_or(now);
                let mut l: Vec<f64> = p.recent.iter().map(|r| r.latency_ns).collect();
                let mut b: Vec<f64> = p.recent.iter().map(at).collect();
                let mut q: Vec<f64> = l.iter().zip(&b).map(|(l, b)| l / b.max(1.0)).collect();
                // The SLOW_RECENT-th largest ratio: that many intervals reached it.
                q.sort_by(|x, y| y.total_cmp(x));
                let reached = q.get(SLOW_RECENT - 1).copied().unwrap_or(0.0);
                let j = match (median(&mut l), median(&mut b), median(&mut q)) {
                    (Some(l), Some(b), Some(q)) if p.recent.len() >= SLOW_RECENT => Judged {
                        latency_ns: l,
                        baseline_ns: b,
                        ratio: q,
                        slow: reached >= self.cfg.slow_ratio && l - b >= self.cfg.min_excess_ns,
                    },
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
        Some((med, judged))
    }

    /// A rank with at least two slow links, and slow on `rank_share` of
    /// its links: its NIC, not each pair, is the finding.
    fn slow_nics(&self, judged: &HashMap<(u32, u32), Judged>) -> Vec<SlowNic> {
        let mut peers: HashMap<u32, Vec<(u32, Judged)>> = HashMap::new();
        for (k, j) in judged {
            let (a, b) = *k;
            peers.entry(a).or_default().push((b, *j));
            peers.entry(b).or_default().push((a, *j));
        }
        let mut nics = Vec::new();
        for (&r, ps) in &peers {
            let slow: Vec<&(u32, Judged)> = ps.iter().filter(|p| p.1.slow).collect();
            if slow.len() >= 2 && slow.len() as f64 >= self.cfg.rank_share * ps.len() as f64 {
                let mid = |f: fn(&Judged) -> f64| {
                    let mut v: Vec<f64> = slow.iter().map(|p| f(&p.1)).collect();
                    median(&mut v).unwrap_or(0.0)
                };
                let mut sp: Vec<u32> = slow.iter().map(|p| p.0).collect();
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
mod tests {
    use super::*;

    /// One interval; tests add three ([`add3`]) since a link is slow only
    /// when each of its last three intervals is.
    fn obs(rank: u32, peer: u32, lat: u64) -> LinkObs {
        LinkObs {
            rank,
            peer,
            start: 0,
            end: 100,
            completions: 8,
            latency_sum_ns: 8 * lat,
            bytes: 8 * 65536,
        }
    }

    /// `o` in interval `i` (interval 0 is `[0, 100]`).
    fn at(o: LinkObs, i: i64) -> LinkObs {
        LinkObs {
            start: 101 * i,
            end: 101 * i + 100,
            ..o
        }
    }

    /// `o` in the two intervals before its own, then in its own.
    fn add3(s: &mut LinkStats, o: LinkObs) {
        s.add(at(o, -2));
        s.add(at(o, -1));
        s.add(o);
    }

    fn slow_links(f: &LinkFindings) -> Vec<(u32, u32)> {
        f.links.iter().map(|l| (l.a, l.b)).collect()
    }

    /// Ranks 0..8 in a ring; `lat(r)` is rank r's link to r + 1 in interval i.
    fn ring_interval(s: &mut LinkStats, i: i64, lat: impl Fn(u32) -> u64) -> LinkFindings {
        for r in 0..8u32 {
            s.add(at(obs(r, (r + 1) % 8, lat(r)), i));
        }
        s.evaluate(101 * i, 101 * i + 100, |r| format!("host-{r}"))
    }

    #[test]
    fn a_link_is_slow_once_three_of_its_last_four_intervals_are() {
        let mut s = LinkStats::new(LinkConfig::default());
        for i in -2..=0 {
            ring_interval(&mut s, i, |_| 50_000);
        }
        for i in 1..=3 {
            let f = ring_interval(&mut s, i, |r| if r == 2 { 200_000 } else { 50_000 });
            let want = if i == 3 { vec![(2, 3)] } else { vec![] };
            assert_eq!(slow_links(&f), want, "interval {i}: {f:#?}");
        }
        let l = &ring_interval(&mut s, 4, |r| if r == 2 { 200_000 } else { 50_000 }).links[0];
        assert_eq!(
            (l.latency_ns, l.baseline_ns, l.ratio),
            (200_000.0, 50_000.0, 4.0)
        );
    }

    /// A weak fault (30 % bandwidth on one NIC) runs 1.3–2.5× from interval
    /// to interval: one dip below 1.5× in four neither delays nor clears it
    /// once three intervals were slow.
    #[test]
    fn one_dip_in_four_intervals_keeps_a_link_slow() {
        let mut s = LinkStats::new(LinkConfig::default());
        let slow = [80_000, 70_000, 90_000, 85_000, 80_000, 70_000];
        let mut found = Vec::new();
        for (i, l) in slow.iter().enumerate() {
            let f = ring_interval(&mut s, i as i64, |r| if r == 2 { *l } else { 50_000 });
            found.push(!f.links.is_empty());
        }
        assert_eq!(found, [false, false, false, true, true, true]);
    }

    /// The pattern of a false link verdict seen in CI on a healthy run: a
    /// load wave lifted every link for two intervals and then eased, one
    /// link a little more than the rest. Against the latest interval's
    /// median it is 1.6–1.9× slow in all three; against its own moments it
    /// never is.
    #[test]
    fn a_past_interval_is_judged_against_the_links_of_its_own_span() {
        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            let (wave, now) = if r == 2 {
                (950_000, 800_000)
            } else {
                (700_000, 500_000)
            };
            s.add(at(obs(r, (r + 1) % 8, wave), -2));
            s.add(at(obs(r, (r + 1) % 8, wave), -1));
            s.add(obs(r, (r + 1) % 8, now));
        }
        let f = s.evaluate(0, 100, |r| format!("host-{r}"));
        assert!(f.links.is_empty() && f.nics.is_empty(), "{f:#?}");
        assert_eq!(f.median_latency_ns, 500_000.0);
    }

    #[test]
    fn nic_versus_single_link() {
        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            for d in [1, 2] {
                let q = (r + d) % 8;
                let slow = r == 6 || q == 6 || (r.min(q), r.max(q)) == (1, 2);
                add3(&mut s, obs(r, q, if slow { 120_000 } else { 50_000 }));
            }
        }
        let f = s.evaluate(0, 100, |r| format!("host-{}", r / 4));
        assert_eq!(f.nics.iter().map(|n| n.rank).collect::<Vec<_>>(), vec![6]);
        assert_eq!(f.links.len(), 1);
        assert_eq!((f.links[0].a, f.links[0].b), (1, 2));
    }

    #[test]
    fn uniform_links_find_nothing() {
        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            add3(&mut s, obs(r, (r + 1) % 8, 50_000 + r as u64 * 500));
        }
        let f = s.evaluate(0, 100, |r| format!("host-{}", r / 4));
        assert!(f.nics.is_empty() && f.links.is_empty());
    }

    /// dp8 on two hosts, rail-optimised: host 0 = ranks 0–3, host 1 = 4–7;
    /// member j of a host sends to member j+1 of the other. Three of the
    /// four QPs host 1 measures are slow (its polls run late): no pair is
    /// named.
    /// One slow QP among them is still a pair.
    #[test]
    fn one_host_measuring_every_link_slow_names_no_pair() {
        let host_of = |r: u32| format!("host-{}", r / 4);
        let send_peer = |r: u32| {
            let other = if r < 4 { 4 } else { 0 };
            other + (r % 4 + 1) % 4
        };
        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            add3(
                &mut s,
                obs(r, send_peer(r), if r >= 5 { 700_000 } else { 350_000 }),
            );
        }
        let f = s.evaluate(0, 100, host_of);
        assert!(f.links.is_empty() && f.nics.is_empty(), "{f:#?}");
        assert_eq!(
            f.common_mode,
            vec![CommonModeHost {
                host: "host-1".into(),
                slow_links: 3,
                measured_links: 4
            }]
        );

        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            add3(
                &mut s,
                obs(r, send_peer(r), if r == 3 { 1_500_000 } else { 350_000 }),
            );
        }
        let f = s.evaluate(0, 100, host_of);
        assert!(f.common_mode.is_empty(), "{f:#?}");
        assert_eq!(
            f.links.iter().map(|l| (l.a, l.b)).collect::<Vec<_>>(),
            vec![(3, 4)]
        );
    }

    /// Two traffic classes (pipeline sends of 64 KiB chunks, rings of
    /// 512 KiB): the bigger chunks take longer everywhere; judged against
    /// all links they would all look slow. Each is judged within its class,
    /// where only the one truly slow link stands out.
    #[test]
    fn links_are_judged_within_their_chunk_size_class() {
        let mut s = LinkStats::new(LinkConfig::default());
        for r in 0..8u32 {
            add3(
                &mut s,
                obs(r, (r + 1) % 8, if r == 2 { 900_000 } else { 400_000 }),
            );
            let mut big = obs(
                r,
                (r + 4) % 8 + 8,
                if r == 5 { 2_400_000 } else { 1_000_000 },
            );
            big.bytes = 8 * 512 * 1024;
            add3(&mut s, big);
        }
        let f = s.evaluate(0, 100, |r| format!("host-{r}"));
        assert!(f.nics.is_empty(), "{f:#?}");
        assert_eq!(
            f.links.iter().map(|l| (l.a, l.b)).collect::<Vec<_>>(),
            vec![(2, 3), (5, 9)],
            "{f:#?}"
        );
        assert_eq!(f.links[1].baseline_ns, 1_000_000.0);
    }

    /// Records of a real run (`coordinator/tests/data`, its first line says
    /// which), added as their intervals end and judged every 30 ms, as the
    /// analyzer judges each iteration's window. Returns the onset if the
    /// file names one.
    fn replay(csv: &str, mut each: impl FnMut(CoordNs, &LinkFindings)) -> Option<CoordNs> {
        let mut onset = None;
        let mut obs = Vec::new();
        for line in csv.lines() {
            if let Some(v) = line.strip_prefix("# onset_ns=") {
                onset = v.parse().ok();
            }
            let f: Vec<i64> = line.split(',').filter_map(|x| x.parse().ok()).collect();
            if let [rank, peer, start, end, completions, latency_sum_ns, bytes] = f[..] {
                obs.push(LinkObs {
                    rank: rank as u32,
                    peer: peer as u32,
                    start,
                    end,
                    completions: completions as u64,
                    latency_sum_ns: latency_sum_ns as u64,
                    bytes: bytes as u64,
                });
            }
        }
        assert!(obs.len() > 100, "fixture not read");
        obs.sort_by_key(|o| o.end);
        let last = obs.last().map_or(0, |o| o.end);
        let mut s = LinkStats::new(LinkConfig::default());
        let (mut next, mut t) = (0, obs[0].end);
        while t <= last {
            while next < obs.len() && obs[next].end <= t {
                s.add(obs[next]);
                next += 1;
            }
            each(
                t,
                &s.evaluate(t - 30_000_000, t, |r| format!("host-{}", r / 4)),
            );
            t += 30_000_000;
        }
        onset
    }

    /// The healthy stretch of the CI run that failed on a false "link 1↔6
    /// is slow" (single intervals up to 1.8× its class, never three in four).
    #[test]
    fn recorded_healthy_noisy_links_name_nothing() {
        let csv = include_str!("../../tests/data/links-healthy-noisy-dp8.csv");
        let mut judged = 0;
        replay(csv, |t, f| {
            judged += f.links_judged;
            assert!(f.links.is_empty() && f.nics.is_empty(), "at {t} ns: {f:#?}");
        });
        assert!(judged > 0);
    }

    /// A weak fault, recorded: rank 6's NIC at 30 % bandwidth makes its two
    /// QPs 1.3–2.5× slower from interval to interval. It is named within a
    /// second of the onset, nothing is named before it, and nothing not
    /// touching rank 6 after it.
    #[test]
    fn recorded_weak_nic_fault_is_named_within_a_second() {
        let csv = include_str!("../../tests/data/links-slow-nic-tp4-dp4.csv");
        let mut named = Vec::new();
        let onset = replay(csv, |t, f| {
            let ranks: Vec<u32> = f
                .nics
                .iter()
                .map(|n| n.rank)
                .chain(f.links.iter().flat_map(|l| [l.a, l.b]))
                .collect();
            if !ranks.is_empty() {
                named.push((t, ranks, f.nics.iter().any(|n| n.rank == 6)));
            }
        })
        .expect("fixture names its onset");
        let first_nic = named.iter().find(|n| n.2).map(|n| n.0);
        assert!(
            first_nic.is_some_and(|t| t - onset < 1_000_000_000),
            "NIC 6 first named at {first_nic:?}, onset {onset}"
        );
        for (t, ranks, _) in &named {
            assert!(*t > onset && ranks.contains(&6), "at {t}: {ranks:?}");
        }
    }
}
