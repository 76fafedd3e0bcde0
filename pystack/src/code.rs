//! Code objects to frames: `(code object, instruction)` pairs captured from a thread's frame
//! chain become `file:line function`. Each code object is read once per process and cached.

use std::collections::HashMap;
use std::sync::Arc;

use gpuprof_model::event::Frame;

use crate::linetable;
use crate::memory::{Memory, MemoryError};
use crate::offsets::{InstrEncoding, Layout};
use crate::strings::{read_bytes, read_str};

/// Line tables larger than this are not read (no real function comes close).
const MAX_LINE_TABLE: u64 = 1 << 20;

/// What gpuprof needs of one code object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` where the version has it (3.11+), else `co_name`.
    pub function: String,
    pub file: String,
    pub first_line: i32,
    pub line_table: Vec<u8>,
}

impl CodeInfo {
    pub fn read(memory: &dyn Memory, layout: &Layout, code: u64) -> Result<CodeInfo, MemoryError> {
        let o = &layout.offsets;
        let name_field = o.code_qualname.unwrap_or(o.code_name);
        let function = read_str(memory, o, memory.read_u64(code + u64::from(name_field))?)?;
        let file = read_str(memory, o, memory.read_u64(code + u64::from(o.code_filename))?)?;
        let first_line = memory.read_i32(code + u64::from(o.code_firstlineno))?;
        let table = memory.read_u64(code + u64::from(o.code_linetable))?;
        let line_table = read_bytes(memory, o, table, MAX_LINE_TABLE)?;
        Ok(CodeInfo { function, file, first_line, line_table })
    }
}

/// `sizeof(_Py_CODEUNIT)`: an instruction and its argument, the unit 3.10+ count instructions in.
const CODE_UNIT: u64 = 2;

/// Resolved frames kept per process: hot loops hit the same (code, instruction) pairs.
const FRAME_CACHE_LIMIT: usize = 1 << 16;

/// Symbolizes the frames of one process; its cache lives as long as the process's image.
#[derive(Debug)]
pub struct Symbolizer {
    layout: Layout,
    codes: HashMap<u64, Arc<CodeInfo>>,
    frames: HashMap<(u64, u64), Frame>,
}

impl Symbolizer {
    pub fn new(layout: Layout) -> Self {
        Symbolizer { layout, codes: HashMap::new(), frames: HashMap::new() }
    }

    /// Remembers a code object described by someone else (the kernel-side walk, while the
    /// process was alive to be read).
    /// Returns false when the code object was already known with this very description
    /// (nothing changed).
    pub fn insert(&mut self, code: u64, info: CodeInfo) -> bool {
        if self.codes.get(&code).is_some_and(|known| **known == info) {
            return false;
        }
        self.codes.insert(code, Arc::new(info));
        // A code object at a reused address: its resolved lines are stale.
        self.frames.retain(|(c, _), _| *c != code);
        true
    }

    /// One frame: `instr` is what the frame's instruction field held (see [`InstrEncoding`]).
    pub fn frame(&mut self, memory: &dyn Memory, code: u64, instr: u64) -> Result<Frame, MemoryError> {
        if let Some(frame) = self.frames.get(&(code, instr)) {
            return Ok(frame.clone());
        }
        let info = match self.codes.get(&code) {
            Some(info) => Arc::clone(info),
            None => {
                let info = Arc::new(CodeInfo::read(memory, &self.layout, code)?);
                self.codes.insert(code, Arc::clone(&info));
                info
            }
        };
        let offset = self.instruction_offset(code, instr);
        let line = linetable::line_for(self.layout.line_table, &info.line_table, info.first_line, offset)
            .unwrap_or(info.first_line.max(0) as u32);
        let frame = Frame { function: info.function.clone(), file: info.file.clone(), line };
        if self.frames.len() >= FRAME_CACHE_LIMIT {
            self.frames.clear();
        }
        self.frames.insert((code, instr), frame.clone());
        Ok(frame)
    }

    /// The instruction's position in the unit its line table counts in.
    fn instruction_offset(&self, code: u64, instr: u64) -> u64 {
        match self.layout.instr {
            // f_lasti is a C int; -1 means "not started".
            InstrEncoding::ByteOffset => u64::from((instr as u32 as i32).max(0) as u32),
            InstrEncoding::CodeUnitIndex => u64::from((instr as u32 as i32).max(0) as u32) * CODE_UNIT,
            InstrEncoding::Pointer => {
                let first = code + u64::from(self.layout.offsets.code_adaptive.unwrap_or(0));
                instr.saturating_sub(first) / CODE_UNIT
            }
        }
    }
}
