//! `rank_divergence`: one rank of a distributed job holds far more than its peers. The ranks of a
//! data-parallel job run the same program on the same shapes, so what one holds the others hold
//! too, give or take a step's activations; a rank whose allocated memory keeps more — a tensor
//! kept every step on that rank only, a cache filled by one rank's branch — is the one to look
//! at, and the Python lines that hold its difference say why.
//!
//! The comparison is robust to where each rank is inside its step: a rank's floor (the least it
//! held over the recent window) is held against its peers' ceilings (the most each held over the
//! same window), every rank seen over the whole window and heard from in it (a job's first
//! figures are any moment of a step). A rank diverges when its floor sits above the peers' median ceiling by
//! `min_bytes` and by `min_fraction` of that median. Three ranks at least: with two, neither is
//! the odd one out. Each rank of a job is reported once, until it is back among its peers.
//!
//! The job's ranks can live on many nodes: the fleet's collector, which holds the job whole
//! (docs/collector.md), runs this over the ranks' allocator gauges and memory profiles.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{wording, Finding, FindingKind, StackBytes};
use crate::bytes::human;
use crate::event::Frame;

/// The differing stacks a finding names.
const TOP_STACKS: usize = 5;

/// Thresholds of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DivergenceConfig {
    /// How far back a rank's floor and its peers' ceilings are taken (ns).
    pub window_ns: u64,
    /// A floor this far above the peers' median ceiling, at least…
    pub min_bytes: u64,
    /// …and this share of that median.
    pub min_fraction: f64,
    /// Fewer ranks than this are not compared.
    pub min_ranks: usize,
}

impl Default for DivergenceConfig {
    fn default() -> Self {
        DivergenceConfig { window_ns: 5_000_000_000, min_bytes: 64 << 20, min_fraction: 0.10, min_ranks: 3 }
    }
}

/// One rank of a job as its node last told it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankMemory {
    pub rank: u32,
    pub node: String,
    pub pid: u32,
    pub comm: String,
    /// When the process instance was first seen (names it, with the pid).
    pub since: u64,
    /// Its allocator's allocated bytes (all devices) over time, oldest first.
    pub allocated: Vec<(u64, u64)>,
    /// Its latest memory profile: live bytes by Python stack.
    pub stacks: Vec<(Vec<Frame>, u64)>,
}

/// The ranks of one job whose divergence was reported, until they are back among their peers.
#[derive(Debug, Default, Clone)]
pub struct Divergences {
    reported: HashMap<String, HashSet<u32>>,
}

impl Divergences {
    /// The findings `ranks` (every rank of `job` seen, as of `now`) give, each rank once.
    pub fn check(&mut self, job: &str, ranks: &[RankMemory], now: u64, config: &DivergenceConfig) -> Vec<Finding> {
        let diverging = diverging(ranks, now, config);
        let reported = self.reported.entry(job.to_string()).or_default();
        reported.retain(|rank| diverging.iter().any(|d| d.rank.rank == *rank));
        diverging
            .into_iter()
            .filter(|d| reported.insert(d.rank.rank))
            .map(|d| finding(job, ranks, &d, now, config))
            .collect()
    }

    /// Forgets a job that is gone.
    pub fn forget(&mut self, job: &str) {
        self.reported.remove(job);
    }
}

struct Diverging<'a> {
    rank: &'a RankMemory,
    floor: u64,
    peers_median: u64,
}

fn diverging<'a>(ranks: &'a [RankMemory], now: u64, config: &DivergenceConfig) -> Vec<Diverging<'a>> {
    if ranks.len() < config.min_ranks {
        return Vec::new();
    }
    let since = now.saturating_sub(config.window_ns);
    // What a rank held over the whole window: the figure in effect as it began, and every one
    // after. None for a rank not seen that long (a job starting: its first figures are any
    // moment of a step) or silent through it (nothing to hold the others against at that time).
    let over_window = |rank: &RankMemory| -> Option<Vec<u64>> {
        let at_start = rank.allocated.iter().rposition(|(ts, _)| *ts <= since)?;
        let held: Vec<u64> = rank.allocated[at_start..].iter().map(|(_, bytes)| *bytes).collect();
        rank.allocated.last().filter(|(ts, _)| *ts > since).map(|_| held)
    };
    let Some(windows) = ranks.iter().map(over_window).collect::<Option<Vec<Vec<u64>>>>() else {
        return Vec::new();
    };
    let ceilings: Vec<u64> = windows.iter().map(|w| *w.iter().max().expect("not empty")).collect();
    let peers_medians = medians_of_the_others(&ceilings);
    let mut found = Vec::new();
    for (i, rank) in ranks.iter().enumerate() {
        let floor = *windows[i].iter().min().expect("not empty");
        let peers_median = peers_medians[i].unwrap_or(0);
        let over = floor.saturating_sub(peers_median);
        if over >= config.min_bytes && over as f64 >= config.min_fraction * peers_median as f64 {
            found.push(Diverging { rank, floor, peers_median });
        }
    }
    found
}

/// For each of `values`, the median of all the others (None for a value alone): what a rank is
/// held against. Sorted once, not once a value.
pub fn medians_of_the_others(values: &[u64]) -> Vec<Option<u64>> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    // Among the n - 1 others, the lower middle one: its index there.
    let k = values.len().saturating_sub(2) / 2;
    values
        .iter()
        .map(|value| {
            if values.len() < 2 {
                return None;
            }
            // Equal values are interchangeable: dropping any one of them leaves the same others.
            let at = sorted.partition_point(|v| v < value);
            Some(if k < at { sorted[k] } else { sorted[k + 1] })
        })
        .collect()
}

/// The median (the lower of the two middle values of an even count).
fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get((sorted.len().max(1) - 1) / 2).copied().unwrap_or(0)
}

/// The stacks that make the difference: the rank's live bytes at each stack over its peers'
/// median there, most first.
fn difference(rank: &RankMemory, peers: &[&RankMemory]) -> Vec<StackBytes> {
    let mut at: BTreeMap<&[Frame], Vec<u64>> = BTreeMap::new();
    for (stack, _) in &rank.stacks {
        at.entry(stack.as_slice()).or_default();
    }
    for peer in peers {
        for (stack, bytes) in &peer.stacks {
            if let Some(held) = at.get_mut(stack.as_slice()) {
                held.push(*bytes);
            }
        }
    }
    let mut more: Vec<StackBytes> = rank
        .stacks
        .iter()
        .filter_map(|(stack, bytes)| {
            let mut held = at[stack.as_slice()].clone();
            // A peer without the stack holds nothing there.
            held.resize(peers.len(), 0);
            let over = bytes.saturating_sub(median(&held));
            (over > 0).then(|| StackBytes { stack: stack.clone(), bytes: over, count: 1 })
        })
        .collect();
    more.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.stack.cmp(&b.stack)));
    more.truncate(TOP_STACKS);
    more
}

fn finding(job: &str, ranks: &[RankMemory], d: &Diverging<'_>, now: u64, config: &DivergenceConfig) -> Finding {
    let rank = d.rank;
    let peers: Vec<&RankMemory> = ranks.iter().filter(|r| r.rank != rank.rank).collect();
    let stacks = difference(rank, &peers);
    let main = stacks.first().map(|s| s.stack.clone()).unwrap_or_default();
    let over = d.floor - d.peers_median;
    let held_at = match stacks.first() {
        Some(top) => format!("; {} of the difference is held {}", human(top.bytes), wording::at(&top.stack)),
        None => "; its memory profile has not come yet to say where".to_string(),
    };
    let detail = format!(
        "rank {} of job {job} ({} on {}) held at least {} allocated over the last {} s, {} over the median of its {} ({}){held_at}",
        rank.rank,
        wording::process(rank.pid, &rank.comm),
        rank.node,
        human(d.floor),
        config.window_ns / 1_000_000_000,
        human(over),
        wording::count(peers.len() as u64, "peer", "peers"),
        human(d.peers_median),
    );
    let first_ts = rank.allocated.first().map_or(now, |(ts, _)| *ts);
    let mut finding =
        Finding::new(FindingKind::RankDivergence, rank.pid, &rank.comm, over, 1, first_ts, now, &main, detail);
    finding.rank = Some(rank.rank);
    finding.job = Some(job.to_string());
    finding.stacks = stacks;
    finding.complete(rank.since)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const S: u64 = 1_000_000_000;

    fn ten_seconds() -> DivergenceConfig {
        DivergenceConfig { window_ns: 10 * S, ..DivergenceConfig::default() }
    }

    fn frame(line: u32) -> Frame {
        Frame { function: "step".into(), file: "train.py".into(), line }
    }

    /// A rank that held `base` plus `kept` more each second for 10 s, its profile `stacks`.
    fn rank(rank: u32, base: u64, kept: u64, stacks: Vec<(Vec<Frame>, u64)>) -> RankMemory {
        RankMemory {
            rank,
            node: if rank < 2 { "node-a" } else { "node-b" }.into(),
            pid: 100 + rank,
            comm: "python3".into(),
            since: 7,
            allocated: (0..=10).map(|s| (s * S, base + s * kept + (s % 2) * 8 * MIB)).collect(),
            stacks,
        }
    }

    #[test]
    fn the_rank_that_keeps_a_block_every_step_is_the_one_and_its_line_says_why() {
        let model = (vec![frame(30)], 512 * MIB);
        let ranks: Vec<RankMemory> = (0..4)
            .map(|r| {
                let kept = if r == 3 { 40 * MIB } else { 0 };
                let mut stacks = vec![model.clone()];
                if r == 3 {
                    stacks.push((vec![frame(42)], 320 * MIB));
                }
                rank(r, 512 * MIB, kept, stacks)
            })
            .collect();
        let mut divergences = Divergences::default();
        let found = divergences.check("torchrun:job-1", &ranks, 12 * S, &ten_seconds());
        assert_eq!(found.len(), 1, "{found:#?}");
        let f = &found[0];
        assert_eq!((f.kind, f.pid, f.rank), (FindingKind::RankDivergence, 103, Some(3)));
        // Floor over seconds 2..=10: 512 + 80 MiB; the peers' ceilings 520 MiB.
        assert_eq!(f.bytes, 72 * MIB);
        assert_eq!(f.stack, vec![frame(42)]);
        assert_eq!(f.stacks.len(), 1);
        assert_eq!((f.stacks[0].bytes, f.user_frame.as_ref().map(|u| u.line)), (320 * MIB, Some(42)));
        assert_eq!(
            f.detail,
            "rank 3 of job torchrun:job-1 (pid 103 (python3) on node-b) held at least 592.0 MiB allocated over the \
             last 10 s, 72.0 MiB over the median of its 3 peers (520.0 MiB); 320.0 MiB of the difference is held at \
             train.py:42 in step"
        );
        assert_eq!((f.first_ts, f.last_ts), (0, 12 * S));
        assert!(!f.finding_id.is_empty());
        // Once: the same state again says nothing.
        assert!(divergences.check("torchrun:job-1", &ranks, 12 * S, &ten_seconds()).is_empty());
    }

    #[test]
    fn the_median_of_the_others_is_the_lower_middle_of_the_rest() {
        assert_eq!(medians_of_the_others(&[520, 520, 520, 592]), [Some(520), Some(520), Some(520), Some(520)]);
        assert_eq!(medians_of_the_others(&[1, 5, 3, 9, 7]), [Some(5), Some(3), Some(5), Some(3), Some(3)]);
        assert_eq!(medians_of_the_others(&[4, 8]), [Some(8), Some(4)]);
        assert_eq!(medians_of_the_others(&[4]), [None]);
        assert!(medians_of_the_others(&[]).is_empty());
    }

    #[test]
    fn ranks_alike_within_a_step_and_too_few_ranks_say_nothing() {
        let ranks: Vec<RankMemory> = (0..4).map(|r| rank(r, 512 * MIB, 0, vec![])).collect();
        let config = ten_seconds();
        assert!(Divergences::default().check("job", &ranks, 10 * S, &config).is_empty());
        let two: Vec<RankMemory> = vec![rank(0, 512 * MIB, 0, vec![]), rank(1, 2048 * MIB, 0, vec![])];
        assert!(Divergences::default().check("job", &two, 10 * S, &config).is_empty());
        // A rank silent over the window: the others are not held against an old figure.
        let mut late = (0..4).map(|r| rank(r, 512 * MIB, 0, vec![])).collect::<Vec<_>>();
        late[3].allocated = vec![(0, 4096 * MIB)];
        assert!(Divergences::default().check("job", &late, 20 * S, &config).is_empty());
        // A job seen for less than the window: its first figures are any moment of a step.
        let mut starting = (0..4).map(|r| rank(r, 512 * MIB, 0, vec![])).collect::<Vec<_>>();
        starting[3].allocated = vec![(4 * S, 4096 * MIB), (5 * S, 4096 * MIB)];
        assert!(Divergences::default().check("job", &starting, 10 * S, &config).is_empty());
        starting[3].allocated.insert(0, (0, 4096 * MIB));
        assert_eq!(Divergences::default().check("job", &starting, 10 * S, &config).len(), 1);
    }

    #[test]
    fn a_rank_above_by_less_than_the_thresholds_is_among_its_peers() {
        // 48 MiB over: under 64 MiB.
        let mut ranks: Vec<RankMemory> = (0..4).map(|r| rank(r, 512 * MIB, 0, vec![])).collect();
        ranks[1] = rank(1, 568 * MIB, 0, vec![]);
        assert!(Divergences::default().check("job", &ranks, 10 * S, &ten_seconds()).is_empty());
        // 100 MiB over a median of 8 GiB: under 10 %.
        let mut big: Vec<RankMemory> = (0..4).map(|r| rank(r, 8192 * MIB, 0, vec![])).collect();
        big[2] = rank(2, 8300 * MIB, 0, vec![]);
        assert!(Divergences::default().check("job", &big, 10 * S, &ten_seconds()).is_empty());
    }

    #[test]
    fn a_rank_back_among_its_peers_is_reported_again_when_it_strays_again() {
        let config = ten_seconds();
        let mut ranks: Vec<RankMemory> = (0..3).map(|r| rank(r, 512 * MIB, 0, vec![])).collect();
        let mut divergences = Divergences::default();
        ranks[2] = rank(2, 1024 * MIB, 0, vec![]);
        assert_eq!(divergences.check("job", &ranks, 10 * S, &config).len(), 1);
        ranks[2] = rank(2, 512 * MIB, 0, vec![]);
        assert!(divergences.check("job", &ranks, 10 * S, &config).is_empty());
        ranks[2] = rank(2, 1024 * MIB, 0, vec![]);
        assert_eq!(divergences.check("job", &ranks, 10 * S, &config).len(), 1);
    }
}
