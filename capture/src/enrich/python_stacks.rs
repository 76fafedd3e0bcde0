//! Python stacks for captured calls: finds each tracked process's interpreter (and tells the
//! kernel-side walk where it keeps its threads and frames), then turns the (code object,
//! instruction) pairs of each record into `file:line function` frames.
//!
//! A process that has just exec'd may not have mapped libpython yet: it is looked for again on
//! every turn of the capture loop until it has, for a while.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuprof_ebpf::types::{gp_python, gp_stack_of};
use gpuprof_model::event::{Event, Frame, StackOrigin};
use gpuprof_model::Stack;
use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::strings::decode;
use gpuprof_pystack::{find_interpreter, Interpreter, RemoteMemory, Symbolizer};

use crate::kernel::{flags, Capture, Record};

/// How long a new program is looked at for an interpreter before it counts as not Python.
const DISCOVERY_WINDOW: Duration = Duration::from_secs(3);
const NO_OFFSET: u16 = gpuprof_ebpf::header::GP_NO_OFFSET as u16;

struct PythonProcess {
    interpreter: Interpreter,
    symbolizer: Symbolizer,
    /// Stacks already made, by the kernel's (code object, instruction) pairs: a training loop
    /// repeats a few hundred stacks tens of thousands of times a second, and each is symbolized
    /// once and then shared by every event that has it.
    stacks: HashMap<Box<[(u64, u64)]>, Stack>,
    /// The same, by the hash the allocator probe names a stack with once it sent its frames,
    /// and those frames (kept apart: a code object described again at a reused address makes
    /// the symbolized stacks wrong, not the frames).
    by_hash: HashMap<u64, Stack>,
    frames_by_hash: HashMap<u64, Box<[(u64, u64)]>>,
    /// What the kernel-side walk was configured with: its program's generation and the epoch of
    /// the stacks it was sent by hash (moved on when `frames_by_hash` is given up).
    generation: u32,
    stack_epoch: u32,
    epoch_stale: bool,
}

/// Stacks kept per process before the cache starts over (a program that keeps making new
/// stacks, with generated code say, does not grow the agent without bound).
const STACK_CACHE_LIMIT: usize = 1 << 16;

/// Counts that end up in the statistics line.
#[derive(Debug, Default, Clone, Copy)]
pub struct StackCounts {
    pub interpreters: u64,
    pub symbolized: u64,
    /// Stacks that could not be symbolized (the process was gone, memory unreadable).
    pub unresolved: u64,
}

#[derive(Default)]
pub(crate) struct Pythons {
    processes: HashMap<u32, PythonProcess>,
    /// pid → until when to keep looking for its interpreter.
    looking: HashMap<u32, Instant>,
    generations: u32,
    pub counts: StackCounts,
    /// Processes whose stacks cannot be read, and why, until said.
    warnings: Vec<String>,
}

/// The kernel-side walk's view of an interpreter; `generation` tells one program from the next,
/// `stack_epoch` the stacks the agent keeps by hash from the ones it gave up.
pub(crate) fn walk_config(interpreter: &Interpreter, generation: u32, stack_epoch: u32) -> gp_python {
    let o = &interpreter.layout.offsets;
    gp_python {
        runtime: interpreter.runtime,
        generation,
        code_filename: o.code_filename,
        code_name: o.code_qualname.unwrap_or(o.code_name),
        code_firstlineno: o.code_firstlineno,
        code_linetable: o.code_linetable,
        unicode_state: o.unicode_state,
        unicode_length: o.unicode_length,
        unicode_ascii_size: o.unicode_ascii_size,
        unicode_compact_size: o.unicode_compact_size,
        bytes_size: o.bytes_size,
        bytes_data: o.bytes_data,
        interpreters_head: o.runtime_interpreters_head,
        threads_head: o.interp_threads_head,
        tstate_next: o.tstate_next,
        tstate_thread_id: o.tstate_thread_id,
        tstate_frame: o.tstate_frame,
        cframe_current_frame: o.cframe_current_frame.unwrap_or(NO_OFFSET),
        tstate_datastack_chunk: o.tstate_datastack_chunk.unwrap_or(NO_OFFSET),
        tstate_datastack_top: o.tstate_datastack_top.unwrap_or(NO_OFFSET),
        chunk_data: o.chunk_data.unwrap_or(NO_OFFSET),
        frame_code: o.frame_code,
        frame_previous: o.frame_previous,
        frame_instr: o.frame_instr,
        frame_owner: o.frame_owner.unwrap_or(NO_OFFSET),
        frame_read_len: frame_read_len(o),
        tstate_read_start: tstate_read(o).0,
        tstate_read_len: tstate_read(o).1,
        skip_cstack_frames: u8::from(interpreter.layout.has_cstack_frames),
        reserved: [0; 3],
        stack_epoch,
    }
}

/// The bytes from a frame's start that hold code, previous, instruction and owner: the walk
/// reads them at once. Fields are read as 8 bytes.
fn frame_read_len(o: &gpuprof_pystack::Offsets) -> u16 {
    let last = [Some(o.frame_code), Some(o.frame_previous), Some(o.frame_instr), o.frame_owner]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
    last + 8
}

/// (start, length) of the thread-state bytes that hold every field the walk reads.
fn tstate_read(o: &gpuprof_pystack::Offsets) -> (u16, u16) {
    let fields = [Some(o.tstate_thread_id), Some(o.tstate_frame), o.tstate_datastack_chunk, o.tstate_datastack_top];
    let start = fields.iter().flatten().copied().min().unwrap_or(0);
    let end = fields.iter().flatten().copied().max().unwrap_or(0) + 8;
    (start, end - start)
}

impl Pythons {
    /// Why some processes have no stacks, since the last call.
    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Starts looking for the interpreter of a process (a new program, or one attached to).
    pub(crate) fn look_for(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.looking.insert(pid, Instant::now() + DISCOVERY_WINDOW);
    }

    /// True while some process is still being looked at (the loop then polls quickly).
    pub(crate) fn is_looking(&self) -> bool {
        !self.looking.is_empty()
    }

    /// One look at every process still without an interpreter.
    pub(crate) fn discover(&mut self, capture: &Capture) {
        let now = Instant::now();
        let pids: Vec<u32> = self.looking.keys().copied().collect();
        for pid in pids {
            match find_interpreter(pid) {
                Ok(Some(interpreter)) => {
                    self.looking.remove(&pid);
                    self.generations = self.generations.wrapping_add(1) & 0xffff;
                    if let Err(error) = capture.set_python(pid, &walk_config(&interpreter, self.generations, 0)) {
                        tracing::warn!("{error:#}");
                        continue;
                    }
                    tracing::debug!(pid, version = %interpreter.layout.version, module = %interpreter.module, "found CPython");
                    self.counts.interpreters += 1;
                    self.insert(pid, interpreter, self.generations);
                }
                Ok(None) if now < self.looking[&pid] => {}
                Ok(None) => {
                    self.looking.remove(&pid);
                }
                Err(error) => {
                    self.looking.remove(&pid);
                    // A process that already exited has no stacks left to walk: nothing to say.
                    if gpuprof_procfs::process::exists(pid) {
                        self.warnings.push(format!("no Python stacks for pid {pid}: {error}"));
                    }
                }
            }
        }
    }

    fn insert(&mut self, pid: u32, interpreter: Interpreter, generation: u32) {
        let symbolizer = Symbolizer::new(interpreter.layout);
        self.processes.insert(
            pid,
            PythonProcess {
                interpreter,
                symbolizer,
                stacks: HashMap::new(),
                by_hash: HashMap::new(),
                frames_by_hash: HashMap::new(),
                generation,
                stack_epoch: 0,
                epoch_stale: false,
            },
        );
    }

    /// A forked child runs its parent's interpreter (the kernel copied the walk's settings; its
    /// threads send their stacks anew: they are other threads, in another address space).
    pub(crate) fn forked(&mut self, child: u32, parent: u32) {
        if let Some(parent) = self.processes.get(&parent) {
            let interpreter = Interpreter { pid: child, ..parent.interpreter.clone() };
            let (generation, epoch) = (parent.generation, parent.stack_epoch);
            self.insert(child, interpreter, generation);
            if let Some(process) = self.processes.get_mut(&child) {
                process.stack_epoch = epoch;
            }
        }
    }

    /// Processes whose stacks by hash were given up are told the new epoch: their threads send
    /// the frames of each stack again.
    pub(crate) fn refresh_epochs(&mut self, capture: &Capture) {
        for (pid, process) in self.processes.iter_mut().filter(|(_, p)| p.epoch_stale) {
            process.epoch_stale = false;
            process.stack_epoch = process.stack_epoch.wrapping_add(1);
            let config = walk_config(&process.interpreter, process.generation, process.stack_epoch);
            if let Err(error) = capture.set_python(*pid, &config) {
                tracing::warn!("{error:#}");
            }
        }
    }

    /// The process replaced its program or exited: its caches are wrong from now on.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.looking.remove(&pid);
    }

    /// A code object the kernel described: symbolizing it later needs no read of the process,
    /// which may have exited by then.
    pub(crate) fn remember(&mut self, record: &Record) {
        let (Some((code, data)), Some(process)) = (&record.code, self.processes.get_mut(&record.header.pid)) else {
            return;
        };
        let (name_len, file_len) = (usize::from(code.function_len), usize::from(code.file_len));
        let whole = code.function_kind != 0
            && code.file_kind != 0
            && name_len == code.function_chars as usize * usize::from(code.function_kind)
            && file_len == code.file_chars as usize * usize::from(code.file_kind)
            && usize::from(code.table_len) == code.table_size as usize;
        if !whole {
            return; // cut to its caps, or unreadable: read from the process when needed
        }
        let info = CodeInfo {
            function: decode(&data[..name_len], u32::from(code.function_kind)),
            file: decode(&data[name_len..name_len + file_len], u32::from(code.file_kind)),
            first_line: code.first_line,
            line_table: data[name_len + file_len..].to_vec(),
        };
        if process.symbolizer.insert(record.header.addr, info) {
            // A code object at a reused address makes the stacks that named the old one wrong
            // (their frames, by hash, stay right: they are made again from them).
            process.stacks.clear();
            process.by_hash.clear();
        }
    }

    /// Fills the event's stack from the record's frames. A stack that cannot be read whole is
    /// left empty and counted: a partial stack would be a wrong one.
    pub(crate) fn symbolize(&mut self, record: &Record, event: &mut Event) {
        let known = record.header.flags & flags::STACK_KNOWN != 0;
        if record.frames.is_empty() && !known && record.header.flags & flags::STACK_LOST == 0 {
            return;
        }
        let Some(process) = self.processes.get_mut(&record.header.pid) else {
            self.counts.unresolved += 1;
            return;
        };
        if record.header.flags & flags::STACK_LOST != 0 {
            self.counts.unresolved += 1;
            return;
        }
        let hash = record.totals.map_or(0, |t| t.stack_hash);
        if hash != 0 {
            if let Some(stack) = process.by_hash.get(&hash) {
                event.stack = stack.clone();
                self.counts.symbolized += 1;
                return;
            }
        }
        // A stack by hash alone whose symbolized copy was given up: made again from its frames.
        let by_hash;
        let frames: &[(u64, u64)] = if known {
            match process.frames_by_hash.get(&hash) {
                Some(frames) => {
                    by_hash = frames.clone();
                    &by_hash
                }
                None => {
                    self.counts.unresolved += 1;
                    return;
                }
            }
        } else {
            &record.frames
        };
        let stack = match process.stacks.get(frames) {
            Some(stack) => stack.clone(),
            None => {
                let memory = RemoteMemory { pid: record.header.pid };
                let symbolized: Result<Vec<Frame>, _> =
                    frames.iter().map(|&(code, instr)| process.symbolizer.frame(&memory, code, instr)).collect();
                match symbolized {
                    Ok(symbolized) => {
                        if process.stacks.len() >= STACK_CACHE_LIMIT {
                            process.stacks.clear();
                            process.by_hash.clear();
                        }
                        let stack = Stack::new(symbolized);
                        process.stacks.insert(frames.into(), stack.clone());
                        stack
                    }
                    Err(error) => {
                        tracing::debug!("stack of pid {} not symbolized: {error}", record.header.pid);
                        self.counts.unresolved += 1;
                        return;
                    }
                }
            }
        };
        if hash != 0 {
            if !known {
                if process.frames_by_hash.len() >= STACK_CACHE_LIMIT {
                    // Bounded: given up, and the kernel told to send every stack's frames again.
                    process.frames_by_hash.clear();
                    process.by_hash.clear();
                    process.epoch_stale = true;
                }
                process.frames_by_hash.insert(hash, frames.into());
            }
            process.by_hash.insert(hash, stack.clone());
        }
        event.stack = if record.header.stack_of == gp_stack_of::GP_STACK_BACKWARD_CALLER.0 as u8 {
            event.stack_origin = Some(StackOrigin::BackwardCaller);
            stack.under_backward_pass()
        } else {
            stack
        };
        self.counts.symbolized += 1;
    }
}
