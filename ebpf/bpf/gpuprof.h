/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel/user contract: every record the BPF programs put on the ring buffer, and the attach
 * cookie that tells the shared driver probes which entry point they sit on. The Rust types come
 * from this header through the skeleton generator; no layout here is written twice.
 */
#ifndef GPUPROF_H
#define GPUPROF_H

#define GP_COMM_LEN 16
#define GP_HANDLE_LEN 64
#define GP_FILENAME_LEN 128

/* What a ring-buffer record carries. */
enum gp_record_kind {
	GP_RECORD_DRIVER = 1, /* one libcuda call, after it returned */
	GP_RECORD_FORK = 2,   /* a tracked process created a child process */
	GP_RECORD_EXEC = 3,   /* a tracked process replaced its program */
	GP_RECORD_EXIT = 4,   /* the last thread of a tracked process exited */
};

/*
 * How an entry point passes its arguments (x86-64 SysV), i.e. where the address, size, device and
 * handle bytes of the event are found. Several entry points share a shape; user space maps every
 * symbol to its shape and API id.
 */
enum gp_shape {
	GP_SHAPE_OUT_PTR_SIZE = 1,   /* out u64* arg0, u64 size arg1 */
	GP_SHAPE_OUT_PTR32_SIZE32 = 2, /* legacy: out u32* arg0, u32 size arg1 */
	GP_SHAPE_OUT_PITCH = 3,      /* out u64* arg0, out u64* pitch arg1, height arg3 */
	GP_SHAPE_OUT_PITCH32 = 4,    /* legacy: out u32* arg0, out u32* pitch arg1, u32 height arg3 */
	GP_SHAPE_PTR = 5,            /* u64 address arg0 */
	GP_SHAPE_PTR32 = 6,          /* legacy: u32 address arg0 */
	GP_SHAPE_PTR_SIZE = 7,       /* u64 address arg0, u64 size arg1 */
	GP_SHAPE_VMM_CREATE = 8,     /* out handle arg0, size arg1, const CUmemAllocationProp* arg2 */
	GP_SHAPE_VMM_MAP = 9,        /* va arg0, size arg1, offset arg2, generic handle arg3 */
	GP_SHAPE_IPC_GET = 10,       /* out CUipcMemHandle* arg0 (64 bytes), address arg1 */
	GP_SHAPE_IPC_OPEN = 11,      /* out u64* arg0, CUipcMemHandle by value on the stack, flags arg1 */
	GP_SHAPE_SHAREABLE_EXPORT = 12, /* out void* arg0, generic handle arg1, handle type arg2 */
	GP_SHAPE_SHAREABLE_IMPORT = 13, /* out handle arg0, os handle arg1, handle type arg2 */
	GP_SHAPE_POOL_EXPORT = 14,   /* out CUmemPoolPtrExportData* arg0 (64 bytes), address arg1 */
	GP_SHAPE_POOL_IMPORT = 15,   /* out u64* arg0, pool arg1, const CUmemPoolPtrExportData* arg2 */
	GP_SHAPE_CTX_RETAIN = 16,    /* out CUcontext* arg0, device arg1 */
	GP_SHAPE_CTX_CREATE = 17,    /* out CUcontext* arg0, device in the argument named by param */
	GP_SHAPE_DEVICE = 18,        /* device arg0 */
	GP_SHAPE_MEM_INFO = 19,      /* out u64* free arg0, out u64* total arg1 */
	GP_SHAPE_MEM_INFO32 = 20,    /* legacy: out u32* free arg0, out u32* total arg1 */
	GP_SHAPE_OUT_PTR_SIZE32 = 21, /* legacy: out u64* arg0, u32 size arg1 */
};

/* CUmemAllocationHandleType values whose handle bytes differ in length. */
#define GP_HANDLE_TYPE_POSIX_FD 1
#define GP_HANDLE_TYPE_FABRIC 8

/* The BPF cookie of every driver probe: which API (user space's table index) and its shape. */
struct gp_cookie {
	__u16 api;
	__u8 shape;  /* enum gp_shape */
	__u8 param;  /* shape-specific: for GP_SHAPE_CTX_CREATE, the device argument's index */
	__u32 reserved;
};

/*
 * One ring-buffer record. Records are variable-length prefixes of this struct: a driver call
 * without handle bytes ends before `handle` (GP_RECORD_BASE_SIZE), one with handle bytes before
 * `filename` (GP_RECORD_HANDLE_SIZE); only exec records carry the filename. Small records keep
 * the per-event memory traffic down; user space copies what came into a zeroed full struct.
 */
struct gp_record {
	__u64 ts_ns;        /* CLOCK_MONOTONIC at the call's entry (or at the tracepoint) */
	__u64 duration_ns;  /* entry to return of a driver call */
	__u32 kind;         /* enum gp_record_kind */
	__u32 pid;          /* tgid */
	__u32 tid;
	__u32 ppid;         /* parent tgid (process records; user space fills it for driver calls) */
	__u16 api;          /* driver records: user space's API table index */
	__u8 handle_type;   /* CUmemAllocationHandleType for shareable handles */
	__u8 flags;         /* GP_FLAG_* */
	__s32 result;       /* CUresult of a driver call; wait status for exit records */
	__s32 device;       /* -1 when the call does not say */
	__u32 handle_len;   /* valid bytes in handle (0 when the record has none) */
	__u64 addr;
	__u64 size;
	__u64 aux;          /* shape-specific: pitch; VMM map: the generic handle mapped; mem info:
			     * total bytes; shareable fd handles: the kernel file object;
			     * IPC open: flags; pool import: the pool */
	__u8 comm[GP_COMM_LEN];
	__u8 handle[GP_HANDLE_LEN];     /* records of GP_RECORD_HANDLE_SIZE and longer */
	__u8 filename[GP_FILENAME_LEN]; /* exec records only: the program that was executed */
};

#define GP_RECORD_BASE_SIZE __builtin_offsetof(struct gp_record, handle)
#define GP_RECORD_HANDLE_SIZE __builtin_offsetof(struct gp_record, filename)
#define GP_RECORD_FULL_SIZE sizeof(struct gp_record)

/* gp_record.flags */
#define GP_FLAG_OUT_UNREAD 1 /* the call succeeded but its out-pointer could not be read */
#define GP_FLAG_EXIT_SIGNALED 2 /* exit records: the process was killed by a signal */

/* Counters every program bumps instead of failing silently (index into the per-CPU array). */
enum gp_counter {
	GP_COUNTER_RINGBUF_FULL = 0,   /* a record was dropped: the ring buffer had no room */
	GP_COUNTER_PENDING_FULL = 1,   /* an entry could not be saved for its return probe */
	GP_COUNTER_READ_FAILED = 2,    /* an out-pointer or handle could not be read */
	GP_COUNTER_RETURN_UNMATCHED = 3, /* a return without its entry (attached mid-call) */
	GP_COUNTER_MAX = 4,
};

#endif
