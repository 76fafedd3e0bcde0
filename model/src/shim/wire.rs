//! The shim's binary stream to the agent. Tensor blocks come at training rates (tens of thousands
//! a second, bursts of hundreds of thousands), each with a 30-frame Python stack: as jsonl, the
//! sender spent microseconds serializing each one and the agent more parsing it, and a burst
//! outran them both. Here a block is a fixed 75-byte message naming its stack by a number; each
//! distinct stack, and each autograd node class, is sent once per connection. Everything rare
//! (driver calls, forks, exits, the counters line) travels as the same JSON text as before,
//! inside a message.
//!
//! A connection starts with `MAGIC` (an agent reading jsonl from an older shim sees `{` first);
//! then messages: a little-endian `u32` length, then that many bytes: a tag and its fields. The
//! agent answers on the same connection with text lines (`word`): the capture level to take.

use std::borrow::Cow;
use std::sync::Arc;

use crate::event::{Event, Frame, Kind, Layer, Op, Source, PYTORCH_ALLOCATOR_API};
use crate::level::Level;

/// The first bytes a shim writes on a connection.
pub const MAGIC: &[u8; 8] = b"GPWIRE1\n";
/// The longest message an agent takes (a stack of 48 frames with long names is a few KiB).
pub const MAX_MESSAGE: usize = 1 << 20;

const TAG_JSON: u8 = 1;
/// `Message::Process` without a rank.
const NO_RANK: u32 = u32::MAX;
const TAG_PROCESS: u8 = 2;
const TAG_STACK: u8 = 3;
const TAG_NAME: u8 = 4;
const TAG_BLOCK: u8 = 5;
const TAG_LEVEL: u8 = 6;
const TAG_FORGET_STACKS: u8 = 7;

/// One caching-allocator report, as the calling thread saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub ts: u64,
    pub pid: u32,
    pub tid: u32,
    pub ptr: u64,
    /// Positive: a block handed out; negative: taken back.
    pub delta: i64,
    pub allocated: u64,
    pub reserved: u64,
    pub device: i8,
    /// The stack the connection numbered (0: none, or not resolved).
    pub stack: u32,
    /// Autograd's state, when it was read: the node class's number (0: no node), its or the
    /// thread's sequence number, and the thread as RecordFunction numbers it.
    pub autograd: Option<(u32, u64, u64)>,
}

impl Block {
    /// The contract's event for this block (the JSON path and the binary one make the same).
    pub fn event(&self, stack: crate::stack::Stack, node: Option<Arc<str>>) -> Event {
        let op = if self.delta < 0 { Op::Free } else { Op::Alloc };
        let mut event = Event::new(
            self.ts,
            self.pid,
            self.tid,
            Source::Shim,
            Layer::Allocator,
            op,
            Cow::Borrowed(PYTORCH_ALLOCATOR_API),
        );
        event.kind = Some(Kind::Device);
        event.device = Some(i32::from(self.device));
        event.addr = Some(self.ptr);
        event.size = self.delta.unsigned_abs();
        event.allocated = Some(self.allocated);
        event.reserved = Some(self.reserved);
        if let Some((_, seq, thread)) = self.autograd {
            event.autograd_seq = Some(seq);
            event.autograd_thread = Some(thread);
            event.autograd_node = node;
        }
        event.stack = stack;
        event
    }
}

/// What a shim sends after `MAGIC`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// An event or the counters line, as the jsonl path writes it.
    Json(Cow<'a, str>),
    /// The process speaking (first, and again when its name changes), its rank in a
    /// distributed job (`RANK` in its environment: an agent in another pid namespace, a pod's
    /// sidecar, cannot read it from /proc) and its allocator settings (`Event::allocator_settings`,
    /// from the same environment).
    Process {
        pid: u32,
        ppid: u32,
        comm: Cow<'a, str>,
        rank: Option<u32>,
        allocator_settings: Option<Cow<'a, str>>,
    },
    /// A stack, numbered for the blocks that name it.
    Stack {
        id: u32,
        frames: Vec<Frame>,
    },
    /// An autograd node class, numbered.
    Name {
        id: u32,
        text: Cow<'a, str>,
    },
    Block(Block),
    /// The shim took this level at `ts` (wall clock): reports after it are recorded at it.
    Level {
        level: Level,
        ts: u64,
    },
    /// The numbers given to stacks so far are given up (the shim bounds its table).
    ForgetStacks,
}

/// A message that does not read as one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable shim message: {0}")]
pub struct Undecodable(pub &'static str);

impl Message<'_> {
    /// Appends the message, length first, to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        match self {
            Message::Json(text) => {
                out.push(TAG_JSON);
                out.extend_from_slice(text.as_bytes());
            }
            Message::Process { pid, ppid, comm, rank, allocator_settings } => {
                out.push(TAG_PROCESS);
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&ppid.to_le_bytes());
                put_str(out, comm);
                out.extend_from_slice(&rank.unwrap_or(NO_RANK).to_le_bytes());
                if let Some(settings) = allocator_settings {
                    put_str(out, settings);
                }
            }
            Message::Stack { id, frames } => {
                out.push(TAG_STACK);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&(frames.len() as u16).to_le_bytes());
                for frame in frames {
                    out.extend_from_slice(&frame.line.to_le_bytes());
                    put_str(out, &frame.function);
                    put_str(out, &frame.file);
                }
            }
            Message::Name { id, text } => {
                out.push(TAG_NAME);
                out.extend_from_slice(&id.to_le_bytes());
                put_str(out, text);
            }
            Message::Block(block) => write_block(out, block),
            Message::Level { level, ts } => {
                out.push(TAG_LEVEL);
                out.push(*level as u8);
                out.extend_from_slice(&ts.to_le_bytes());
            }
            Message::ForgetStacks => out.push(TAG_FORGET_STACKS),
        }
        let length = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&length.to_le_bytes());
    }

    /// Reads one message's bytes (its length already taken off).
    pub fn read(bytes: &[u8]) -> Result<Message<'_>, Undecodable> {
        let mut r = Reader { bytes };
        Ok(match r.u8()? {
            TAG_JSON => Message::Json(Cow::Borrowed(std::str::from_utf8(r.bytes).map_err(|_| Undecodable("JSON"))?)),
            TAG_PROCESS => {
                let (pid, ppid, comm) = (r.u32()?, r.u32()?, r.str()?);
                // A shim from before ranks ends the message with the name; one from before
                // allocator settings, with the rank.
                let rank = if r.bytes.is_empty() { None } else { Some(r.u32()?).filter(|&rank| rank != NO_RANK) };
                let allocator_settings = if r.bytes.is_empty() { None } else { Some(r.str()?) };
                Message::Process { pid, ppid, comm, rank, allocator_settings }
            }
            TAG_STACK => {
                let id = r.u32()?;
                let count = r.u16()?;
                let mut frames = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    let line = r.u32()?;
                    frames.push(Frame { line, function: r.str()?.into_owned(), file: r.str()?.into_owned() });
                }
                Message::Stack { id, frames }
            }
            TAG_NAME => Message::Name { id: r.u32()?, text: r.str()? },
            TAG_BLOCK => {
                let (ts, pid, tid) = (r.u64()?, r.u32()?, r.u32()?);
                let (ptr, delta, allocated, reserved) = (r.u64()?, r.u64()? as i64, r.u64()?, r.u64()?);
                let (device, flags, stack) = (r.u8()? as i8, r.u8()?, r.u32()?);
                let (node, seq, thread) = (r.u32()?, r.u64()?, r.u64()?);
                let autograd = (flags & 1 != 0).then_some((node, seq, thread));
                Message::Block(Block { ts, pid, tid, ptr, delta, allocated, reserved, device, stack, autograd })
            }
            TAG_LEVEL => Message::Level {
                level: Level::from_number(i64::from(r.u8()?)).ok_or(Undecodable("level"))?,
                ts: r.u64()?,
            },
            TAG_FORGET_STACKS => Message::ForgetStacks,
            _ => return Err(Undecodable("tag")),
        })
    }
}

fn write_block(out: &mut Vec<u8>, block: &Block) {
    out.push(TAG_BLOCK);
    out.extend_from_slice(&block.ts.to_le_bytes());
    out.extend_from_slice(&block.pid.to_le_bytes());
    out.extend_from_slice(&block.tid.to_le_bytes());
    out.extend_from_slice(&block.ptr.to_le_bytes());
    out.extend_from_slice(&block.delta.to_le_bytes());
    out.extend_from_slice(&block.allocated.to_le_bytes());
    out.extend_from_slice(&block.reserved.to_le_bytes());
    out.push(block.device as u8);
    let (node, seq, thread) = block.autograd.unwrap_or((0, 0, 0));
    out.push(u8::from(block.autograd.is_some()));
    out.extend_from_slice(&block.stack.to_le_bytes());
    out.extend_from_slice(&node.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&thread.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    // Names and paths are cut at 64 KiB (on a character boundary).
    let mut end = text.len().min(usize::from(u16::MAX));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Undecodable> {
        if self.bytes.len() < n {
            return Err(Undecodable("cut short"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, Undecodable> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Undecodable> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("two bytes")))
    }

    fn u32(&mut self) -> Result<u32, Undecodable> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes")))
    }

    fn u64(&mut self) -> Result<u64, Undecodable> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }

    fn str(&mut self) -> Result<Cow<'a, str>, Undecodable> {
        let length = usize::from(self.u16()?);
        std::str::from_utf8(self.take(length)?).map(Cow::Borrowed).map_err(|_| Undecodable("text"))
    }
}

/// The agent's word to a shim: take this level.
pub fn level_word(level: Level) -> String {
    format!("level {level}\n")
}

/// The level a word from the agent asks for; None for a word this shim does not know (a later
/// agent's), which it leaves alone.
pub fn read_word(line: &str) -> Option<Level> {
    line.trim().strip_prefix("level ")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(message: Message<'_>) -> usize {
        let mut out = Vec::new();
        message.write(&mut out);
        let length = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(length, out.len() - 4);
        assert_eq!(Message::read(&out[4..]).unwrap(), message);
        out.len()
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let block = Block {
            ts: 1_700_000_000_123_456_789,
            pid: 4711,
            tid: 4712,
            ptr: 0x7f00_0020_0000,
            delta: -4096,
            allocated: 8192,
            reserved: 2 << 20,
            device: 3,
            stack: 17,
            autograd: Some((2, 286, 1)),
        };
        // A block is 75 bytes and its length.
        assert_eq!(round_trip(Message::Block(block)), 4 + 75);
        round_trip(Message::Block(Block { autograd: None, device: -1, ..block }));
        round_trip(Message::Json(Cow::Borrowed(r#"{"gpuprof_shim":{"pid":7}}"#)));
        let process = |rank, allocator_settings| Message::Process {
            pid: 7,
            ppid: 1,
            comm: Cow::Borrowed("python3"),
            rank,
            allocator_settings,
        };
        round_trip(process(None, None));
        round_trip(process(Some(3), None));
        round_trip(process(Some(3), Some(Cow::Borrowed("expandable_segments:True"))));
        round_trip(process(None, Some(Cow::Borrowed(""))));
        round_trip(Message::Stack {
            id: 17,
            frames: vec![
                Frame { function: "step".into(), file: "données/train.py".into(), line: 42 },
                Frame { function: "<module>".into(), file: "train.py".into(), line: 7 },
            ],
        });
        round_trip(Message::Name { id: 2, text: Cow::Borrowed("AddmmBackward0") });
        round_trip(Message::Level { level: Level::Driver, ts: 99 });
        round_trip(Message::ForgetStacks);
    }

    #[test]
    fn a_block_becomes_the_contract_event() {
        let block = Block {
            ts: 5,
            pid: 7,
            tid: 8,
            ptr: 0x1000,
            delta: -512,
            allocated: 0,
            reserved: 2 << 20,
            device: 0,
            stack: 0,
            autograd: Some((1, 44, 2)),
        };
        let event = block.event(crate::stack::Stack::empty(), Some(Arc::from("MmBackward0")));
        assert_eq!((event.op, event.layer, event.source, event.size), (Op::Free, Layer::Allocator, Source::Shim, 512));
        assert_eq!((event.addr, event.allocated, event.reserved), (Some(0x1000), Some(0), Some(2 << 20)));
        assert_eq!(
            (event.autograd_seq, event.autograd_thread, event.autograd_node.as_deref()),
            (Some(44), Some(2), Some("MmBackward0"))
        );
        assert_eq!(event.api, PYTORCH_ALLOCATOR_API);
    }

    #[test]
    fn bad_bytes_are_an_error_not_a_panic() {
        assert_eq!(Message::read(&[]), Err(Undecodable("cut short")));
        assert_eq!(Message::read(&[99]), Err(Undecodable("tag")));
        assert_eq!(Message::read(&[TAG_BLOCK, 1, 2, 3]), Err(Undecodable("cut short")));
        assert_eq!(Message::read(&[TAG_STACK, 1, 0, 0, 0, 2, 0, 1, 0, 0, 0, 9, 0]), Err(Undecodable("cut short")));
        assert_eq!(Message::read(&[TAG_LEVEL, 9, 0, 0, 0, 0, 0, 0, 0, 0]), Err(Undecodable("level")));
        assert_eq!(Message::read(&[TAG_NAME, 1, 0, 0, 0, 2, 0, 0xff, 0xfe]), Err(Undecodable("text")));
    }

    #[test]
    fn words_name_a_level_and_unknown_words_are_left_alone() {
        assert_eq!(read_word(&level_word(Level::Off)), Some(Level::Off));
        assert_eq!(read_word("level tensors"), Some(Level::Tensors));
        assert_eq!(read_word("sample 0.1"), None);
        assert_eq!(read_word("level full"), None);
    }
}
