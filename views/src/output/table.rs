//! `--format table`: a row per event as it happens, then live memory per process and kind.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Write};

use gpuprof_model::driver_api::result_name;
use gpuprof_model::event::{Event, Frame, Layer, Op};
use gpuprof_model::track::{LiveSummary, ProcessState};

use gpuprof_model::bytes::human as human_bytes;

use super::text::{fit, COLUMNS};

use super::{EndOfRun, EventSink};
use gpuprof_model::nvml::Reconciled;

/// Rows for driver calls, and for the exit of processes that made some; the fork and exec of
/// every helper process (shells, launchers) stay in the jsonl stream only.
pub(crate) struct TableSink {
    writer: Box<dyn Write>,
    header_written: bool,
    cuda_processes: HashSet<u32>,
    /// The findings at the end painted by severity (the writer is a terminal).
    colour: bool,
}

impl TableSink {
    pub(crate) fn new(writer: Box<dyn Write>, colour: bool) -> Self {
        TableSink { writer, header_written: false, cuda_processes: HashSet::new(), colour }
    }

    fn shows(&mut self, event: &Event) -> bool {
        match (event.layer, event.op) {
            (Layer::Process, Op::Exit) => self.cuda_processes.remove(&event.pid),
            (Layer::Process, _) => false,
            // gpuprof's own reading of the device, once a second: no call the process made.
            _ if event.api == gpuprof_model::nvml::READING_API => false,
            _ => {
                self.cuda_processes.insert(event.pid);
                true
            }
        }
    }
}

/// HH:MM:SS.mmm (UTC) of a wall-clock timestamp.
fn time_of_day(ts_ns: u64) -> String {
    let ms = ts_ns / 1_000_000;
    let (h, m, s) = ((ms / 3_600_000) % 24, (ms / 60_000) % 60, (ms / 1000) % 60);
    format!("{h:02}:{m:02}:{s:02}.{:03}", ms % 1000)
}

/// "train.py:88 forward": the file's base name, the line, the function.
fn short_frame(frame: &Frame) -> String {
    let file = frame.file.rsplit('/').next().unwrap_or(&frame.file);
    format!("{file}:{} {}", frame.line, frame.function)
}

/// The user's line, and the library function it called when that is another frame:
/// "train.py:42 evaluate < Linear.forward".
pub(crate) fn python_column(stack: &[Frame]) -> String {
    match (gpuprof_model::user_frame(stack), stack.first()) {
        (Some(user), Some(innermost)) if user != innermost => format!("{} < {}", short_frame(user), innermost.function),
        (_, Some(innermost)) if innermost.native_module().is_some() => innermost.to_string(),
        (_, Some(innermost)) => short_frame(innermost),
        (_, None) => String::new(),
    }
}

/// The columns before PYTHON take 89 of the 120.
const PYTHON_WIDTH: usize = COLUMNS - 89;

/// "ok", or the driver's name for the failure ("OUT_OF_MEMORY"; the number when it has none).
/// The PYTHON column in `width` characters: the called function goes first, then the middle of
/// the file name; the line number and the user's function stay.
fn python_fitted(stack: &[Frame], width: usize) -> String {
    let full = python_column(stack);
    if full.chars().count() <= width {
        return full;
    }
    let Some(frame) = gpuprof_model::user_frame(stack).or(stack.first()).filter(|f| f.native_module().is_none()) else {
        return fit(&full, width);
    };
    let file = frame.file.rsplit('/').next().unwrap_or(&frame.file);
    let rest = format!(":{} {}", frame.line, frame.function);
    let room = width.saturating_sub(rest.chars().count());
    if room >= 6 {
        format!("{}{rest}", fit(file, room))
    } else {
        fit(&format!("{file}{rest}"), width)
    }
}

fn result_text(code: i32) -> String {
    match code {
        0 => "ok".to_string(),
        code => match result_name(code) {
            "UNKNOWN" => code.to_string(),
            name => name.to_string(),
        },
    }
}

fn state_text(state: ProcessState) -> String {
    match state {
        ProcessState::Running => "running".to_string(),
        // SIGINT: what Ctrl-C sends.
        ProcessState::Exited { signal: Some(2), .. } => "stopped (Ctrl-C)".to_string(),
        ProcessState::Exited { code, signal: Some(signal), .. } => format!("killed({signal}) {code}"),
        ProcessState::Exited { code, .. } => format!("exited({code})"),
        ProcessState::Replaced { .. } => "exec'd".to_string(),
    }
}

impl EventSink for TableSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        if !self.shows(event) {
            return Ok(());
        }
        if !self.header_written {
            writeln!(
                self.writer,
                "{:<12} {:>7} {:<10} {:<20} {:<10} {:>10} {:<13} PYTHON",
                "TIME", "PID", "COMM", "CALL", "OP", "SIZE", "RESULT"
            )?;
            self.header_written = true;
        }
        let (size, result) = match (event.layer, event.op) {
            (Layer::Process, Op::Exit) => (String::new(), format!("exit {}", event.exit_code.unwrap_or(0))),
            (Layer::Process, _) => (String::new(), String::new()),
            _ => (human_bytes(event.size), result_text(event.result)),
        };
        writeln!(
            self.writer,
            "{:<12} {:>7} {:<10} {:<20} {:<10} {:>10} {:<13} {}",
            time_of_day(event.ts),
            event.pid,
            fit(&event.comm, 10),
            fit(&event.api, 20),
            fit(event.op.as_str(), 10),
            size,
            fit(&result, 13),
            python_fitted(&event.attributed_stack(), PYTHON_WIDTH)
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()> {
        write_end_of_run(&mut self.writer, end, self.colour)?;
        self.writer.flush()
    }
}

/// Live memory per process, what NVML saw beside it, and the findings (`colour`: for a terminal).
pub(crate) fn write_end_of_run(writer: &mut dyn Write, end: &EndOfRun<'_>, colour: bool) -> io::Result<()> {
    write_live_summary(writer, end.processes)?;
    write_nvml(writer, end.processes, end.nvml)?;
    super::findings::write_table(writer, end.findings, colour)
}

/// Live bytes per process and kind, plus mappings, IPC imports and contexts still open, for every
/// process that made a driver call.
pub(crate) fn write_live_summary(writer: &mut dyn Write, processes: &[LiveSummary]) -> io::Result<()> {
    writeln!(writer)?;
    writeln!(writer, "Live GPU memory at end, per process and kind:")?;
    let processes: Vec<&LiveSummary> = processes.iter().filter(|p| p.driver_calls > 0).collect();
    if processes.is_empty() {
        return writeln!(writer, "(no process made a CUDA driver call)");
    }
    writeln!(
        writer,
        "{:>7} {:>7} {:<15} {:<14} {:<11} {:>10} {:>6} {:>10} {:>8} {:>5}",
        "PID", "PPID", "COMM", "STATE", "KIND", "LIVE", "COUNT", "MAPPED", "IPC OPEN", "CTX"
    )?;
    for process in &processes {
        let head = |writer: &mut dyn Write| {
            write!(
                writer,
                "{:>7} {:>7} {:<15} {:<14}",
                process.pid,
                process.ppid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                fit(&process.comm, 15),
                fit(&state_text(process.state), 14)
            )
        };
        let tail = format!("{:>10} {:>8} {:>5}", human_bytes(process.mapped_bytes), process.imports, process.contexts);
        if process.by_kind.is_empty() {
            head(writer)?;
            writeln!(writer, " {:<11} {:>10} {:>6} {tail}", "-", human_bytes(0), 0)?;
        }
        for (kind, total) in &process.by_kind {
            head(writer)?;
            writeln!(writer, " {:<11} {:>10} {:>6} {tail}", kind.as_str(), human_bytes(total.bytes), total.count)?;
        }
    }
    write_allocator_totals(writer, &processes)?;
    write_before_capture(writer, &processes)?;
    write_live_by_frame(writer, &processes)
}

/// The two curves people poll by hand — allocated (tensors) and reserved (the allocator's
/// segments) — and their gap, the cache, as the allocator last reported them.
fn write_allocator_totals(writer: &mut dyn Write, processes: &[&LiveSummary]) -> io::Result<()> {
    let reporting: Vec<&&LiveSummary> = processes.iter().filter(|p| p.allocator.is_some()).collect();
    if reporting.is_empty() {
        return Ok(());
    }
    writeln!(writer)?;
    writeln!(writer, "PyTorch caching allocator at end:")?;
    writeln!(writer, "{:>7} {:>12} {:>12} {:>12} {:>7}", "PID", "ALLOCATED", "RESERVED", "CACHED (GAP)", "BLOCKS")?;
    for process in reporting {
        let totals = process.allocator.expect("filtered");
        writeln!(
            writer,
            "{:>7} {:>12} {:>12} {:>12} {:>7}",
            process.pid,
            human_bytes(totals.allocated),
            human_bytes(totals.reserved),
            human_bytes(totals.reserved.saturating_sub(totals.allocated)),
            process.blocks.count
        )?;
    }
    Ok(())
}

/// Memory a process already held when gpuprof first heard from its allocator (attached to a
/// running job): in no table above, since no captured call made it.
fn write_before_capture(writer: &mut dyn Write, processes: &[&LiveSummary]) -> io::Result<()> {
    let held: Vec<&&LiveSummary> = processes.iter().filter(|p| p.before_capture.is_some()).collect();
    if held.is_empty() {
        return Ok(());
    }
    writeln!(writer)?;
    writeln!(
        writer,
        "Held before the capture started (the allocator's first report, less what gpuprof saw; not in the rows above):"
    )?;
    writeln!(writer, "{:>7} {:>12} {:>12}", "PID", "ALLOCATED", "RESERVED")?;
    for process in held {
        let before = process.before_capture.expect("filtered");
        writeln!(
            writer,
            "{:>7} {:>12} {:>12}",
            process.pid,
            human_bytes(before.allocated),
            human_bytes(before.reserved)
        )?;
    }
    Ok(())
}

/// Each process's used memory as the driver accounts it (NVML, nvidia-smi's figure) beside what
/// the probed calls hold; the difference is memory no probed call made.
fn write_nvml(writer: &mut dyn Write, processes: &[LiveSummary], nvml: &BTreeMap<u32, Reconciled>) -> io::Result<()> {
    if nvml.is_empty() {
        return Ok(());
    }
    writeln!(writer)?;
    writeln!(
        writer,
        "GPU memory per process as the driver accounts it (NVML, as nvidia-smi shows), last seen while running;"
    )?;
    writeln!(
        writer,
        "NOT PROBED = NVML USED - PROBED CALLS: the CUDA context, modules, memory from before the capture or from"
    )?;
    writeln!(writer, "calls gpuprof does not probe:")?;
    writeln!(writer, "{:>7} {:<15} {:>12} {:>12} {:>12}", "PID", "COMM", "NVML USED", "PROBED CALLS", "NOT PROBED")?;
    for (pid, seen) in nvml {
        let comm = processes.iter().rev().find(|p| p.pid == *pid).map(|p| p.comm.as_str()).unwrap_or("");
        writeln!(
            writer,
            "{:>7} {:<15} {:>12} {:>12} {:>12}",
            pid,
            fit(comm, 15),
            human_bytes(seen.nvml_used),
            human_bytes(seen.probed),
            signed_bytes(seen.not_probed())
        )?;
    }
    Ok(())
}

/// The by-line table's columns before FRAME take 39 of the 120.
const FRAME_WIDTH: usize = COLUMNS - 39;

/// Human bytes with a sign: what NVML sees beyond the probed calls may be less than them.
fn signed_bytes(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", human_bytes(bytes.unsigned_abs()))
    } else {
        human_bytes(bytes as u64)
    }
}

/// Frames per process shown in the summary; the rest are summed in one line.
const FRAMES_SHOWN: usize = 10;

/// Live bytes grouped by the user's line of the allocating call.
fn write_live_by_frame(writer: &mut dyn Write, processes: &[&LiveSummary]) -> io::Result<()> {
    if processes.iter().all(|p| p.by_frame.is_empty()) {
        return Ok(());
    }
    writeln!(writer)?;
    writeln!(writer, "Live GPU memory at end, by the user's line (the innermost frame outside the standard library and installed packages):")?;
    writeln!(writer, "{:>7} {:<11} {:>10} {:>6}  FRAME", "PID", "KIND", "LIVE", "COUNT")?;
    for process in processes {
        for entry in process.by_frame.iter().take(FRAMES_SHOWN) {
            let frame = match &entry.frame {
                Some(frame) => frame.to_string(),
                None => "(no Python stack)".to_string(),
            };
            writeln!(
                writer,
                "{:>7} {:<11} {:>10} {:>6}  {}",
                process.pid,
                entry.kind.as_str(),
                human_bytes(entry.total.bytes),
                entry.total.count,
                fit(&frame, FRAME_WIDTH)
            )?;
        }
        let rest: Vec<_> = process.by_frame.iter().skip(FRAMES_SHOWN).collect();
        if !rest.is_empty() {
            let bytes: u64 = rest.iter().map(|e| e.total.bytes).sum();
            let count: u64 = rest.iter().map(|e| e.total.count).sum();
            writeln!(
                writer,
                "{:>7} {:<11} {:>10} {:>6}  ({} more frames)",
                process.pid,
                "",
                human_bytes(bytes),
                count,
                rest.len()
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_stopped_with_ctrl_c_says_so() {
        let exited = |code, signal| ProcessState::Exited { code, signal, ts: 0 };
        assert_eq!(state_text(exited(130, Some(2))), "stopped (Ctrl-C)");
        assert_eq!(state_text(exited(137, Some(9))), "killed(9) 137");
        assert_eq!(state_text(exited(1, None)), "exited(1)");
    }

    #[test]
    fn clock_text() {
        assert_eq!(time_of_day(((3600 + 2 * 60 + 3) * 1000 + 45) * 1_000_000), "01:02:03.045");
        assert_eq!(result_text(2), "OUT_OF_MEMORY");
        assert_eq!(result_text(123456), "123456");
        assert_eq!(result_text(0), "ok");
        let frame = |file: &str, line, function: &str| Frame { file: file.into(), line, function: function.into() };
        let stack = [
            frame("/v/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134, "Linear.forward"),
            frame("/src/train.py", 42, "evaluate"),
        ];
        assert_eq!(python_column(&stack), "train.py:42 evaluate < Linear.forward");
        assert_eq!(python_column(&stack[1..]), "train.py:42 evaluate");
        assert_eq!(python_column(&stack[..1]), "linear.py:134 Linear.forward");
        assert_eq!(python_column(&[]), "");
        assert_eq!(python_fitted(&stack, 29), "train.py:42 evaluate");
        assert_eq!(python_fitted(&stack, 37), "train.py:42 evaluate < Linear.forward");
        let deep = [frame("/src/a_rather_long_module_name.py", 1234, "Trainer.step")];
        assert_eq!(python_fitted(&deep, 29), "a_rat…me.py:1234 Trainer.step");
        assert_eq!(python_fitted(&deep, 29).chars().count(), 29);
    }
}
