//! Python stacks for captured calls: finds each tracked process's interpreter (and tells the
//! kernel-side walk where it keeps its threads and frames), then turns the (code object,
//! instruction) pairs of each record into `file:line function` frames.
//!
//! A process that has just exec'd may not have mapped libpython yet: it is looked for again on
//! every turn of the capture loop until it has, for a while.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpuprof_ebpf::types::gp_python;
use gpuprof_model::event::{Event, Frame};
use gpuprof_model::Stack;
use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::strings::decode;
use gpuprof_pystack::{find_interpreter, Interpreter, RemoteMemory, Symbolizer};

use crate::capture::{flags, Capture, Record};

/// How long a new program is looked at for an interpreter before it counts as not Python.
const DISCOVERY_WINDOW: Duration = Duration::from_secs(3);
const NO_OFFSET: u16 = 0xffff;

struct PythonProcess {
    interpreter: Interpreter,
    symbolizer: Symbolizer,
    /// Stacks already made, by the kernel's (code object, instruction) pairs: a training loop
    /// repeats a few hundred stacks tens of thousands of times a second, and each is symbolized
    /// once and then shared by every event that has it.
    stacks: HashMap<Box<[(u64, u64)]>, Stack>,
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
pub struct Pythons {
    processes: HashMap<u32, PythonProcess>,
    /// pid → until when to keep looking for its interpreter.
    looking: HashMap<u32, Instant>,
    generations: u32,
    pub counts: StackCounts,
}

/// The kernel-side walk's view of an interpreter; `generation` tells one program from the next.
pub fn walk_config(interpreter: &Interpreter, generation: u32) -> gp_python {
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
        reserved: [0; 7],
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
    /// Starts looking for the interpreter of a process (a new program, or one attached to).
    pub fn look_for(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.looking.insert(pid, Instant::now() + DISCOVERY_WINDOW);
    }

    /// True while some process is still being looked at (the loop then polls quickly).
    pub fn is_looking(&self) -> bool {
        !self.looking.is_empty()
    }

    /// One look at every process still without an interpreter.
    pub fn discover(&mut self, capture: &Capture) {
        let now = Instant::now();
        let pids: Vec<u32> = self.looking.keys().copied().collect();
        for pid in pids {
            match find_interpreter(pid) {
                Ok(Some(interpreter)) => {
                    self.looking.remove(&pid);
                    self.generations = self.generations.wrapping_add(1) & 0xffff;
                    if let Err(error) = capture.set_python(pid, &walk_config(&interpreter, self.generations)) {
                        tracing::warn!("{error:#}");
                        continue;
                    }
                    tracing::debug!(pid, version = %interpreter.layout.version, module = %interpreter.module, "found CPython");
                    self.counts.interpreters += 1;
                    self.insert(pid, interpreter);
                }
                Ok(None) if now < self.looking[&pid] => {}
                Ok(None) => {
                    self.looking.remove(&pid);
                }
                Err(error) => {
                    self.looking.remove(&pid);
                    // A process that already exited has no stacks left to walk: nothing to say.
                    if crate::procfs::exists(pid) {
                        eprintln!("gpuprof: warning: no Python stacks for pid {pid}: {error}");
                    }
                }
            }
        }
    }

    fn insert(&mut self, pid: u32, interpreter: Interpreter) {
        let symbolizer = Symbolizer::new(interpreter.layout);
        self.processes.insert(pid, PythonProcess { interpreter, symbolizer, stacks: HashMap::new() });
    }

    /// A forked child runs its parent's interpreter (the kernel copied the walk's settings).
    pub fn forked(&mut self, child: u32, parent: u32) {
        if let Some(parent) = self.processes.get(&parent) {
            let interpreter = Interpreter { pid: child, ..parent.interpreter.clone() };
            self.insert(child, interpreter);
        }
    }

    /// The process replaced its program or exited: its caches are wrong from now on.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.looking.remove(&pid);
    }

    /// A code object the kernel described: symbolizing it later needs no read of the process,
    /// which may have exited by then.
    pub fn remember(&mut self, record: &Record) {
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
            // A code object at a reused address makes the stacks that named the old one wrong.
            process.stacks.clear();
        }
    }

    /// Fills the event's stack from the record's frames. A stack that cannot be read whole is
    /// left empty and counted: a partial stack would be a wrong one.
    pub fn symbolize(&mut self, record: &Record, event: &mut Event) {
        if record.frames.is_empty() && record.header.flags & flags::STACK_LOST == 0 {
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
        if let Some(stack) = process.stacks.get(&record.frames[..]) {
            event.stack = stack.clone();
            self.counts.symbolized += 1;
            return;
        }
        let memory = RemoteMemory { pid: record.header.pid };
        let frames: Result<Vec<Frame>, _> =
            record.frames.iter().map(|&(code, instr)| process.symbolizer.frame(&memory, code, instr)).collect();
        match frames {
            Ok(frames) => {
                if process.stacks.len() >= STACK_CACHE_LIMIT {
                    process.stacks.clear();
                }
                let stack = Stack::new(frames);
                process.stacks.insert(record.frames.as_slice().into(), stack.clone());
                event.stack = stack;
                self.counts.symbolized += 1;
            }
            Err(error) => {
                tracing::debug!("stack of pid {} not symbolized: {error}", record.header.pid);
                self.counts.unresolved += 1;
            }
        }
    }
}
