//! The shim's binary stream to the agent (`model::shim::wire`): the input is taken as a stream
//! of messages, each a little-endian `u32` length and that many bytes, as the agent frames them;
//! each is decoded by `Message::read`. The agent's words back are read by `read_word`.
//!
//! Checked: every failure is an `Undecodable` (never a panic); a decoded message written again
//! (`Message::write`) has the length it says and decodes to the same message; a block becomes its
//! event; a word the agent reads names a level that is written back as the same word.

#![no_main]

use gpuprof_model::shim::wire::{level_word, read_word, Message, MAX_MESSAGE};
use gpuprof_model::Stack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while rest.len() >= 4 {
        let length = u32::from_le_bytes(rest[..4].try_into().expect("four bytes")) as usize;
        if length > MAX_MESSAGE {
            break; // the agent closes such a connection
        }
        let bytes = &rest[4..];
        let bytes = &bytes[..length.min(bytes.len())];
        rest = &rest[4 + bytes.len()..];
        check(bytes);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(level) = read_word(text) {
            assert_eq!(read_word(&level_word(level)), Some(level), "a level's word reads back as the level");
        }
    }
});

fn check(bytes: &[u8]) {
    let message = match Message::read(bytes) {
        Ok(message) => message,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let mut written = Vec::new();
    message.write(&mut written);
    let length = u32::from_le_bytes(written[..4].try_into().expect("a length first")) as usize;
    assert_eq!(length, written.len() - 4, "a written message's length is its size");
    assert_eq!(Message::read(&written[4..]), Ok(message.clone()), "a message written again reads otherwise");
    if let Message::Block(block) = &message {
        let event = block.event(Stack::empty(), None);
        assert_eq!((event.pid, event.addr, event.size), (block.pid, Some(block.ptr), block.delta.unsigned_abs()));
    }
}
