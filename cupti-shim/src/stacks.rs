//! The sender's side of Python stacks: raw (code object, instruction) frames to the JSON the
//! event carries. A frame's JSON is made once (symbolized with the interpreter's line table,
//! escaped) and kept: a training loop reports the same few hundred frames millions of times, and
//! serializing each afresh was most of the sender's work.
//!
//! Descriptions are applied in the order they were made, each before the first call record made
//! after it: a code object freed and another made at its address must not rename the frames of
//! the calls made before.

use std::collections::{BTreeMap, HashMap};

use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::{Memory, MemoryError, Symbolizer};

use crate::queue::RawFrame;

/// Frames kept serialized before the cache starts over (a bound on the sender's memory).
const FRAME_LIMIT: usize = 100_000;

/// Code objects come described by the calling threads; nothing is read from memory here.
struct NoMemory;

impl Memory for NoMemory {
    fn read(&self, addr: u64, _buf: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::Implausible { what: "a code object not described by the walk", addr })
    }
}

pub struct Stacks {
    /// None when the process runs no interpreter gpuprof knows.
    symbolizer: Option<Symbolizer>,
    /// Serialized frames by code object, then instruction.
    frames: HashMap<u64, HashMap<u64, Box<str>>>,
    kept: usize,
    /// Descriptions received and not yet applied, by their number.
    pending: BTreeMap<u64, (u64, CodeInfo)>,
}

impl Stacks {
    pub fn new() -> Stacks {
        Stacks {
            symbolizer: crate::python::layout().map(Symbolizer::new),
            frames: HashMap::new(),
            kept: 0,
            pending: BTreeMap::new(),
        }
    }

    /// A description numbered `seq` by the calling thread, applied before the first call record
    /// made after it.
    pub fn queue_description(&mut self, seq: u64, code: u64, info: CodeInfo) {
        self.pending.insert(seq, (code, info));
    }

    fn apply_descriptions(&mut self, up_to: u64) {
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > up_to {
                break;
            }
            let (code, info) = entry.remove();
            self.describe(code, info);
        }
    }

    /// A code object described by a calling thread; its address may have held another before.
    fn describe(&mut self, code: u64, info: CodeInfo) {
        if let Some(symbolizer) = &mut self.symbolizer {
            symbolizer.insert(code, info);
        }
        if let Some(dropped) = self.frames.remove(&code) {
            self.kept -= dropped.len();
        }
    }

    /// Appends the stack of a call record made after description `codes_before` as a JSON array
    /// to `out`; false, with nothing appended, when a frame's code object is unknown (a partial
    /// stack would be a wrong one) or there is no interpreter.
    pub fn write_json(&mut self, frames: &[RawFrame], codes_before: u64, out: &mut String) -> bool {
        self.apply_descriptions(codes_before);
        let Some(symbolizer) = &mut self.symbolizer else { return frames.is_empty() && push_empty(out) };
        let start = out.len();
        out.push('[');
        for (index, raw) in frames.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            if let Some(json) = self.frames.get(&raw.code).and_then(|by_instr| by_instr.get(&raw.instr)) {
                out.push_str(json);
                continue;
            }
            let Ok(frame) = symbolizer.frame(&NoMemory, raw.code, raw.instr) else {
                out.truncate(start);
                return false;
            };
            let json: Box<str> = serde_json::to_string(&frame).expect("a frame always serializes").into();
            out.push_str(&json);
            if self.kept >= FRAME_LIMIT {
                self.frames.clear();
                self.kept = 0;
            }
            self.frames.entry(raw.code).or_default().insert(raw.instr, json);
            self.kept += 1;
        }
        out.push(']');
        true
    }
}

fn push_empty(out: &mut String) -> bool {
    out.push_str("[]");
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_frames_is_an_empty_stack_and_an_unknown_code_object_writes_nothing() {
        let mut stacks = Stacks { symbolizer: None, frames: HashMap::new(), kept: 0, pending: BTreeMap::new() };
        let mut out = String::from("x");
        assert!(stacks.write_json(&[], 0, &mut out));
        assert_eq!(out, "x[]");
        assert!(!stacks.write_json(&[RawFrame { code: 0x1000, instr: 0x1010 }], 0, &mut out));
        assert_eq!(out, "x[]");
    }
}
