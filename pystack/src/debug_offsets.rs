//! `_Py_DebugOffsets`: from 3.13 on, the interpreter publishes the offsets of its own structures
//! at the start of `_PyRuntime`, for debuggers and profilers. [`DebugOffsets313`] mirrors the
//! 3.13 layout field by field, so each offset gpuprof takes from it is read by name.

use thiserror::Error;

use crate::offsets::Offsets;

/// What `_Py_DebugOffsets` starts with.
const COOKIE: [u8; 8] = *b"xdebugpy";

/// CPython 3.13's `_Py_DebugOffsets` (Include/internal/pycore_runtime.h; later versions keep it
/// in pycore_debug_offsets.h and add fields). Every field is a `uint64_t`, and each group opens
/// with the size of the structure it describes; the groups gpuprof does not read are here so the
/// ones after them lie where they do in the interpreter.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DebugOffsets313 {
    pub cookie: [u8; 8],
    /// `PY_VERSION_HEX`.
    pub version: u64,
    pub free_threaded: u64,
    pub runtime_state: RuntimeState,
    pub interpreter_state: InterpreterState,
    pub thread_state: ThreadState,
    pub interpreter_frame: InterpreterFrame,
    pub code_object: CodeObject,
    pub pyobject: PyObject,
    pub type_object: TypeObject,
    pub tuple_object: TupleObject,
    pub list_object: ListObject,
    pub dict_object: DictObject,
    pub float_object: FloatObject,
    pub long_object: LongObject,
    pub bytes_object: BytesObject,
    pub unicode_object: UnicodeObject,
    pub gc: Gc,
}

/// `_PyRuntimeState`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuntimeState {
    pub size: u64,
    pub finalizing: u64,
    pub interpreters_head: u64,
}

/// `PyInterpreterState`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InterpreterState {
    pub size: u64,
    pub id: u64,
    pub next: u64,
    pub threads_head: u64,
    pub gc: u64,
    pub imports_modules: u64,
    pub sysdict: u64,
    pub builtins: u64,
    pub ceval_gil: u64,
    pub gil_runtime_state: u64,
    pub gil_runtime_state_enabled: u64,
    pub gil_runtime_state_locked: u64,
    pub gil_runtime_state_holder: u64,
}

/// `PyThreadState`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadState {
    pub size: u64,
    pub prev: u64,
    pub next: u64,
    pub interp: u64,
    pub current_frame: u64,
    pub thread_id: u64,
    pub native_thread_id: u64,
    pub datastack_chunk: u64,
    pub status: u64,
}

/// `_PyInterpreterFrame`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InterpreterFrame {
    pub size: u64,
    pub previous: u64,
    pub executable: u64,
    pub instr_ptr: u64,
    pub localsplus: u64,
    pub owner: u64,
}

/// `PyCodeObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CodeObject {
    pub size: u64,
    pub filename: u64,
    pub name: u64,
    pub qualname: u64,
    pub linetable: u64,
    pub firstlineno: u64,
    pub argcount: u64,
    pub localsplusnames: u64,
    pub localspluskinds: u64,
    pub co_code_adaptive: u64,
}

/// `PyObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PyObject {
    pub size: u64,
    pub ob_type: u64,
}

/// `PyTypeObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TypeObject {
    pub size: u64,
    pub tp_name: u64,
    pub tp_repr: u64,
    pub tp_flags: u64,
}

/// `PyTupleObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TupleObject {
    pub size: u64,
    pub ob_item: u64,
    pub ob_size: u64,
}

/// `PyListObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListObject {
    pub size: u64,
    pub ob_item: u64,
    pub ob_size: u64,
}

/// `PyDictObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DictObject {
    pub size: u64,
    pub ma_keys: u64,
    pub ma_values: u64,
}

/// `PyFloatObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FloatObject {
    pub size: u64,
    pub ob_fval: u64,
}

/// `PyLongObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LongObject {
    pub size: u64,
    pub lv_tag: u64,
    pub ob_digit: u64,
}

/// `PyBytesObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BytesObject {
    pub size: u64,
    pub ob_size: u64,
    pub ob_sval: u64,
}

/// `PyUnicodeObject`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnicodeObject {
    pub size: u64,
    pub state: u64,
    pub length: u64,
    /// `sizeof(PyASCIIObject)`.
    pub asciiobject_size: u64,
}

/// `struct _gc_runtime_state`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gc {
    pub size: u64,
    pub collecting: u64,
}

/// The 3.13 header has 73 words (the cookie one of them): a field left out of the mirror, or one
/// too many, fails the build.
const _: () = assert!(DEBUG_OFFSETS_LEN == 73 * 8);

/// The bytes of `_PyRuntime` to read.
pub(crate) const DEBUG_OFFSETS_LEN: usize = size_of::<DebugOffsets313>();

/// A pointer in the interpreter (x86-64).
const POINTER_SIZE: u64 = 8;

#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum DebugOffsetsError {
    #[error("_PyRuntime does not start with the _Py_DebugOffsets cookie")]
    NoCookie,
    #[error("the interpreter is a free-threaded build, which gpuprof does not read yet")]
    FreeThreaded,
    #[error("_Py_DebugOffsets is shorter than expected")]
    Short,
    #[error("_Py_DebugOffsets names an offset past 64 KiB: {0}")]
    Implausible(u64),
}

impl DebugOffsets313 {
    /// The struct from the first [`DEBUG_OFFSETS_LEN`] bytes of `_PyRuntime`, checked for its
    /// cookie.
    pub(crate) fn parse(bytes: &[u8]) -> Result<DebugOffsets313, DebugOffsetsError> {
        if bytes.len() < DEBUG_OFFSETS_LEN {
            return Err(DebugOffsetsError::Short);
        }
        // SAFETY: the length is checked above, and DebugOffsets313 is plain `repr(C)` data (a
        // byte array and u64s): any bytes are a valid value. The interpreter runs on this
        // machine, so its u64s are in our byte order.
        let debug = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<DebugOffsets313>()) };
        if debug.cookie != COOKIE {
            return Err(DebugOffsetsError::NoCookie);
        }
        Ok(debug)
    }

    /// The offsets gpuprof reads. Unicode and bytes layouts come from here too; what the struct
    /// does not publish comes from `fallback`.
    pub(crate) fn offsets(&self, fallback: &Offsets) -> Result<Offsets, DebugOffsetsError> {
        if self.free_threaded != 0 {
            return Err(DebugOffsetsError::FreeThreaded);
        }
        let (thread, frame, code) = (&self.thread_state, &self.interpreter_frame, &self.code_object);
        Ok(Offsets {
            runtime_interpreters_head: offset(self.runtime_state.interpreters_head)?,
            interp_threads_head: offset(self.interpreter_state.threads_head)?,
            tstate_next: offset(thread.next)?,
            tstate_thread_id: offset(thread.thread_id)?,
            tstate_frame: offset(thread.current_frame)?,
            cframe_current_frame: None,
            tstate_datastack_chunk: Some(offset(thread.datastack_chunk)?),
            // Not published: datastack_top is the pointer after datastack_chunk in
            // PyThreadState, and chunks start with (previous, size, top) before their data.
            tstate_datastack_top: Some(offset(thread.datastack_chunk.saturating_add(POINTER_SIZE))?),
            chunk_data: fallback.chunk_data,
            frame_previous: offset(frame.previous)?,
            frame_code: offset(frame.executable)?,
            frame_instr: offset(frame.instr_ptr)?,
            frame_owner: Some(offset(frame.owner)?),
            code_filename: offset(code.filename)?,
            code_name: offset(code.name)?,
            code_qualname: Some(offset(code.qualname)?),
            code_linetable: offset(code.linetable)?,
            code_firstlineno: offset(code.firstlineno)?,
            code_adaptive: Some(offset(code.co_code_adaptive)?),
            bytes_size: offset(self.bytes_object.ob_size)?,
            bytes_data: offset(self.bytes_object.ob_sval)?,
            unicode_state: offset(self.unicode_object.state)?,
            unicode_length: offset(self.unicode_object.length)?,
            unicode_ascii_size: offset(self.unicode_object.asciiobject_size)?,
            // Not published: sizeof(PyCompactUnicodeObject) is the ASCII header plus utf8_length
            // and utf8, which the fallback table has.
            unicode_compact_size: fallback.unicode_compact_size,
        })
    }
}

/// A published offset, which gpuprof keeps in 16 bits (no structure it reads comes close).
fn offset(value: u64) -> Result<u16, DebugOffsetsError> {
    u16::try_from(value).map_err(|_| DebugOffsetsError::Implausible(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::{layout_for, Version};

    /// `_Py_DebugOffsets` as 73 words: the cookie, then 1000 + the word's index.
    fn numbered_words() -> Vec<u8> {
        let mut bytes = COOKIE.to_vec();
        bytes.extend((1..73u64).flat_map(|index| (1000 + index).to_ne_bytes()));
        bytes
    }

    #[test]
    fn each_field_is_the_word_the_header_puts_it_at() {
        let mut bytes = numbered_words();
        bytes[16..24].copy_from_slice(&0u64.to_ne_bytes()); // not free-threaded
        let debug = DebugOffsets313::parse(&bytes).unwrap();
        assert_eq!((debug.version, debug.free_threaded), (1001, 0));
        assert_eq!(debug.runtime_state, RuntimeState { size: 1003, finalizing: 1004, interpreters_head: 1005 });
        assert_eq!((debug.interpreter_state.size, debug.interpreter_state.threads_head), (1006, 1009));
        assert_eq!(debug.interpreter_state.gil_runtime_state_holder, 1018);
        assert_eq!((debug.thread_state.size, debug.thread_state.status), (1019, 1027));
        assert_eq!((debug.interpreter_frame.size, debug.interpreter_frame.owner), (1028, 1033));
        assert_eq!((debug.code_object.size, debug.code_object.co_code_adaptive), (1034, 1043));
        assert_eq!(debug.bytes_object, BytesObject { size: 1064, ob_size: 1065, ob_sval: 1066 });
        assert_eq!(debug.unicode_object.asciiobject_size, 1070);
        assert_eq!(debug.gc, Gc { size: 1071, collecting: 1072 });

        let fallback = layout_for(Version { major: 3, minor: 13 }).unwrap().offsets;
        let offsets = debug.offsets(&fallback).unwrap();
        let read = |name: &str| offsets.named().into_iter().find(|(n, _)| *n == name).unwrap().1;
        let expected = [
            ("runtime.interpreters_head", Some(1005)),
            ("interp.threads_head", Some(1009)),
            ("tstate.next", Some(1021)),
            ("tstate.thread_id", Some(1024)),
            ("tstate.frame", Some(1023)),
            ("cframe.current_frame", None),
            ("tstate.datastack_chunk", Some(1026)),
            ("tstate.datastack_top", Some(1034)),
            ("chunk.data", fallback.chunk_data),
            ("frame.code", Some(1030)),
            ("frame.previous", Some(1029)),
            ("frame.instr", Some(1031)),
            ("frame.owner", Some(1033)),
            ("code.firstlineno", Some(1039)),
            ("code.filename", Some(1035)),
            ("code.name", Some(1036)),
            ("code.qualname", Some(1037)),
            ("code.linetable", Some(1038)),
            ("code.code_adaptive", Some(1043)),
            ("unicode.state", Some(1068)),
            ("unicode.length", Some(1069)),
            ("unicode.ascii_size", Some(1070)),
            ("unicode.compact_size", Some(fallback.unicode_compact_size)),
            ("bytes.size", Some(1065)),
            ("bytes.data", Some(1066)),
        ];
        for (name, value) in expected {
            assert_eq!(read(name), value, "{name}");
        }
        assert_eq!(offsets.named().len(), expected.len());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let bytes = numbered_words();
        assert_eq!(DebugOffsets313::parse(&bytes[..DEBUG_OFFSETS_LEN - 1]), Err(DebugOffsetsError::Short));
        let mut no_cookie = bytes.clone();
        no_cookie[0] = b'y';
        assert_eq!(DebugOffsets313::parse(&no_cookie), Err(DebugOffsetsError::NoCookie));
        let fallback = layout_for(Version { major: 3, minor: 13 }).unwrap().offsets;
        // free_threaded is 1002 here.
        let debug = DebugOffsets313::parse(&bytes).unwrap();
        assert_eq!(debug.offsets(&fallback), Err(DebugOffsetsError::FreeThreaded));
        let mut huge = debug;
        huge.free_threaded = 0;
        huge.code_object.name = 1 << 16;
        assert_eq!(huge.offsets(&fallback), Err(DebugOffsetsError::Implausible(1 << 16)));
    }
}
