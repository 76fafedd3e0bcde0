//! Structure offsets of each CPython version, as data. Derived by compiling `derive/offsets.c`
//! against each version's headers (x86-64 release builds); the tests re-derive them from every
//! installed interpreter and compare. From 3.13 on, the interpreter publishes them itself in
//! `_Py_DebugOffsets` at the start of `_PyRuntime` (`debug_offsets`), and those win.

/// A CPython version, major.minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u8,
    pub minor: u8,
}

impl Version {
    /// From `PY_VERSION_HEX` (`Py_Version`): 0xMMmmppRS, major and minor in the top two bytes.
    pub(crate) fn from_hex(hex: u32) -> Version {
        let [major, minor, _micro, _release] = hex.to_be_bytes();
        Version { major, minor }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Byte offsets of the fields gpuprof reads. `None` where the version has no such field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offsets {
    pub runtime_interpreters_head: u16,
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    /// `pthread_t` of the thread: on x86-64 glibc, its thread pointer (the fs base).
    pub tstate_thread_id: u16,
    /// `frame` (≤ 3.10), `cframe` (3.11, 3.12), `current_frame` (3.13).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current_frame: Option<u16>,
    /// `datastack_chunk` (3.11+): the chunk of the thread's frame stack in use.
    pub tstate_datastack_chunk: Option<u16>,
    /// `datastack_top` (3.11+): the end of the frames in that chunk.
    pub tstate_datastack_top: Option<u16>,
    /// `_PyStackChunk.data` (3.11+): where a chunk's frames start.
    pub chunk_data: Option<u16>,
    /// `f_code` / `f_executable`.
    pub frame_code: u16,
    /// `f_back` (≤ 3.10) / `previous`.
    pub frame_previous: u16,
    /// `f_lasti` (≤ 3.10, an int) / `prev_instr` (3.11, 3.12) / `instr_ptr` (3.13).
    pub frame_instr: u16,
    /// `owner` (3.11+).
    pub frame_owner: Option<u16>,
    pub code_firstlineno: u16,
    pub code_filename: u16,
    pub code_name: u16,
    pub code_qualname: Option<u16>,
    /// `co_lnotab` (≤ 3.9) / `co_linetable`.
    pub code_linetable: u16,
    /// `co_code_adaptive`: the first instruction (3.11+).
    pub code_adaptive: Option<u16>,
    pub unicode_state: u16,
    pub unicode_length: u16,
    /// `sizeof(PyASCIIObject)`: compact ASCII data follows.
    pub unicode_ascii_size: u16,
    /// `sizeof(PyCompactUnicodeObject)`: other compact data follows.
    pub unicode_compact_size: u16,
    pub bytes_size: u16,
    pub bytes_data: u16,
}

impl Offsets {
    /// `PyASCIIObject.hash`: the `Py_hash_t` right after `length` in every version 3.8–3.13 (-1
    /// until computed; interned names, such as code objects' `co_name`, have theirs).
    pub fn unicode_hash(&self) -> u16 {
        self.unicode_length + 8
    }

    /// (name, value) pairs in the vocabulary of `derive/offsets.c`.
    pub fn named(&self) -> Vec<(&'static str, Option<u16>)> {
        vec![
            ("runtime.interpreters_head", Some(self.runtime_interpreters_head)),
            ("interp.threads_head", Some(self.interp_threads_head)),
            ("tstate.next", Some(self.tstate_next)),
            ("tstate.thread_id", Some(self.tstate_thread_id)),
            ("tstate.frame", Some(self.tstate_frame)),
            ("cframe.current_frame", self.cframe_current_frame),
            ("tstate.datastack_chunk", self.tstate_datastack_chunk),
            ("tstate.datastack_top", self.tstate_datastack_top),
            ("chunk.data", self.chunk_data),
            ("frame.code", Some(self.frame_code)),
            ("frame.previous", Some(self.frame_previous)),
            ("frame.instr", Some(self.frame_instr)),
            ("frame.owner", self.frame_owner),
            ("code.firstlineno", Some(self.code_firstlineno)),
            ("code.filename", Some(self.code_filename)),
            ("code.name", Some(self.code_name)),
            ("code.qualname", self.code_qualname),
            ("code.linetable", Some(self.code_linetable)),
            ("code.code_adaptive", self.code_adaptive),
            ("unicode.state", Some(self.unicode_state)),
            ("unicode.length", Some(self.unicode_length)),
            ("unicode.ascii_size", Some(self.unicode_ascii_size)),
            ("unicode.compact_size", Some(self.unicode_compact_size)),
            ("bytes.size", Some(self.bytes_size)),
            ("bytes.data", Some(self.bytes_data)),
        ]
    }
}

/// What a frame's instruction field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstrEncoding {
    /// 3.8, 3.9: `f_lasti`, a byte offset into the bytecode.
    ByteOffset,
    /// 3.10: `f_lasti`, an index in 2-byte code units.
    CodeUnitIndex,
    /// 3.11+: a pointer to the instruction inside `co_code_adaptive`.
    Pointer,
}

/// How a code object maps instructions to lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.8, 3.9: `co_lnotab` (byte increment, line increment) pairs.
    Lnotab,
    /// 3.10: PEP 626 `co_linetable` (byte delta, line delta) pairs.
    Pep626,
    /// 3.11+: the location table of varint-coded entries.
    Locations,
}

/// Everything version-specific about one interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub version: Version,
    pub offsets: Offsets,
    pub instr: InstrEncoding,
    pub line_table: LineTableFormat,
    /// 3.12+: frames owned by the C stack are shims between Python calls, not user frames.
    pub has_cstack_frames: bool,
}

const UNICODE_311: (u16, u16, u16, u16) = (32, 16, 48, 72);
const UNICODE_312: (u16, u16, u16, u16) = (32, 16, 40, 56);

const fn offsets_38_to_310(frame_instr: u16) -> Offsets {
    Offsets {
        runtime_interpreters_head: 32,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_thread_id: 176,
        tstate_frame: 24,
        cframe_current_frame: None,
        tstate_datastack_chunk: None,
        tstate_datastack_top: None,
        chunk_data: None,
        frame_code: 32,
        frame_previous: 24,
        frame_instr,
        frame_owner: None,
        code_firstlineno: 40,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_linetable: 120,
        code_adaptive: None,
        unicode_state: UNICODE_311.0,
        unicode_length: UNICODE_311.1,
        unicode_ascii_size: UNICODE_311.2,
        unicode_compact_size: UNICODE_311.3,
        bytes_size: 16,
        bytes_data: 32,
    }
}

const OFFSETS_311: Offsets = Offsets {
    runtime_interpreters_head: 40,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_frame: 56,
    cframe_current_frame: Some(8),
    tstate_datastack_chunk: Some(296),
    tstate_datastack_top: Some(304),
    chunk_data: Some(24),
    frame_code: 32,
    frame_previous: 48,
    frame_instr: 56,
    frame_owner: Some(69),
    code_firstlineno: 72,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    code_adaptive: Some(184),
    unicode_state: UNICODE_311.0,
    unicode_length: UNICODE_311.1,
    unicode_ascii_size: UNICODE_311.2,
    unicode_compact_size: UNICODE_311.3,
    bytes_size: 16,
    bytes_data: 32,
};

const OFFSETS_312: Offsets = Offsets {
    runtime_interpreters_head: 40,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_frame: 56,
    cframe_current_frame: Some(0),
    tstate_datastack_chunk: Some(232),
    tstate_datastack_top: Some(240),
    chunk_data: Some(24),
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    frame_owner: Some(70),
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    code_adaptive: Some(192),
    unicode_state: UNICODE_312.0,
    unicode_length: UNICODE_312.1,
    unicode_ascii_size: UNICODE_312.2,
    unicode_compact_size: UNICODE_312.3,
    bytes_size: 16,
    bytes_data: 32,
};

const OFFSETS_313: Offsets = Offsets {
    runtime_interpreters_head: 632,
    interp_threads_head: 7344,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_frame: 72,
    cframe_current_frame: None,
    tstate_datastack_chunk: Some(232),
    tstate_datastack_top: Some(240),
    chunk_data: Some(24),
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    frame_owner: Some(70),
    code_firstlineno: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: Some(128),
    code_linetable: 136,
    code_adaptive: Some(200),
    unicode_state: UNICODE_312.0,
    unicode_length: UNICODE_312.1,
    unicode_ascii_size: UNICODE_312.2,
    unicode_compact_size: UNICODE_312.3,
    bytes_size: 16,
    bytes_data: 32,
};

/// The built-in layout of a version, if gpuprof knows it.
pub fn layout_for(version: Version) -> Option<Layout> {
    let (offsets, instr, line_table) = match (version.major, version.minor) {
        (3, 8) | (3, 9) => (offsets_38_to_310(104), InstrEncoding::ByteOffset, LineTableFormat::Lnotab),
        (3, 10) => (offsets_38_to_310(96), InstrEncoding::CodeUnitIndex, LineTableFormat::Pep626),
        (3, 11) => (OFFSETS_311, InstrEncoding::Pointer, LineTableFormat::Locations),
        (3, 12) => (OFFSETS_312, InstrEncoding::Pointer, LineTableFormat::Locations),
        (3, 13) => (OFFSETS_313, InstrEncoding::Pointer, LineTableFormat::Locations),
        _ => return None,
    };
    Some(Layout { version, offsets, instr, line_table, has_cstack_frames: version.minor >= 12 })
}
