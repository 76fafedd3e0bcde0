//! What a post-mortem's report says above its pictures: what the window is and what opens it,
//! which part of it has tensor detail — the allocator's events, every tensor with its stack,
//! which a node's daemon records only while a process is raised (its memory grows, its device
//! is nearly full, it ran out, or someone asked) — and why, and whether a cap cut it short.

use gpuprof_model::findings::wording;

/// A process raised to tensor events, as the flow decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Raise {
    pub pid: u32,
    pub ts: u64,
    /// Why, in words ("device 0 has 3.1 GiB free of 80.0 GiB").
    pub why: String,
}

/// What one process of a post-mortem's recording shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProcessDetail {
    pub pid: u32,
    pub comm: String,
    /// What the prologue rebuilt: driver allocations and mappings, tensors.
    pub prologue_allocations: u64,
    pub prologue_tensors: u64,
    /// The window's allocator events: how many, the first and the last (ns).
    pub tensor_events: u64,
    pub first_tensor: Option<u64>,
    pub last_tensor: Option<u64>,
    /// The newest event a memory cap dropped from its window (0: none), and the first it kept.
    pub shed_until: u64,
    pub first_kept: Option<u64>,
}

/// The finding a post-mortem is for.
pub(crate) struct About<'a> {
    pub kind: &'a str,
    pub pid: u32,
    pub comm: &'a str,
    pub node: &'a str,
}

/// Allocator events this close to the window's edge count as reaching it (a raise's first
/// tensor comes with the process's next step; the failure is the last driver call).
const EDGE_NS: u64 = 1_000_000_000;

/// The report's notes, in the order they are read.
pub(crate) fn notes(
    about: &About<'_>,
    start: u64,
    end: u64,
    window_ns: u64,
    processes: &[ProcessDetail],
    raises: &[Raise],
) -> Vec<String> {
    let at = |ts: u64| seconds(ts.saturating_sub(start));
    let moment = if about.kind == "oom" { "the failure" } else { "the finding" };
    let span = end.saturating_sub(start);
    let (allocations, tensors) =
        processes.iter().fold((0, 0), |(a, t), p| (a + p.prologue_allocations, t + p.prologue_tensors));
    let mut notes = vec![format!(
        "Post-mortem of the {} of {} on node {}: the last {} before it ({} to {} UTC). It opens with what each process held then, made earlier: {} and {}, stamped at its first instant.",
        about.kind,
        wording::process(about.pid, about.comm),
        about.node,
        seconds(span),
        clock(start),
        clock(end),
        wording::count(allocations, "driver allocation or mapping", "driver allocations and mappings"),
        wording::count(tensors, "tensor", "tensors"),
    )];
    if span + EDGE_NS < window_ns && processes.iter().all(|p| p.shed_until == 0) {
        notes.push(format!(
            "The window is {} rather than {}: gpuprof saw nothing of {} before.",
            seconds(span),
            seconds(window_ns),
            wording::process(about.pid, about.comm)
        ));
    }
    for process in processes {
        let who = wording::process(process.pid, &process.comm);
        if process.shed_until > 0 && process.shed_until.saturating_add(window_ns) >= end {
            let reach = process.first_kept.map_or(0, |first| end.saturating_sub(first));
            notes.push(format!(
                "{who}: its window reaches back only {} before {moment} (of {} asked): a memory cap of the daemon (--postmortem-process-mib, --postmortem-node-mib) dropped its older events.",
                seconds(reach),
                seconds(window_ns)
            ));
        }
        let (Some(first), Some(last)) = (process.first_tensor, process.last_tensor) else {
            notes.push(format!(
                "{who}: no tensor detail in this window, the driver's calls only (the daemon records every tensor while a process's memory grows, its device is nearly full or it ran out, or when asked: docs/levels.md)."
            ));
            continue;
        };
        let from = if first <= start + EDGE_NS {
            "from the window's start".to_string()
        } else {
            format!("from {}", at(first))
        };
        let (to, after) = if last + EDGE_NS >= end {
            (format!("to {moment} at {}", at(end)), "")
        } else {
            (format!("to {}", at(last)), "; the driver's calls only after it")
        };
        let why = raises.iter().filter(|r| r.pid == process.pid && r.ts <= first + EDGE_NS).max_by_key(|r| r.ts).map(
            |raise| {
                let when = if raise.ts >= start {
                    format!("at {}", at(raise.ts))
                } else {
                    format!("{} before the window", seconds(start - raise.ts))
                };
                format!(" (raised {when}: {})", raise.why)
            },
        );
        notes.push(format!(
            "{who}: tensor detail ({}) {from} {to} of the window{}{after}.",
            wording::count(process.tensor_events, "allocator event", "allocator events"),
            why.unwrap_or_default()
        ));
    }
    notes
}

/// "41.2 s".
fn seconds(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

/// "12:03:04" of `ts` (ns since the epoch), UTC.
fn clock(ts: u64) -> String {
    let stamp = super::directory::utc_stamp(ts);
    let time = &stamp[9..];
    format!("{}-{}-{} {}:{}:{}", &stamp[..4], &stamp[4..6], &stamp[6..8], &time[..2], &time[2..4], &time[4..6])
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    /// 2026-11-27 01:16:17 UTC.
    const END: u64 = 1_795_742_177 * S;

    #[test]
    fn the_notes_say_the_window_what_opens_it_and_where_tensors_were_recorded_and_why() {
        let start = END - 60 * S;
        let about = About { kind: "oom", pid: 4711, comm: "python3", node: "gpu-1" };
        let raised = ProcessDetail {
            pid: 4711,
            comm: "python3".into(),
            prologue_allocations: 3,
            prologue_tensors: 1204,
            tensor_events: 52_000,
            first_tensor: Some(start + 41_200_000_000),
            last_tensor: Some(END - S / 2),
            shed_until: 0,
            first_kept: Some(start),
        };
        let neighbour =
            ProcessDetail { pid: 4712, comm: "python3".into(), prologue_allocations: 2, ..Default::default() };
        let throughout = ProcessDetail {
            pid: 4713,
            comm: "".into(),
            tensor_events: 7,
            first_tensor: Some(start + S / 2),
            last_tensor: Some(start + 20 * S),
            ..Default::default()
        };
        let raises = [
            Raise { pid: 4711, ts: start + 41 * S, why: "device 0 has 3.1 GiB free of 80.0 GiB".into() },
            Raise { pid: 4713, ts: start - 30 * S, why: "asked for through the daemon's API".into() },
        ];
        let said = notes(&about, start, END, 60 * S, &[raised, neighbour, throughout], &raises);
        assert_eq!(
            said,
            [
                "Post-mortem of the oom of pid 4711 (python3) on node gpu-1: the last 60.0 s before it (2026-11-27 01:15:17 to 2026-11-27 01:16:17 UTC). It opens with what each process held then, made earlier: 5 driver allocations and mappings and 1204 tensors, stamped at its first instant.",
                "pid 4711 (python3): tensor detail (52000 allocator events) from 41.2 s to the failure at 60.0 s of the window (raised at 41.0 s: device 0 has 3.1 GiB free of 80.0 GiB).",
                "pid 4712 (python3): no tensor detail in this window, the driver's calls only (the daemon records every tensor while a process's memory grows, its device is nearly full or it ran out, or when asked: docs/levels.md).",
                "pid 4713: tensor detail (7 allocator events) from the window's start to 20.0 s of the window (raised 30.0 s before the window: asked for through the daemon's API); the driver's calls only after it.",
            ]
        );
        // A window shorter than asked because the process began in it is said too.
        let young = ProcessDetail { pid: 9, comm: "x".into(), first_kept: Some(END - 5 * S), ..Default::default() };
        let about = About { kind: "growth", pid: 9, comm: "x", node: "n" };
        let said = notes(&about, END - 5 * S, END, 60 * S, &[young], &[]);
        assert_eq!(said[1], "The window is 5.0 s rather than 60.0 s: gpuprof saw nothing of pid 9 (x) before.");
    }
}
