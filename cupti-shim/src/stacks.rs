//! The sender's side of Python stacks: what the calling threads name by hash (their frames came
//! once, `receive`), to what the agent is sent. A frame is symbolized once (the interpreter's
//! line table) and kept, with its JSON: a training loop reports the same few hundred frames
//! millions of times. To the agent a whole stack goes once, numbered (`intern`), and every block
//! after names its number; the jsonl file gets each event's frames as JSON (`write_json`).
//!
//! Descriptions are applied in the order they were made, each before the first call record made
//! after it: a code object freed and another made at its address must not rename the frames of
//! the calls made before — nor of the numbered stacks, which are forgotten when that happens.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use gpuprof_model::event::Frame;
use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::{Memory, MemoryError, Symbolizer};

use crate::queue::{self, RawFrame, StackRef};

/// Frames kept symbolized before the cache starts over (a bound on the sender's memory).
const FRAME_LIMIT: usize = 100_000;
/// Stacks kept before the table starts over (a new generation: the calling threads send their
/// frames again, and the agent forgets the numbers).
const STACK_LIMIT: usize = 50_000;

/// Code objects come described by the calling threads; nothing is read from memory here.
struct NoMemory;

impl Memory for NoMemory {
    fn read(&self, addr: u64, _buf: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::Implausible { what: "a code object not described by the walk", addr })
    }
}

/// A frame symbolized, and its JSON.
struct Symbolized {
    frame: Frame,
    json: Box<str>,
}

/// A raw stack met before: its number once the agent was sent its frames, its JSON once a line
/// needed it (a driver call's line, or the file's). A driver call and the block it makes share
/// one stack: the line's JSON must not pass for frames the agent has.
#[derive(Default)]
struct Known {
    number: Option<u32>,
    json: Option<Box<str>>,
}

type Words = BuildHasherDefault<WordHasher>;

/// What `intern` found for a stack.
#[derive(Debug, PartialEq, Eq)]
pub enum Interned {
    /// Numbered before (0: the empty stack).
    Known(u32),
    /// Numbered now: the agent must be sent its frames first.
    New(u32, Vec<Frame>),
    /// A frame's code object is unknown: no stack (a partial stack would be a wrong one).
    Unresolved,
}

/// The table's hash of the calling threads' hashes (already well mixed): a multiply.
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

pub struct Stacks {
    /// None when the process runs no interpreter gpuprof knows.
    symbolizer: Option<Symbolizer>,
    /// Symbolized frames by (code object, instruction).
    frames: HashMap<(u64, u64), Symbolized, Words>,
    kept: usize,
    /// Descriptions received and not yet applied, by their number.
    pending: BTreeMap<u64, (u64, CodeInfo)>,
    /// Raw frames of each stack the calling threads named, by its hash.
    raw: HashMap<u64, Box<[RawFrame]>, Words>,
    /// Stacks met, numbered for the agent: one lookup per event, whatever its depth.
    numbered: HashMap<u64, Known, Words>,
    next_number: u32,
    /// Set when the numbers given so far were given up: the agent is to be told.
    forgot: bool,
}

impl Stacks {
    pub fn new() -> Stacks {
        Stacks::with(crate::python_stack::layout().map(Symbolizer::new))
    }

    fn with(symbolizer: Option<Symbolizer>) -> Stacks {
        Stacks {
            symbolizer,
            frames: HashMap::default(),
            kept: 0,
            pending: BTreeMap::new(),
            raw: HashMap::default(),
            numbered: HashMap::default(),
            next_number: 1,
            forgot: false,
        }
    }

    /// A stack's frames, the first time a calling thread names it.
    pub fn receive(&mut self, hash: u64, frames: Box<[RawFrame]>) {
        if self.raw.len() >= STACK_LIMIT {
            self.raw.clear();
            self.forget_numbers();
            queue::new_stack_generation();
        }
        self.raw.insert(hash, frames);
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
        let before = self.frames.len();
        self.frames.retain(|(of, _), _| *of != code);
        if self.frames.len() != before {
            self.kept = self.frames.len();
            // Stacks met before may name the code object that lived here before.
            self.forget_numbers();
        }
    }

    fn forget_numbers(&mut self) {
        if !self.numbered.is_empty() {
            self.numbered.clear();
            self.forgot = true;
        }
    }

    /// True once after the numbers given so far were given up (the agent is to forget them too).
    pub fn take_forgotten(&mut self) -> bool {
        std::mem::take(&mut self.forgot)
    }

    /// The frame of a raw pair, symbolized once.
    fn symbolized(&mut self, raw: RawFrame) -> Option<&Symbolized> {
        let key = (raw.code, raw.instr);
        if !self.frames.contains_key(&key) {
            let frame = self.symbolizer.as_mut()?.frame(&NoMemory, raw.code, raw.instr).ok()?;
            let json = serde_json::to_string(&frame).expect("a frame always serializes").into();
            if self.kept >= FRAME_LIMIT {
                self.frames.clear();
                self.kept = 0;
            }
            self.frames.insert(key, Symbolized { frame, json });
            self.kept += 1;
        }
        self.frames.get(&key)
    }

    /// The number of a call record's stack (made after description `codes_before`), and its
    /// frames when it is new.
    pub fn intern(&mut self, stack: StackRef, codes_before: u64) -> Interned {
        self.apply_descriptions(codes_before);
        if stack.hash == 0 {
            return Interned::Known(0);
        }
        if let Some(Known { number: Some(number), .. }) = self.numbered.get(&stack.hash) {
            return Interned::Known(*number);
        }
        let Some(frames) = self.raw.get(&stack.hash).cloned() else { return Interned::Unresolved };
        let mut symbolized = Vec::with_capacity(frames.len());
        for raw in frames.iter() {
            match self.symbolized(*raw) {
                Some(known) => symbolized.push(known.frame.clone()),
                None => return Interned::Unresolved,
            }
        }
        let number = self.next_number;
        self.next_number += 1;
        self.numbered.entry(stack.hash).or_default().number = Some(number);
        Interned::New(number, symbolized)
    }

    /// Appends the stack of a call record made after description `codes_before` as a JSON array
    /// to `out`; false, with nothing appended, when a frame's code object is unknown (a partial
    /// stack would be a wrong one) or there is no interpreter.
    pub fn write_json(&mut self, stack: StackRef, codes_before: u64, out: &mut String) -> bool {
        self.apply_descriptions(codes_before);
        if stack.hash == 0 {
            out.push_str("[]");
            return true;
        }
        if let Some(Known { json: Some(json), .. }) = self.numbered.get(&stack.hash) {
            out.push_str(json);
            return true;
        }
        let Some(frames) = self.raw.get(&stack.hash).cloned() else { return false };
        let mut json = String::from("[");
        for (index, raw) in frames.iter().enumerate() {
            if index > 0 {
                json.push(',');
            }
            match self.symbolized(*raw) {
                Some(known) => json.push_str(&known.json),
                None => return false,
            }
        }
        json.push(']');
        out.push_str(&json);
        self.numbered.entry(stack.hash).or_default().json = Some(json.into());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_frames_is_an_empty_stack_and_an_unknown_one_writes_nothing() {
        let mut stacks = Stacks::with(None);
        let mut out = String::from("x");
        assert!(stacks.write_json(StackRef::default(), 0, &mut out));
        assert_eq!(out, "x[]");
        let unknown = StackRef { hash: 0x1235 };
        assert!(!stacks.write_json(unknown, 0, &mut out));
        assert_eq!(out, "x[]");
        assert_eq!(stacks.intern(StackRef::default(), 0), Interned::Known(0));
        assert_eq!(stacks.intern(unknown, 0), Interned::Unresolved);
        // Frames received but no interpreter to read them with: still unresolved.
        stacks.receive(0x1235, vec![RawFrame { code: 0x1000, instr: 0x1010 }].into());
        assert_eq!(stacks.intern(unknown, 0), Interned::Unresolved);
    }

    /// PyTorch's caching allocator makes a segment (a driver call, written as a line) and then
    /// reports the block, both under one Python line: the block's stack must still reach the
    /// agent by its frames.
    #[test]
    fn a_stack_first_written_for_a_driver_call_is_still_sent_for_the_block() {
        let layout = gpuprof_pystack::offsets::layout_for(gpuprof_pystack::Version { major: 3, minor: 11 }).unwrap();
        let adaptive = u64::from(layout.offsets.code_adaptive.unwrap());
        let mut stacks = Stacks::with(Some(Symbolizer::new(layout)));
        let code = 0x7f00_0000_1000;
        // One location entry: one code unit on line 34 (first line 34, no change).
        let info = CodeInfo {
            function: "<module>".to_string(),
            file: "/srv/train.py".to_string(),
            first_line: 34,
            line_table: vec![0x80 | (10 << 3), 0],
        };
        stacks.queue_description(1, code, info);
        let stack = StackRef { hash: 0x4321 };
        stacks.receive(stack.hash, vec![RawFrame { code, instr: code + adaptive }].into());

        let mut line = String::new();
        assert!(stacks.write_json(stack, 1, &mut line));
        assert_eq!(line, r#"[{"function":"<module>","file":"/srv/train.py","line":34}]"#);
        let frame = Frame { file: "/srv/train.py".into(), function: "<module>".into(), line: 34 };
        assert_eq!(stacks.intern(stack, 1), Interned::New(1, vec![frame]));
        assert_eq!(stacks.intern(stack, 1), Interned::Known(1));
        line.clear();
        assert!(stacks.write_json(stack, 1, &mut line));
        assert_eq!(line, r#"[{"function":"<module>","file":"/srv/train.py","line":34}]"#);
    }

    /// A code object freed and another described at its address while a stack is interned: the
    /// numbers given before are forgotten first, and the stack interned then gets a number that
    /// stands (the sender tells the agent to forget before it sends that stack's frames).
    #[test]
    fn a_forget_while_interning_comes_before_the_number_it_gives() {
        let layout = gpuprof_pystack::offsets::layout_for(gpuprof_pystack::Version { major: 3, minor: 11 }).unwrap();
        let adaptive = u64::from(layout.offsets.code_adaptive.unwrap());
        let mut stacks = Stacks::with(Some(Symbolizer::new(layout)));
        let code = 0x7f00_0000_1000;
        let info = |function: &str| CodeInfo {
            function: function.to_string(),
            file: "/srv/train.py".to_string(),
            first_line: 34,
            line_table: vec![0x80 | (10 << 3), 0],
        };
        stacks.queue_description(1, code, info("step"));
        let first = StackRef { hash: 0x1111 };
        stacks.receive(first.hash, vec![RawFrame { code, instr: code + adaptive }].into());
        let step = Frame { file: "/srv/train.py".into(), function: "step".into(), line: 34 };
        assert_eq!(stacks.intern(first, 1), Interned::New(1, vec![step]));
        assert!(!stacks.take_forgotten());
        // The code object at that address is freed and another made there (description 2).
        stacks.queue_description(2, code, info("evaluate"));
        let second = StackRef { hash: 0x2222 };
        stacks.receive(second.hash, vec![RawFrame { code, instr: code + adaptive }].into());
        let evaluate = Frame { file: "/srv/train.py".into(), function: "evaluate".into(), line: 34 };
        assert_eq!(stacks.intern(second, 2), Interned::New(2, vec![evaluate]));
        assert!(stacks.take_forgotten(), "the numbers before description 2 are void");
        assert_eq!(stacks.intern(second, 2), Interned::Known(2));
        assert!(!stacks.take_forgotten());
    }
}
