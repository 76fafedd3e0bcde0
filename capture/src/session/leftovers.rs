//! After the target of a capture ends, processes it started may still hold GPU memory (workers
//! left behind): they are named, with what they hold, and followed until they end, the deadline
//! passes or a signal says stop. Those holding nothing (multiprocessing's resource tracker, a
//! shell) usually end a moment after the target, when its pipes close: they get that moment, so
//! that one run records their exits as the next does.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Ended, Every, Session, Until};
use gpuprof_procfs::process;

/// A live followed process holding device memory or a CUDA context.
struct Holder {
    pid: u32,
    comm: String,
    bytes: u64,
    contexts: u32,
}

/// `what` names the target in the messages ("process", "command"); `hooks` run as they do in
/// the capture's own loop.
pub fn follow<'c>(
    session: &mut Session<'c>,
    deadline: Option<Instant>,
    what: &str,
    hooks: &mut [Every<'_, 'c>],
) -> Result<()> {
    let moment = Instant::now() + LINGER;
    let only_holders_left = |session: &Session<'_>| running_holding_nothing(session) == 0;
    if !only_holders_left(session) {
        session.run(Until::Holds(&only_holders_left), Some(deadline.map_or(moment, |d| d.min(moment))), hooks)?;
    }
    let holding = holders(session);
    if holding.is_empty() {
        return Ok(());
    }
    session.flow_mut().notice(format!(
        "the {what} exited, but {} still {}: following until they exit (Ctrl-C stops gpuprof and leaves them running; `kill {}` ends them)",
        describe(&holding),
        if holding.len() == 1 { "holds GPU memory" } else { "hold GPU memory" },
        pids(&holding),
    ));
    let none_left = |session: &Session<'_>| holders(session).is_empty();
    let ended = session.run(Until::Holds(&none_left), deadline, hooks)?;
    let holding = holders(session);
    let said = match ended {
        Ended::Held => "the processes left behind have exited".to_string(),
        // The last one may have gone between the loop's check and this one.
        _ if holding.is_empty() => "the processes left behind have exited".to_string(),
        _ => format!(
            "stopped following; still running and holding GPU memory: {} (follow them with `gpuprof attach PID`, end them with `kill {}`)",
            describe(&holding),
            pids(&holding)
        ),
    };
    session.flow_mut().notice(said);
    Ok(())
}

/// How long the processes left behind that hold nothing are waited for.
const LINGER: Duration = Duration::from_millis(500);

/// Followed processes still running that hold no device memory and no CUDA context.
fn running_holding_nothing(session: &Session<'_>) -> usize {
    let tracker = session.flow().analyzer().tracker();
    let holds_nothing = |p: &&gpuprof_model::track::ProcessMemory| p.device_bytes() == 0 && p.contexts() == 0;
    tracker.live_processes().into_iter().filter(holds_nothing).filter(|p| process::is_running(p.pid)).count()
}

fn holders(session: &Session<'_>) -> Vec<Holder> {
    session
        .flow()
        .analyzer()
        .tracker()
        .live_processes()
        .into_iter()
        .filter(|p| (p.device_bytes() > 0 || p.contexts() > 0) && process::is_running(p.pid))
        .map(|p| Holder { pid: p.pid, comm: p.comm.to_string(), bytes: p.device_bytes(), contexts: p.contexts() })
        .collect()
}

/// "pid 12 (python3) 1.0 GiB and a CUDA context, pid 13 (python3) a CUDA context".
fn describe(holders: &[Holder]) -> String {
    let one = |holder: &Holder| {
        let held = match (holder.bytes, holder.contexts) {
            (0, _) => "a CUDA context".to_string(),
            (bytes, 0) => gpuprof_model::bytes::human(bytes),
            (bytes, _) => format!("{} and a CUDA context", gpuprof_model::bytes::human(bytes)),
        };
        format!("pid {} ({}) {held}", holder.pid, holder.comm)
    };
    holders.iter().map(one).collect::<Vec<_>>().join(", ")
}

fn pids(holders: &[Holder]) -> String {
    holders.iter().map(|holder| holder.pid.to_string()).collect::<Vec<_>>().join(" ")
}
