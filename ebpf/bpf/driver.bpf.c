// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Driver-level capture: one entry and one return program, attached to every memory entry point of
 * libcuda with a cookie naming the API and its argument shape. The entry saves the arguments (and
 * the bytes that only exist at entry, such as an IPC handle passed by value on the stack); the
 * return reads the out-pointers and emits one record per call, failed calls included.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "pystack.bpf.h"
#include "autograd.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Exported to user space through the skeleton so both sides share one definition. */
struct gp_record gp_record_layout = {};
struct gp_frame gp_frame_layout = {};
struct gp_exec_record gp_exec_record_layout = {};
struct gp_python gp_python_layout = {};
struct gp_code gp_code_layout = {};
struct gp_allocator gp_allocator_layout = {};
struct gp_cookie gp_cookie_layout = {};
enum gp_shape gp_shape_values = 0;
enum gp_record_kind gp_record_kind_values = 0;
enum gp_counter gp_counter_values = 0;
enum gp_stack_of gp_stack_of_values = 0;

/*
 * What the entry reads of CUDA's own structs, declared as cuda.h declares them (its names, enums
 * as the 4-byte integers they are) and read with offsetof: the struct is user memory, with no
 * kernel BTF to relocate against.
 */
struct CUmemLocation_st {
	__u32 type; /* CUmemLocationType */
	__s32 id;   /* the device, for CU_MEM_LOCATION_TYPE_DEVICE */
};

/* cuMemCreate's `const CUmemAllocationProp *prop`: where the allocation lives. */
struct CUmemAllocationProp_st {
	__u32 type;		    /* CUmemAllocationType */
	__u32 requestedHandleTypes; /* CUmemAllocationHandleType */
	struct CUmemLocation_st location;
	__u64 win32HandleMetaData; /* void *: a number here, so the skeleton's types stay Send */
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
};

/* CUDA's IPC handle: GP_HANDLE_LEN is its length (the longest handle any call carries). */
struct CUipcMemHandle_st {
	char reserved[GP_HANDLE_LEN];
};

/*
 * The stack at a probe, as the System V x86-64 ABI lays it out: the probe sits at the function's
 * first instruction (or just past its endbr64), before the function pushed anything, so sp points
 * at the return address the call pushed, and the arguments passed in memory follow it in order.
 * Of the probed entry points only cuIpcOpenMemHandle(_v2)(CUdeviceptr *pdptr, CUipcMemHandle
 * handle, unsigned int Flags) has one: the ABI passes a struct of more than 16 bytes (class
 * MEMORY) on the stack, so its second argument, the handle, takes no register (Flags is in the
 * second one, rsi) and is the first thing above the return address.
 */
struct stack_at_entry {
	__u64 return_address;
	struct CUipcMemHandle_st ipc_open_handle;
};

/* Exported for the layout tests (src/lib.rs), which compare them with cuda.h and the stand-in. */
struct CUmemAllocationProp_st cu_mem_allocation_prop_layout = {};
struct stack_at_entry stack_at_entry_layout = {};

struct pending_call {
	__u64 ts_ns;
	__u64 caller;	   /* the return address */
	bool by_allocator; /* made inside the caching allocator's segment functions */
	__u64 args[6];
	__s32 device;
	__u32 data_len;
	__u8 data[GP_HANDLE_LEN]; /* bytes that exist only at entry (handles passed in) */
};

/* Calls in flight on one thread, entry to return. Two slots, matched by API, so a call nested
 * inside another entry point keeps both. Task-local: no hash on the hot path, and the slots of
 * a thread that dies inside the driver go with it. */
#define PENDING_SLOTS 2

/* A driver record being put together before it goes to the ring buffer: the header, then the
 * handle (when the call carries one), then the frames right after what precedes them. */
struct driver_record {
	struct gp_record rec;
	__u8 handle[GP_HANDLE_LEN];
	struct gp_frame frames[GP_MAX_FRAMES];
};

struct pending_calls {
	struct pending_call call[PENDING_SLOTS];
	__u32 api_plus_one[PENDING_SLOTS]; /* 0: free */
	/* The thread's current context as the probes saw it made current (0: not seen), and the
	 * one a push replaced, for the pop. */
	__u64 current_ctx;
	__u64 pushed_over;
	/* The outermost of PyTorch's caching-allocator segment functions the thread is in: the stack
	 * slot its return address was pushed to (the stack pointer at its entry) and that address;
	 * 0 when none. No return probe marks its end (a uretprobe would break C++ exceptions thrown
	 * through it): the function is still running while its return address is still in its slot
	 * and the stack is below it. */
	__u64 segment_frame;
	__u64 segment_return;
	struct autograd_block autograd;
	struct driver_record out;
	struct stack_scratch stack;
};

/* Each context's device, from the call that made it (primary retain, create): a driver call
 * names no device, the thread's current context does. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __s32);
} ctx_device SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pending_calls);
} pending SEC(".maps");

static __always_inline struct gp_cookie read_cookie(void *ctx)
{
	union {
		__u64 raw;
		struct gp_cookie cookie;
	} value = { .raw = bpf_get_attach_cookie(ctx) };
	return value.cookie;
}

/* The kernel's struct file behind a descriptor of the current process: the same object in every
 * process the descriptor was passed to, so it matches a POSIX-fd export to its import. */
static __always_inline __u64 fd_object_id(__s32 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **files;
	struct file *file = NULL;

	if (fd < 0 || fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	files = BPF_CORE_READ(fdt, fd);
	bpf_probe_read_kernel(&file, sizeof(file), &files[fd]);
	return (__u64)file;
}

static __always_inline void read_user_u64(struct gp_record *rec, __u64 *dst, __u64 src)
{
	if (bpf_probe_read_user(dst, sizeof(*dst), (void *)src)) {
		count(GP_COUNTER_READ_FAILED);
		rec->flags |= GP_FLAG_OUT_UNREAD;
	}
}

static __always_inline void read_user_u32(struct gp_record *rec, __u64 *dst, __u64 src)
{
	__u32 value = 0;

	if (bpf_probe_read_user(&value, sizeof(value), (void *)src)) {
		count(GP_COUNTER_READ_FAILED);
		rec->flags |= GP_FLAG_OUT_UNREAD;
	}
	*dst = value;
}

static __always_inline void read_user_handle(struct driver_record *out, __u64 src, __u32 len)
{
	if (len > GP_HANDLE_LEN)
		len = GP_HANDLE_LEN;
	if (bpf_probe_read_user(out->handle, len, (void *)src)) {
		count(GP_COUNTER_READ_FAILED);
		out->rec.flags |= GP_FLAG_OUT_UNREAD;
		return;
	}
	out->rec.handle_len = len;
}

/* Length of the bytes a shareable handle of this type occupies. */
static __always_inline __u32 shareable_handle_len(__u64 type)
{
	if (type == GP_HANDLE_TYPE_FABRIC)
		return GP_HANDLE_LEN;
	if (type == GP_HANDLE_TYPE_POSIX_FD)
		return sizeof(__s32);
	return sizeof(__u64);
}

/* True while the thread runs inside the segment function noted in `calls`, seen from a stack
 * pointer `sp`; a note the function has returned from is cleared. */
static __always_inline bool in_segment_function(struct pending_calls *calls, __u64 sp)
{
	__u64 slot = 0;

	if (!calls->segment_frame)
		return false;
	if (sp < calls->segment_frame && !bpf_probe_read_user(&slot, sizeof(slot), (void *)calls->segment_frame) &&
	    slot == calls->segment_return)
		return true;
	calls->segment_frame = 0;
	return false;
}

static __always_inline int on_entry(struct pt_regs *ctx)
{
	__u64 pid_tgid;

	if (!current_ids(&pid_tgid) || !record_call_of(pid_tgid >> 32))
		return 0;

	struct gp_cookie cookie = read_cookie(ctx);
	struct pending_calls *calls =
		bpf_task_storage_get(&pending, bpf_get_current_task_btf(), NULL, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!calls) {
		count(GP_COUNTER_PENDING_FULL);
		return 0;
	}
	if (cookie.shape == GP_SHAPE_CTX_CURRENT) {
		if (cookie.param == 1) {
			calls->current_ctx = calls->pushed_over;
		} else {
			calls->pushed_over = calls->current_ctx;
			calls->current_ctx = PT_REGS_PARM1(ctx);
		}
		return 0;
	}
	/* A free slot, or one this API left behind (a call that never returned). */
	__u32 slot = PENDING_SLOTS;
	for (__u32 i = 0; i < PENDING_SLOTS; i++) {
		if (calls->api_plus_one[i] == 0 || calls->api_plus_one[i] == cookie.api + 1u) {
			slot = i;
			break;
		}
	}
	if (slot >= PENDING_SLOTS) {
		count(GP_COUNTER_PENDING_FULL);
		return 0;
	}
	struct pending_call *call = &calls->call[slot];

	call->ts_ns = bpf_ktime_get_ns();
	call->device = -1;
	call->data_len = 0;
	call->args[0] = PT_REGS_PARM1(ctx);
	call->args[1] = PT_REGS_PARM2(ctx);
	call->args[2] = PT_REGS_PARM3(ctx);
	call->args[3] = PT_REGS_PARM4(ctx);
	call->args[4] = PT_REGS_PARM5(ctx);
	call->args[5] = PT_REGS_PARM6(ctx);
	__u64 sp = PT_REGS_SP(ctx);
	if (bpf_probe_read_user(&call->caller, sizeof(call->caller),
				(void *)(sp + offsetof(struct stack_at_entry, return_address))))
		call->caller = 0;
	call->by_allocator = in_segment_function(calls, sp);

	switch (cookie.shape) {
	case GP_SHAPE_IPC_OPEN:
		if (bpf_probe_read_user(call->data, sizeof(struct CUipcMemHandle_st),
					(void *)(sp + offsetof(struct stack_at_entry, ipc_open_handle))))
			count(GP_COUNTER_READ_FAILED);
		else
			call->data_len = sizeof(struct CUipcMemHandle_st);
		break;
	case GP_SHAPE_POOL_IMPORT:
		if (bpf_probe_read_user(call->data, GP_HANDLE_LEN, (void *)call->args[2]))
			count(GP_COUNTER_READ_FAILED);
		else
			call->data_len = GP_HANDLE_LEN;
		break;
	case GP_SHAPE_SHAREABLE_IMPORT:
		if (call->args[2] == GP_HANDLE_TYPE_FABRIC) {
			if (bpf_probe_read_user(call->data, GP_HANDLE_LEN, (void *)call->args[1]))
				count(GP_COUNTER_READ_FAILED);
			else
				call->data_len = GP_HANDLE_LEN;
		} else {
			/* fd and win32 handles are passed as the pointer value itself. */
			__builtin_memcpy(call->data, &call->args[1], sizeof(__u64));
			call->data_len = shareable_handle_len(call->args[2]);
		}
		break;
	case GP_SHAPE_VMM_CREATE: {
		__s32 device = -1;

		if (bpf_probe_read_user(&device, sizeof(device),
					(void *)(call->args[2] + offsetof(struct CUmemAllocationProp_st, location.id))))
			count(GP_COUNTER_READ_FAILED);
		call->device = device;
		break;
	}
	default:
		break;
	}
	calls->api_plus_one[slot] = cookie.api + 1u;
	return 0;
}

static __always_inline void fill_plain(struct gp_record *rec, struct gp_cookie cookie, __u64 *args, bool ok)
{
	switch (cookie.shape) {
	case GP_SHAPE_OUT_PTR_SIZE:
	case GP_SHAPE_VMM_CREATE:
		rec->size = args[1];
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_OUT_PTR_SIZE32:
		rec->size = (__u32)args[1];
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_OUT_PTR32_SIZE32:
		rec->size = (__u32)args[1];
		if (ok)
			read_user_u32(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_OUT_PITCH:
		if (ok) {
			read_user_u64(rec, &rec->addr, args[0]);
			read_user_u64(rec, &rec->aux, args[1]);
			rec->size = rec->aux * args[3];
		} else {
			rec->size = args[2] * args[3];
		}
		break;
	case GP_SHAPE_OUT_PITCH32:
		if (ok) {
			read_user_u32(rec, &rec->addr, args[0]);
			read_user_u32(rec, &rec->aux, args[1]);
			rec->size = rec->aux * (__u32)args[3];
		} else {
			rec->size = (__u64)(__u32)args[2] * (__u32)args[3];
		}
		break;
	case GP_SHAPE_PTR:
		rec->addr = args[0];
		break;
	case GP_SHAPE_PTR32:
		rec->addr = (__u32)args[0];
		break;
	case GP_SHAPE_PTR_SIZE:
		rec->addr = args[0];
		rec->size = args[1];
		break;
	case GP_SHAPE_VMM_MAP:
		rec->addr = args[0];
		rec->size = args[1];
		rec->aux = args[3];
		break;
	case GP_SHAPE_CTX_RETAIN:
		rec->device = (__s32)args[1];
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_CTX_CREATE:
		if (cookie.param == 2)
			rec->device = (__s32)args[2];
		else if (cookie.param == 3)
			rec->device = (__s32)args[3];
		else if (cookie.param == 4)
			rec->device = (__s32)args[4];
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_DEVICE:
		rec->device = (__s32)args[0];
		break;
	case GP_SHAPE_MEM_INFO:
		if (ok) {
			read_user_u64(rec, &rec->size, args[0]);
			read_user_u64(rec, &rec->aux, args[1]);
		}
		break;
	case GP_SHAPE_MEM_INFO32:
		if (ok) {
			read_user_u32(rec, &rec->size, args[0]);
			read_user_u32(rec, &rec->aux, args[1]);
		}
		break;
	default:
		break;
	}
}

/* IPC and shareable-handle calls: the record carries the handle bytes. */
static __always_inline void fill_with_handle(struct driver_record *out, struct gp_cookie cookie,
					     struct pending_call *call, bool ok)
{
	struct gp_record *rec = &out->rec;
	__u64 *args = call->args;

	switch (cookie.shape) {
	case GP_SHAPE_IPC_GET:
	case GP_SHAPE_POOL_EXPORT:
		rec->addr = args[1];
		if (ok)
			read_user_handle(out, args[0], GP_HANDLE_LEN);
		break;
	case GP_SHAPE_IPC_OPEN:
		__builtin_memcpy(out->handle, call->data, GP_HANDLE_LEN);
		rec->handle_len = call->data_len;
		rec->aux = (__u32)args[1]; /* flags */
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_POOL_IMPORT:
		__builtin_memcpy(out->handle, call->data, GP_HANDLE_LEN);
		rec->handle_len = call->data_len;
		rec->aux = args[1]; /* pool */
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	case GP_SHAPE_SHAREABLE_EXPORT:
		rec->addr = args[1];
		rec->handle_type = (__u8)args[2];
		if (ok) {
			read_user_handle(out, args[0], shareable_handle_len(args[2]));
			if (args[2] == GP_HANDLE_TYPE_POSIX_FD && rec->handle_len)
				rec->aux = fd_object_id(*(__s32 *)out->handle);
		}
		break;
	case GP_SHAPE_SHAREABLE_IMPORT:
		__builtin_memcpy(out->handle, call->data, GP_HANDLE_LEN);
		rec->handle_len = call->data_len;
		rec->handle_type = (__u8)args[2];
		if (args[2] == GP_HANDLE_TYPE_POSIX_FD)
			rec->aux = fd_object_id((__s32)args[1]);
		if (ok)
			read_user_u64(rec, &rec->addr, args[0]);
		break;
	default:
		break;
	}
}

static __always_inline bool carries_handle(__u8 shape)
{
	return shape == GP_SHAPE_IPC_GET || shape == GP_SHAPE_IPC_OPEN || shape == GP_SHAPE_POOL_EXPORT ||
	       shape == GP_SHAPE_POOL_IMPORT || shape == GP_SHAPE_SHAREABLE_EXPORT ||
	       shape == GP_SHAPE_SHAREABLE_IMPORT;
}

static __always_inline int on_return(struct pt_regs *ctx)
{
	__u64 pid_tgid;
	struct gp_cookie cookie = read_cookie(ctx);
	if (cookie.shape == GP_SHAPE_CTX_CURRENT)
		return 0; /* nothing pending: the entry did all there is */
	if (!current_ids(&pid_tgid))
		return 0;
	struct pending_calls *calls = bpf_task_storage_get(&pending, bpf_get_current_task_btf(), NULL, 0);
	__u32 slot = PENDING_SLOTS;

	if (calls) {
		for (__u32 i = 0; i < PENDING_SLOTS; i++) {
			if (calls->api_plus_one[i] == cookie.api + 1u) {
				slot = i;
				break;
			}
		}
	}
	if (!calls || slot >= PENDING_SLOTS) {
		if (is_tracked(pid_tgid >> 32))
			count(GP_COUNTER_RETURN_UNMATCHED);
		return 0;
	}
	struct pending_call *call = &calls->call[slot];
	struct driver_record *out = &calls->out;
	struct gp_record *rec = &out->rec;
	__s32 result = (__s32)PT_REGS_RC(ctx);
	bool ok = result == 0;
	__u64 now = bpf_ktime_get_ns();

	__builtin_memset(rec, 0, sizeof(*rec));
	rec->kind = GP_RECORD_DRIVER;
	rec->ts_ns = call->ts_ns;
	rec->duration_ns = now - call->ts_ns;
	rec->pid = pid_tgid >> 32;
	rec->tid = (__u32)pid_tgid;
	rec->api = cookie.api;
	rec->result = result;
	rec->device = call->device;
	rec->caller = call->caller;
	bpf_get_current_comm(rec->comm, sizeof(rec->comm));

	/* The frames follow the handle when there is one, the header otherwise. */
	struct gp_frame *frames;
	__u64 size = sizeof(struct gp_record);
	if (carries_handle(cookie.shape)) {
		fill_with_handle(out, cookie, call, ok);
		rec->flags |= GP_FLAG_HANDLE;
		size += GP_HANDLE_LEN;
		frames = (struct gp_frame *)(out->handle + GP_HANDLE_LEN);
	} else {
		fill_plain(rec, cookie, call->args, ok);
		frames = (struct gp_frame *)out->handle;
	}
	calls->api_plus_one[slot] = 0;
	if (ok && rec->addr && (cookie.shape == GP_SHAPE_CTX_RETAIN || cookie.shape == GP_SHAPE_CTX_CREATE)) {
		__s32 device = rec->device;

		bpf_map_update_elem(&ctx_device, &rec->addr, &device, BPF_ANY);
		if (cookie.shape == GP_SHAPE_CTX_CREATE) /* a created context is made current */
			calls->current_ctx = rec->addr;
	}
	if (rec->device < 0 && calls->current_ctx) {
		__s32 *device = bpf_map_lookup_elem(&ctx_device, &calls->current_ctx);

		if (device)
			rec->device = *device;
	}

	if (call->by_allocator)
		rec->flags |= GP_FLAG_ALLOCATOR_SEGMENT;

	__u64 stamp = 0;
	__u32 depth = walk_python_stack(rec->pid, rec->tid, frames, &calls->stack, &rec->flags, &stamp);
	if (depth == 0 && evaluating_node(rec->pid, &calls->autograd)) {
		/* A backward pass on one of autograd's threads: the line that runs it. */
		depth = walk_main_thread(rec->pid, rec->tid, frames, &calls->stack, &rec->flags, &stamp);
		if (depth)
			rec->stack_of = GP_STACK_BACKWARD_CALLER;
	}
	describe_new_codes(rec->pid, rec->tid, frames, &calls->stack);
	rec->stack_depth = depth;
	size += (__u64)(depth & (GP_MAX_FRAMES - 1 + GP_MAX_FRAMES)) * sizeof(struct gp_frame);
	if (size > sizeof(*out))
		size = sizeof(*out);
	if (bpf_ringbuf_output(&events, out, size, wakeup_flags(now)))
		count(GP_COUNTER_RINGBUF_FULL);
	return 0;
}

/*
 * The same programs twice: a uprobe-multi link puts every probe of a library in one kernel object
 * (attached and, above all, detached in one step: a single uprobe costs a grace period to remove);
 * kernels before 6.6 lack it and get one perf-event link per probe. The agent loads one pair.
 */
SEC("uprobe.multi")
int driver_entry_multi(struct pt_regs *ctx)
{
	return on_entry(ctx);
}

SEC("uretprobe.multi")
int driver_return_multi(struct pt_regs *ctx)
{
	return on_return(ctx);
}

SEC("uprobe")
int driver_entry(struct pt_regs *ctx)
{
	return on_entry(ctx);
}

SEC("uretprobe")
int driver_return(struct pt_regs *ctx)
{
	return on_return(ctx);
}

/*
 * PyTorch's caching allocator's segment functions (libc10_cuda.so's local symbols
 * DeviceCachingAllocator::alloc_block and ExpandableSegment::map: model::framework): the thread
 * notes where the outermost one's return address lies, so the driver calls it makes until it
 * returns are marked as the allocator's (its cache, not the program's own memory). An entry
 * probe only, on a call that is rare: a new segment.
 */
static __always_inline int on_segment_function(struct pt_regs *ctx)
{
	__u64 pid_tgid;

	if (!current_ids(&pid_tgid) || !record_call_of(pid_tgid >> 32))
		return 0;
	struct pending_calls *calls =
		bpf_task_storage_get(&pending, bpf_get_current_task_btf(), NULL, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!calls) {
		count(GP_COUNTER_PENDING_FULL);
		return 0;
	}
	__u64 sp = PT_REGS_SP(ctx);
	if (in_segment_function(calls, sp))
		return 0; /* nested in one already noted: the outer one covers it */
	if (bpf_probe_read_user(&calls->segment_return, sizeof(calls->segment_return), (void *)sp)) {
		count(GP_COUNTER_READ_FAILED);
		return 0;
	}
	calls->segment_frame = sp;
	return 0;
}

SEC("uprobe.multi")
int segment_entry_multi(struct pt_regs *ctx)
{
	return on_segment_function(ctx);
}

SEC("uprobe")
int segment_entry(struct pt_regs *ctx)
{
	return on_segment_function(ctx);
}
