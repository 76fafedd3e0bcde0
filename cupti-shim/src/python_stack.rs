//! The calling thread's Python stack, walked in-process with the interpreter layouts the agent's
//! kernel-side walk uses (`gpuprof_pystack`): the thread's own frame chain is read without the
//! GIL — only this thread pushes and pops its frames, and it is busy here. A walk records
//! (code object, instruction) pairs into the thread's own buffer and hashes them; a code object
//! seen for the first time by this thread is described once, right away, while its frame keeps
//! it alive, and a stack it names for the first time goes to the sender once, by its frames: the
//! call record carries only the hash. A training loop reports from a few hundred stacks: writing
//! 30 frames into the queue for every report cost more than walking them.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::{Layout, Memory, MemoryError, Version};

use crate::queue::{self, RawFrame, StackRef, COUNTERS, MAX_FRAMES};

/// `_PyInterpreterFrame.owner` of a frame the C stack owns (3.12+): a shim, not a user frame.
const FRAME_OWNED_BY_CSTACK: u8 = 3;
/// Frames followed at most, shims included (a cycle would be a corrupt chain).
const MAX_LINKS: usize = 256;

/// This process's interpreter, if it runs one gpuprof knows.
struct Interpreter {
    layout: Layout,
    this_thread_state: unsafe extern "C" fn() -> *mut c_void,
}

fn interpreter() -> Option<&'static Interpreter> {
    static INTERPRETER: OnceLock<Option<Interpreter>> = OnceLock::new();
    INTERPRETER
        .get_or_init(|| {
            let version_of = lookup(c"Py_GetVersion")?;
            // SAFETY: Py_GetVersion returns a static NUL-terminated string and may be called any time.
            let text = unsafe {
                let version: unsafe extern "C" fn() -> *const c_char = std::mem::transmute(version_of);
                CStr::from_ptr(version()).to_string_lossy().into_owned()
            };
            let mut numbers = text.split(|c: char| !c.is_ascii_digit());
            let version = Version { major: numbers.next()?.parse().ok()?, minor: numbers.next()?.parse().ok()? };
            let layout = gpuprof_pystack::offsets::layout_for(version)?;
            let this_thread_state = lookup(c"PyGILState_GetThisThreadState")?;
            // SAFETY: the symbol is CPython's `PyThreadState *PyGILState_GetThisThreadState(void)`.
            let this_thread_state =
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> *mut c_void>(this_thread_state) };
            Some(Interpreter { layout, this_thread_state })
        })
        .as_ref()
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address)
}

/// This process's own memory, for reading code objects of live frames.
struct OwnMemory;

impl Memory for OwnMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        if addr == 0 {
            return Err(MemoryError::Implausible { what: "a null pointer", addr });
        }
        // SAFETY: callers pass addresses of live interpreter objects (the frames on this
        // thread's stack and the objects they reference).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
}

/// Slots of the per-thread record of code objects described (direct-mapped: a collision only
/// means describing a code object again).
const DESCRIBED_SLOTS: usize = 4096;
/// Slots of the per-thread record of stacks sent (direct-mapped: a collision only means sending
/// a stack's frames again).
const SENT_SLOTS: usize = 512;

/// What a thread has told the sender, and room for its walk: one thread-local (a thread-local of
/// a shared library costs a call to reach, once per walk).
struct Told {
    /// Code objects described already, each as its address mixed with the identity it had then
    /// (one word: 32 KiB, within the first-level cache): checked for every frame, so a plain
    /// array indexed by the address, not a hash set.
    described: [Cell<u64>; DESCRIBED_SLOTS],
    /// Stacks whose frames were sent, as their hash mixed with the sender's generation.
    sent: [Cell<u64>; SENT_SLOTS],
    /// The walk's frames.
    frames: UnsafeCell<[RawFrame; MAX_FRAMES]>,
    /// (forks seen, pid, tid): two system calls saved on every report.
    ids: Cell<(u64, u32, u32)>,
}

thread_local! {
    static TOLD: Told = const {
        Told {
            described: [const { Cell::new(0) }; DESCRIBED_SLOTS],
            sent: [const { Cell::new(0) }; SENT_SLOTS],
            frames: UnsafeCell::new([RawFrame { code: 0, instr: 0 }; MAX_FRAMES]),
            ids: Cell::new((u64::MAX, 0, 0)),
        }
    };
}

/// Bumped in a forked child: ids cached before the fork are stale there.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// In a forked child: the forking thread's cached ids are the parent's.
pub fn forget_ids_after_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// What a walk found of the calling thread: who it is, and its stack.
pub struct Walked {
    pub pid: u32,
    pub tid: u32,
    pub stack: StackRef,
}

/// Mixes one word into a stack's hash (a multiply-rotate: two per frame on the hot path).
#[inline(always)]
fn mix(hash: u64, word: u64) -> u64 {
    (hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

fn slot_of(code: u64) -> usize {
    // Code objects are at least 16-byte aligned and a few hundred bytes apart.
    (code >> 4) as usize % DESCRIBED_SLOTS
}

/// What tells a code object from another that later lives at the same address (functions made
/// at run time, `exec`, compiled graphs): its name object, the hash of the name's text (the
/// strings' addresses are reused along with the code's; names are interned, so their hash is
/// there) and its first line. Three loads a frame: this runs for every frame of every report.
/// SAFETY: `code` is the code object of a live frame.
#[inline(always)]
unsafe fn identity(at: &IdentityAt, code: u64) -> u64 {
    // SAFETY: `code` is a live code object (the caller's contract), and `at` holds this
    // interpreter's offsets of its name and first line; a name that is set is a live str object.
    unsafe {
        let name = field(code + at.name);
        let name_hash = if name == 0 { 0 } else { field(name + at.name_hash) };
        let first_line = u64::from(((code + at.first_line) as *const u32).read_unaligned());
        name ^ name_hash.rotate_left(17) ^ (first_line << 48)
    }
}

/// Where `identity` reads, as plain numbers the walk's loop keeps in registers.
#[derive(Clone, Copy)]
struct IdentityAt {
    name: u64,
    name_hash: u64,
    first_line: u64,
}

impl IdentityAt {
    fn of(o: &gpuprof_pystack::offsets::Offsets) -> IdentityAt {
        IdentityAt {
            name: u64::from(o.code_name),
            name_hash: u64::from(o.unicode_hash()),
            first_line: u64::from(o.code_firstlineno),
        }
    }
}

/// Reads one pointer-sized field. SAFETY: `addr` must be inside a live object.
unsafe fn field(addr: u64) -> u64 {
    // SAFETY: the caller vouches that `addr` is inside a live object; an unaligned read asks no more.
    unsafe { (addr as *const u64).read_unaligned() }
}

/// The calling thread's pid and tid, and its Python stack as a call record names it; the
/// stack's frames were sent before this returns if this thread never sent them (in the sender's
/// current generation). One thread-local reached for all of it.
pub fn walk() -> Walked {
    TOLD.with(|told| {
        let forks = FORKS.load(Ordering::Relaxed);
        let (seen, mut pid, mut tid) = told.ids.get();
        if seen != forks {
            // SAFETY: getpid/gettid have no preconditions.
            (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
            told.ids.set((forks, pid, tid));
        }
        Walked { pid, tid, stack: walk_stack(told) }
    })
}

fn walk_stack(told: &Told) -> StackRef {
    let Some(interpreter) = interpreter() else { return StackRef::default() };
    let o = &interpreter.layout.offsets;
    // SAFETY: the interpreter's own accessor; null when this thread has no Python state.
    let tstate = unsafe { (interpreter.this_thread_state)() } as u64;
    if tstate == 0 {
        return StackRef::default();
    }
    // The thread state and the frames it links to are this thread's own, and stay in place while
    // it is inside this call: every read of them below rests on that.
    // SAFETY: a live thread state, read at this interpreter's offset of its frame.
    let mut frame = unsafe { field(tstate + u64::from(o.tstate_frame)) };
    if let (Some(current), true) = (o.cframe_current_frame, frame != 0) {
        // SAFETY: a live `_PyCFrame` of this thread, read at this interpreter's offset.
        frame = unsafe { field(frame + u64::from(current)) };
    }
    let skip_shims = interpreter.layout.has_cstack_frames;
    let owner_at = o.frame_owner.map(u64::from);
    let (code_at, instr_at, previous_at) =
        (u64::from(o.frame_code), u64::from(o.frame_instr), u64::from(o.frame_previous));
    let identity_at = IdentityAt::of(o);
    // Everything the loop reads is moved in: a closure borrowing its locals reloaded each one
    // from memory on every frame.
    let walk = move |told: &Told| {
        // SAFETY: this thread's own buffer, used by this call only (a report does not nest).
        let frames = unsafe { &mut *told.frames.get() };
        let mut frame = frame;
        let (mut count, mut links, mut hash) = (0usize, 0usize, 0u64);
        while frame != 0 && links < MAX_LINKS {
            links += 1;
            let is_shim = skip_shims
                && owner_at.is_some_and(|owner| {
                    // SAFETY: a live frame of this thread, read at this interpreter's offset of its owner byte.
                    unsafe { *((frame + owner) as *const u8) == FRAME_OWNED_BY_CSTACK }
                });
            if !is_shim {
                if count == MAX_FRAMES {
                    COUNTERS.stacks_cut.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // SAFETY: a live frame of this thread, read at this interpreter's offsets.
                let code = unsafe { field(frame + code_at) };
                // SAFETY: as above.
                let instr = unsafe { field(frame + instr_at) };
                // SAFETY: the code object of a frame on this thread's stack.
                let seen = code ^ unsafe { identity(&identity_at, code) }.rotate_left(32);
                let slot = &told.described[slot_of(code)];
                if slot.get() != seen {
                    slot.set(seen);
                    describe(interpreter, code);
                }
                // SAFETY: count < MAX_FRAMES, checked above.
                unsafe { *frames.get_unchecked_mut(count) = RawFrame { code, instr } };
                hash = mix(mix(hash, code), instr);
                count += 1;
            }
            // SAFETY: a live frame of this thread; its link is null or the next live frame.
            frame = unsafe { field(frame + previous_at) };
        }
        if count == 0 {
            return StackRef::default();
        }
        // 0 names no stack; the depth is in the hash too.
        let hash = mix(hash, count as u64) | 1;
        let generation = queue::stack_generation();
        let tag = hash.wrapping_add(u64::from(generation));
        let slot = &told.sent[(hash >> 7) as usize % SENT_SLOTS];
        if slot.get() != tag {
            queue::push_stack(hash, &frames[..count]);
            slot.set(tag);
        }
        StackRef { hash }
    };
    walk(told)
}

/// A code object this thread meets for the first time (or at an address another had): described
/// now, while its frame keeps it alive.
#[cold]
fn describe(interpreter: &Interpreter, code: u64) {
    if let Ok(info) = CodeInfo::read(&OwnMemory, &interpreter.layout, code) {
        queue::push_code(code, info);
    }
}

/// The layout the sender symbolizes with (the same interpreter).
pub fn layout() -> Option<Layout> {
    interpreter().map(|i| i.layout)
}
