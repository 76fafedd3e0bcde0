/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel/user contract: every record the BPF programs put on the ring buffer, and the attach
 * cookie that tells the shared driver probes which entry point they sit on. The Rust types come
 * from this header through the skeleton generator; no layout here is written twice.
 */
#ifndef GPUPROF_H
#define GPUPROF_H

#define GP_COMM_LEN 16
#define GP_FILENAME_LEN 128

/*
 * GP_HANDLE_LEN, the bytes of the longest handle a call carries (CUDA's IPC handle, pool export
 * data, fabric handle), is gpuprof_model::driver_api::HANDLE_LEN, which the build passes to clang:
 * the CUPTI shim's calls carry handles of that length too, and one definition keeps them equal.
 */
#ifndef GP_HANDLE_LEN
#error "GP_HANDLE_LEN comes from gpuprof_model::driver_api::HANDLE_LEN, passed by ebpf/build.rs"
#endif

/* What a ring-buffer record carries. */
enum gp_record_kind {
	GP_RECORD_DRIVER = 1,	     /* one libcuda call, after it returned */
	GP_RECORD_FORK = 2,	     /* a tracked process created a child process */
	GP_RECORD_EXEC = 3,	     /* a tracked process replaced its program */
	GP_RECORD_EXIT = 4,	     /* the last thread of a tracked process exited */
	GP_RECORD_CODE = 5,	     /* a Python code object, the first time a thread's stack names it */
	GP_RECORD_ALLOCATOR = 6,     /* a framework allocator's block alloc/free (PyTorch's caching allocator) */
	GP_RECORD_ALLOCATOR_OOM = 7, /* the allocator gave up on a request: out of memory (same layout:
				      * size = the request, no block; its totals at the failure) */
};

/*
 * An allocator record: the header (addr = the block, size = its size, aux = the signed size as
 * reported: negative for a free, device = the CUDA device), then this, then the Python frames.
 * The autograd fields are set when the header has GP_FLAG_AUTOGRAD (PyTorch's autograd state of
 * the calling thread could be read): with a node being evaluated (the backward pass) they
 * describe that node, else the thread itself (the forward pass).
 */
struct gp_allocator {
	__u64 allocated;       /* the allocator's total of live blocks on that device, after the call */
	__u64 reserved;	       /* the allocator's total of segments held on that device */
	__u64 autograd_node;   /* the vtable of the torch::autograd::Node being evaluated; 0: none */
	__u64 autograd_seq;    /* that node's sequence_nr_; without a node, the thread's sequence
				* counter (the number the next node it makes will take) */
	__u64 autograd_thread; /* that node's thread_id_ (the thread that made it, as
				* at::RecordFunction numbers threads); without a node, this thread's */
	__u64 stack_hash;      /* a hash of the Python frames (0: none); with GP_FLAG_STACK_KNOWN the
				* frames are left out: this thread's earlier record with this hash had
				* them (in this process and stack epoch) */
};

/*
 * Where a process's PyTorch keeps the autograd state of each thread, set by user space per tgid
 * from libtorch_cpu.so's symbol table and relocations (copied to forked children in the kernel).
 * The thread-locals live in libtorch_cpu's TLS block: the thread's DTV entry `module` points at it.
 */
struct gp_autograd {
	__u64 module;		/* libtorch_cpu.so's TLS module id (its DTV index) in this process */
	__u32 sequence_nr;	/* block offset of at::sequence_number's counter (u64) */
	__u32 thread_id;	/* block offset of at::RecordFunction's current thread id (u64) */
	__u32 current_node;	/* block offset of the std::shared_ptr<Node> being evaluated */
	__u16 node_sequence_nr; /* offset of Node::sequence_nr_ */
	__u16 node_thread_id;	/* offset of Node::thread_id_ */
};

/*
 * The allocator probe reads the three autograd thread-locals at once when they lie within
 * GP_AUTOGRAD_TLS_SPAN bytes of each other (else one read each), and a node's fields within
 * GP_AUTOGRAD_NODE_SPAN (user space refuses a layout whose fields lie further apart): a read costs
 * far more than the bytes it copies.
 * Powers of two (the reads' lengths are masked with them).
 */
enum gp_autograd_span {
	GP_AUTOGRAD_TLS_SPAN = 512,
	GP_AUTOGRAD_NODE_SPAN = 64,
};

/* c10::DeviceType::CUDA: the only device whose blocks are recorded. */
#define GP_C10_DEVICE_CUDA 1

/*
 * How an entry point passes its arguments (x86-64 SysV), i.e. where the address, size, device and
 * handle bytes of the event are found. Several entry points share a shape; user space maps every
 * symbol to its shape and API id.
 */
enum gp_shape {
	GP_SHAPE_OUT_PTR_SIZE = 1,	/* out u64* arg0, u64 size arg1 */
	GP_SHAPE_OUT_PTR32_SIZE32 = 2,	/* legacy: out u32* arg0, u32 size arg1 */
	GP_SHAPE_OUT_PITCH = 3,		/* out u64* arg0, out u64* pitch arg1, height arg3 */
	GP_SHAPE_OUT_PITCH32 = 4,	/* legacy: out u32* arg0, out u32* pitch arg1, u32 height arg3 */
	GP_SHAPE_PTR = 5,		/* u64 address arg0 */
	GP_SHAPE_PTR32 = 6,		/* legacy: u32 address arg0 */
	GP_SHAPE_PTR_SIZE = 7,		/* u64 address arg0, u64 size arg1 */
	GP_SHAPE_VMM_CREATE = 8,	/* out handle arg0, size arg1, const CUmemAllocationProp* arg2 */
	GP_SHAPE_VMM_MAP = 9,		/* va arg0, size arg1, offset arg2, generic handle arg3 */
	GP_SHAPE_IPC_GET = 10,		/* out CUipcMemHandle* arg0 (64 bytes), address arg1 */
	GP_SHAPE_IPC_OPEN = 11,		/* out u64* arg0, CUipcMemHandle by value on the stack, flags arg1 */
	GP_SHAPE_SHAREABLE_EXPORT = 12, /* out void* arg0, generic handle arg1, handle type arg2 */
	GP_SHAPE_SHAREABLE_IMPORT = 13, /* out handle arg0, os handle arg1, handle type arg2 */
	GP_SHAPE_POOL_EXPORT = 14,	/* out CUmemPoolPtrExportData* arg0 (64 bytes), address arg1 */
	GP_SHAPE_POOL_IMPORT = 15,	/* out u64* arg0, pool arg1, const CUmemPoolPtrExportData* arg2 */
	GP_SHAPE_CTX_RETAIN = 16,	/* out CUcontext* arg0, device arg1 */
	GP_SHAPE_CTX_CREATE = 17,	/* out CUcontext* arg0, device in the argument named by param */
	GP_SHAPE_DEVICE = 18,		/* device arg0 */
	GP_SHAPE_MEM_INFO = 19,		/* out u64* free arg0, out u64* total arg1 */
	GP_SHAPE_MEM_INFO32 = 20,	/* legacy: out u32* free arg0, out u32* total arg1 */
	GP_SHAPE_OUT_PTR_SIZE32 = 21,	/* legacy: out u64* arg0, u32 size arg1 */
	GP_SHAPE_CTX_CURRENT = 22,	/* no record: CUcontext arg0 made the thread's current (param 0),
				      * or the one pushed before it made current again (param 1: pop) */
};

/* CUmemAllocationHandleType values whose handle bytes differ in length. */
#define GP_HANDLE_TYPE_POSIX_FD 1
#define GP_HANDLE_TYPE_FABRIC 8

/* The BPF cookie of every driver probe: which API (user space's table index) and its shape. */
struct gp_cookie {
	__u16 api;
	__u8 shape; /* enum gp_shape */
	__u8 param; /* shape-specific: for GP_SHAPE_CTX_CREATE, the device argument's index */
	__u32 reserved;
};

/*
 * One ring-buffer record: this header, then (in this order, each only when present)
 * GP_HANDLE_LEN bytes of handle (GP_FLAG_HANDLE), `stack_depth` struct gp_frame (innermost
 * first), and GP_FILENAME_LEN bytes of filename (exec records). Records carry only what they
 * have: most calls are the 96-byte header alone, which keeps per-event memory traffic down.
 */
struct gp_record {
	__u64 ts_ns;	   /* CLOCK_MONOTONIC at the call's entry (or at the tracepoint) */
	__u64 duration_ns; /* entry to return of a driver call */
	__u32 kind;	   /* enum gp_record_kind */
	__u32 pid;	   /* tgid */
	__u32 tid;
	__u32 ppid;	   /* parent tgid (process records; user space fills it for driver calls) */
	__u16 api;	   /* driver records: user space's API table index */
	__u8 handle_type;  /* CUmemAllocationHandleType for shareable handles */
	__u8 flags;	   /* GP_FLAG_* */
	__s32 result;	   /* CUresult of a driver call; wait status for exit records */
	__s32 device;	   /* -1 when the call does not say */
	__u8 handle_len;   /* valid bytes of the handle that follows (GP_FLAG_HANDLE) */
	__u8 stack_of;	   /* enum gp_stack_of: whose Python frames follow */
	__u16 stack_depth; /* Python frames that follow */
	__u64 addr;
	__u64 size;
	__u64 aux;    /* shape-specific: pitch; VMM map: the generic handle mapped; mem info:
			     * total bytes; shareable fd handles: the kernel file object;
			     * IPC open: flags; pool import: the pool */
	__u64 caller; /* driver records: the call's return address (user space names the
			     * module that called libcuda); 0 when unreadable */
	__u8 comm[GP_COMM_LEN];
};

/* One Python frame as the walk found it: symbolized in user space. */
struct gp_frame {
	__u64 code;  /* the code object */
	__u64 instr; /* the frame's instruction field: f_lasti (≤ 3.10) or an instruction pointer */
};

#define GP_MAX_FRAMES 64

/* An exec record: the header and the program executed. */
struct gp_exec_record {
	struct gp_record rec;
	__u8 filename[GP_FILENAME_LEN];
};

/*
 * Where a process's CPython keeps what the stack walk needs, set by user space per tgid once it
 * found the interpreter (and copied to forked children in the kernel). Offsets are in bytes;
 * GP_NO_OFFSET where the version has no such field.
 */
#define GP_NO_OFFSET 0xffff

struct gp_python {
	__u64 runtime;	  /* address of _PyRuntime */
	__u32 generation; /* changes with every program the process runs */
	__u16 code_filename;
	__u16 code_name; /* co_qualname where the version has it, else co_name */
	__u16 code_firstlineno;
	__u16 code_linetable;
	__u16 unicode_state;
	__u16 unicode_length;
	__u16 unicode_ascii_size;   /* compact ASCII data follows the PyASCIIObject header */
	__u16 unicode_compact_size; /* other compact data follows the PyCompactUnicodeObject one */
	__u16 bytes_size;
	__u16 bytes_data;
	__u16 interpreters_head; /* _PyRuntimeState.interpreters.head */
	__u16 threads_head;	 /* PyInterpreterState.threads.head (tstate_head before 3.11) */
	__u16 tstate_next;
	__u16 tstate_thread_id;	      /* pthread_t: the thread pointer (fs base) on x86-64 glibc */
	__u16 tstate_frame;	      /* frame (≤ 3.10), cframe (3.11, 3.12), current_frame (3.13) */
	__u16 cframe_current_frame;   /* 3.11, 3.12 */
	__u16 tstate_datastack_chunk; /* 3.11+: frames live in the thread's data stack, read at once */
	__u16 tstate_datastack_top;
	__u16 chunk_data;
	__u16 frame_code;
	__u16 frame_previous;
	__u16 frame_instr;
	__u16 frame_owner;	 /* 3.11+ */
	__u16 frame_read_len;	 /* bytes from a frame's start that cover every field above */
	__u16 tstate_read_start; /* the thread state's fields above lie in [start, start + len) */
	__u16 tstate_read_len;
	__u8 skip_cstack_frames; /* 3.12+: frames owned by the C stack are shims */
	__u8 reserved[3];
	__u32 stack_epoch; /* changes when user space forgets the stacks it was sent by hash: the
			    * threads send each stack's frames again */
};

/* The most frame_read_len can be: one read per frame brings every field the walk needs. */
#define GP_FRAME_READ_MAX 128
/* The most tstate_read_len can be: one read of the thread state per event. */
#define GP_TSTATE_READ_MAX 512

#define GP_FRAME_OWNED_BY_CSTACK 3

/*
 * A code record (GP_RECORD_CODE, `addr` = the code object) carries what symbolizing needs, read
 * while the process is alive: after the header comes this, then the function name's data, the
 * file name's data and the line table, each cut to its cap (user space reads the rest, if it
 * still can, when `*_chars` or `table_size` says more exists).
 */
#define GP_CODE_NAME_CAP 256
#define GP_CODE_FILE_CAP 1024
#define GP_CODE_TABLE_CAP 4096

struct gp_code {
	__s32 first_line;
	__u8 function_kind; /* PyUnicode kind of the data: 1, 2 or 4; 0 when unreadable */
	__u8 file_kind;
	__u16 reserved;
	__u32 function_chars; /* code points in the whole string */
	__u32 file_chars;
	__u32 table_size;   /* bytes in the whole line table */
	__u16 function_len; /* bytes of data that follow, for each */
	__u16 file_len;
	__u16 table_len;
	__u16 reserved2;
};

/*
 * Whose Python frames a record carries. A driver call made on one of PyTorch's autograd threads
 * (the backward pass: no Python frames there) while it evaluates a node carries the frames of
 * the thread that runs the pass, the process's main thread waiting in `loss.backward()`.
 */
enum gp_stack_of {
	GP_STACK_OWN = 0,
	GP_STACK_BACKWARD_CALLER = 1,
};

/* gp_record.flags */
#define GP_FLAG_OUT_UNREAD 1	  /* the call succeeded but its out-pointer could not be read */
#define GP_FLAG_EXIT_SIGNALED 2	  /* exit records: the process was killed by a signal */
#define GP_FLAG_HANDLE 4	  /* GP_HANDLE_LEN bytes of handle follow the header */
#define GP_FLAG_STACK_TRUNCATED 8 /* the Python stack was deeper than GP_MAX_FRAMES */
#define GP_FLAG_STACK_LOST 16	  /* the thread has Python frames that could not be read */
#define GP_FLAG_AUTOGRAD 32	  /* allocator records: the gp_allocator autograd fields are set */
#define GP_FLAG_STACK_KNOWN 64	  /* allocator records: frames left out, named by stack_hash */
/* driver records: made inside PyTorch's caching allocator's segment functions (its cache:
 * model::framework) */
#define GP_FLAG_ALLOCATOR_SEGMENT 128

/*
 * Where an allocator report's time goes in the probe (`phases`, per CPU, summed in ns), when the
 * agent sets `profile_phases` before load (a benchmark's breakdown; off, nothing is stamped).
 */
enum gp_phase {
	GP_PHASE_ENTRY = 0,	 /* the ids, the tracked check, the thread's storage, the record's header */
	GP_PHASE_AUTOGRAD = 1,	 /* autograd's thread-locals */
	GP_PHASE_THREAD = 2,	 /* the interpreter's entry, the thread state and its current frame */
	GP_PHASE_DATA_STACK = 3, /* the copy of the data stack */
	GP_PHASE_FRAMES = 4,	 /* the frames walked, code objects described */
	GP_PHASE_OUTPUT = 5,	 /* the record onto the ring buffer */
	GP_PHASE_REPORTS = 6,	 /* reports profiled (a count, not ns) */
	GP_PHASE_MAX = 7,
};

/* Counters every program bumps instead of failing silently (index into the per-CPU array). */
enum gp_counter {
	GP_COUNTER_RINGBUF_FULL = 0,	       /* a record was dropped: the ring buffer had no room */
	GP_COUNTER_PENDING_FULL = 1,	       /* an entry could not be saved for its return probe */
	GP_COUNTER_READ_FAILED = 2,	       /* an out-pointer or handle could not be read */
	GP_COUNTER_RETURN_UNMATCHED = 3,       /* a return without its entry (attached mid-call) */
	GP_COUNTER_STACK_UNREADABLE = 4,       /* a Python frame chain could not be read to the end */
	GP_COUNTER_ALLOCATOR_OTHER_DEVICE = 5, /* allocator reports for non-CUDA devices, not recorded */
	GP_COUNTER_TRACKED_FULL = 6,	       /* track_callers: a caller could not be added to the tracked map */
	GP_COUNTER_MAX = 7,
};

#endif
