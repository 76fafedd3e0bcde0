//! Where in a function a uprobe goes. On x86-64 a uprobe is an `int3` over the function's first
//! instruction; after the program runs, the kernel must execute the instruction it replaced. Most
//! instructions it executes out of line, single-stepped — a second trap — and in a virtual
//! machine that second trap is most of the cost: measured on an x86-64 VM with kernel 6.18, an
//! empty uprobe on `endbr64` or `mov` cost 8 µs a hit, on `push %rbp` 1.1 µs. A few instructions
//! the kernel emulates instead (arch/x86/kernel/uprobes.c: `push` of a register, `nop`, `jmp`,
//! `call`, `jcc`), with no second trap.
//!
//! So a probe goes on the function's first emulated instruction when only `endbr64` comes
//! before it: `endbr64` changes no register and no memory, so the arguments, the stack pointer
//! and the return address at `*sp` are what they were at the call — all the programs read, and
//! all a return probe needs to take over the return. Anything else stays at the entry.

/// `endbr64` (CET's landing mark, a no-op for the probe's purposes).
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// The REX prefix of `push %r8`…`push %r15`, the only prefixed push the kernel emulates.
const REX_B: u8 = 0x41;

/// The offset from the function's start to probe at, given its first bytes.
pub(crate) fn probe_offset(code: &[u8]) -> usize {
    if emulated(code) {
        return 0;
    }
    match code.strip_prefix(&ENDBR64) {
        Some(rest) if emulated(rest) => ENDBR64.len(),
        _ => 0,
    }
}

/// The kernel runs this instruction itself, without single-stepping it.
fn emulated(code: &[u8]) -> bool {
    match code {
        // push %rax … %rdi
        [0x50..=0x57, ..] => true,
        // push %r8 … %r15
        [REX_B, 0x50..=0x57, ..] => true,
        // nop
        [0x90, ..] => true,
        // call rel32, jmp rel32, jmp rel8
        [0xe8 | 0xe9 | 0xeb, ..] => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_goes_past_endbr64_onto_an_emulated_push_and_nowhere_else() {
        // endbr64; push %rbp — as -fcf-protection builds start.
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5]), 4);
        // endbr64; push %r15
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x41, 0x57, 0x41, 0x56]), 4);
        // push %r15 first: already emulated where it is.
        assert_eq!(probe_offset(&[0x41, 0x57, 0x41, 0x56]), 0);
        assert_eq!(probe_offset(&[0x55, 0x48, 0x89, 0xe5]), 0);
        // endbr64; sub $0x28,%rsp — nothing to gain, and moving past it would change sp.
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0xec, 0x28]), 0);
        // mov %rsi,0x2f20(%rip) first (the libc10 stand-in): stays at the entry.
        assert_eq!(probe_offset(&[0x48, 0x89, 0x35, 0x20, 0x2f, 0x00, 0x00]), 0);
        // endbr64; jmp (a PLT-like thunk): the jump is emulated.
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 0, 0, 0, 0]), 4);
        // push with another REX prefix (W): not emulated.
        assert_eq!(probe_offset(&[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x55]), 0);
        // Cut short: nothing to decide with.
        assert_eq!(probe_offset(&[0xf3, 0x0f]), 0);
        assert_eq!(probe_offset(&[]), 0);
    }
}
