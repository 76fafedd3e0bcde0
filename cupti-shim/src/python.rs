//! The calling thread's Python stack, walked in-process with the interpreter layouts the agent's
//! kernel-side walk uses (`gpuprof_pystack`): the thread's own frame chain is read without the
//! GIL — only this thread pushes and pops its frames, and it is busy here. A walk records
//! (code object, instruction) pairs; a code object seen for the first time by this thread is
//! described once, right away, while its frame keeps it alive.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::{Layout, Memory, MemoryError, Version};

use crate::queue::{self, RawFrame, COUNTERS, MAX_FRAMES};

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

thread_local! {
    /// Code objects this thread has described already, with the identity each had then: the walk
    /// checks every frame here, so it is a plain array indexed by the address, not a hash set.
    static DESCRIBED: [Cell<(u64, u64)>; DESCRIBED_SLOTS] = const { [const { Cell::new((0, 0)) }; DESCRIBED_SLOTS] };
}

fn slot_of(code: u64) -> usize {
    // Code objects are at least 16-byte aligned and a few hundred bytes apart.
    ((code >> 4) ^ (code >> 16)) as usize % DESCRIBED_SLOTS
}

/// What tells a code object from another that later lives at the same address (functions made
/// at run time, `exec`, compiled graphs): its first line, its name and file objects, and the
/// start of the name's text (the strings' addresses are reused along with the code's; the name's
/// text sits beside its header, the file's would cost another cache line per frame).
/// SAFETY: `code` is the code object of a live frame.
unsafe fn identity(o: &gpuprof_pystack::offsets::Offsets, code: u64) -> u64 {
    unsafe {
        let name = field(code + u64::from(o.code_name));
        let file = field(code + u64::from(o.code_filename));
        let first_line = u64::from(((code + u64::from(o.code_firstlineno)) as *const u32).read_unaligned());
        name ^ file.rotate_left(21) ^ (first_line << 48) ^ name_start(o, name)
    }
}

/// Up to 8 bytes of a string object's text and its length, read as if it were compact ASCII
/// (for other strings the bytes are something else of the object's, as fixed as the text). Never
/// past the object: the length bounds the read.
/// SAFETY: `string` is a live str object (or null).
unsafe fn name_start(o: &gpuprof_pystack::offsets::Offsets, string: u64) -> u64 {
    if string == 0 {
        return 0;
    }
    unsafe {
        let length = field(string + u64::from(o.unicode_length));
        let mut bytes = [0u8; 8];
        let start = (string + u64::from(o.unicode_ascii_size)) as *const u8;
        std::ptr::copy_nonoverlapping(start, bytes.as_mut_ptr(), length.min(8) as usize);
        u64::from_le_bytes(bytes) ^ length
    }
}

/// Reads one pointer-sized field. SAFETY: `addr` must be inside a live object.
unsafe fn field(addr: u64) -> u64 {
    unsafe { (addr as *const u64).read_unaligned() }
}

/// Fills `frames` with this thread's Python stack, innermost first; returns how many.
pub fn walk(frames: &mut [RawFrame; MAX_FRAMES]) -> u8 {
    let Some(interpreter) = interpreter() else { return 0 };
    let o = &interpreter.layout.offsets;
    // SAFETY: the interpreter's own accessor; null when this thread has no Python state.
    let tstate = unsafe { (interpreter.this_thread_state)() } as u64;
    if tstate == 0 {
        return 0;
    }
    // SAFETY (all reads below): the thread state and the frames it links to are this thread's
    // own and stay in place while it is in this call.
    let mut frame = unsafe { field(tstate + u64::from(o.tstate_frame)) };
    if let (Some(current), true) = (o.cframe_current_frame, frame != 0) {
        frame = unsafe { field(frame + u64::from(current)) };
    }
    let skip_shims = interpreter.layout.has_cstack_frames;
    let mut count = 0usize;
    let mut links = 0usize;
    while frame != 0 && links < MAX_LINKS {
        links += 1;
        let is_shim = skip_shims
            && o.frame_owner
                .is_some_and(|owner| unsafe { *((frame + u64::from(owner)) as *const u8) } == FRAME_OWNED_BY_CSTACK);
        if !is_shim {
            if count == MAX_FRAMES {
                COUNTERS.stacks_cut.fetch_add(1, Ordering::Relaxed);
                return count as u8;
            }
            let code = unsafe { field(frame + u64::from(o.frame_code)) };
            let instr = unsafe { field(frame + u64::from(o.frame_instr)) };
            // SAFETY: the code object of a frame on this thread's stack.
            describe_once(interpreter, code, unsafe { identity(o, code) });
            frames[count] = RawFrame { code, instr };
            count += 1;
        }
        frame = unsafe { field(frame + u64::from(o.frame_previous)) };
    }
    count as u8
}

fn describe_once(interpreter: &Interpreter, code: u64, identity: u64) {
    let first_time = DESCRIBED.with(|described| described[slot_of(code)].replace((code, identity)) != (code, identity));
    if !first_time {
        return;
    }
    if let Ok(info) = CodeInfo::read(&OwnMemory, &interpreter.layout, code) {
        queue::push_code(code, info);
    }
}

/// The layout the sender symbolizes with (the same interpreter).
pub fn layout() -> Option<Layout> {
    interpreter().map(|i| i.layout)
}
