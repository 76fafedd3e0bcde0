// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Allocator-level capture: PyTorch's caching allocators report every block allocation (size > 0)
 * and free (size < 0) through the exported c10::reportMemoryUsageToProfiler(void *ptr,
 * int64_t size, size_t total_allocated, size_t total_reserved, c10::Device device) of libc10.so.
 * One entry probe there gives tensor-level events, the allocator's own totals and the Python
 * stack, for a running process with no code change. c10::Device is two bytes (type, index)
 * passed in one register.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"
#include "pystack.bpf.h"
#include "autograd.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define GP_TLS_SPAN GP_AUTOGRAD_TLS_SPAN
#define GP_NODE_SPAN GP_AUTOGRAD_NODE_SPAN

struct allocator_record {
	struct gp_record rec;
	struct gp_allocator totals;
	struct gp_frame frames[GP_MAX_FRAMES];
};

/* Stacks a thread remembers having sent whole (direct-mapped: a collision only sends one again). */
#define GP_SENT_SLOTS 128

/* A thread's room to build its records, walk its stack and copy its autograd state. */
struct allocator_thread {
	/* Stacks this thread sent whole, each as its hash mixed with the program generation and the
	 * stack epoch it was sent in: a record of a stack sent before leaves its frames out. */
	__u64 sent[GP_SENT_SLOTS];
	/* Name the spans' and phases' enums for the skeleton generator (user space reads them). */
	enum gp_autograd_span spans;
	enum gp_phase phase_names;
	struct allocator_record out;
	struct autograd_block autograd;
	__u8 tls[GP_TLS_SPAN];
	__u8 node[GP_NODE_SPAN];
	struct stack_scratch stack;
};

/* A u64 at `offset` of a copy `span` bytes long (the verifier needs the bound spelled out). */
static __always_inline __u64 field_of(const __u8 *copy, __u32 offset, __u32 span)
{
	if (offset > span - sizeof(__u64))
		return 0;
	return *(const __u64 *)(copy + (offset & (span - 8)));
}

/* A u64 of user memory (0 when it cannot be read). */
static __always_inline __u64 user_u64(__u64 address)
{
	__u64 value = 0;

	if (bpf_probe_read_user(&value, sizeof(value), (void *)address))
		return 0;
	return value;
}

/*
 * PyTorch's autograd state of the calling thread, read from libtorch_cpu's thread-locals: the node
 * being evaluated (backward pass) or the thread's sequence counter (forward pass). Where the three
 * thread-locals lie within GP_TLS_SPAN of each other they come in one read, else one read each (a
 * build may place them kilobytes apart); a node's fields come in one read: a read costs far more
 * than the bytes it copies.
 */
static __always_inline void read_autograd(__u32 tgid, struct gp_record *rec, struct allocator_thread *thread)
{
	struct gp_autograd *torch = bpf_map_lookup_elem(&torch_procs, &tgid);
	struct gp_allocator *out = &thread->out.totals;

	if (!torch)
		return;
	__u64 block = torch_block(torch, &thread->autograd);
	if (!block)
		return;
	__u32 low = torch->current_node, high = torch->current_node;
	if (torch->sequence_nr < low)
		low = torch->sequence_nr;
	if (torch->thread_id < low)
		low = torch->thread_id;
	if (torch->sequence_nr > high)
		high = torch->sequence_nr;
	if (torch->thread_id > high)
		high = torch->thread_id;
	__u32 span = high - low + sizeof(__u64);
	bool close = span < GP_TLS_SPAN;
	__u64 node;

	if (close) {
		/* The mask only tells the verifier what the comparison already did. */
		if (bpf_probe_read_user(thread->tls, span & (GP_TLS_SPAN - 1), (void *)(block + low)))
			return;
		node = field_of(thread->tls, torch->current_node - low, GP_TLS_SPAN);
	} else if (bpf_probe_read_user(&node, sizeof(node), (void *)(block + torch->current_node))) {
		return;
	}
	if (node) {
		__u32 node_span = torch->node_sequence_nr > torch->node_thread_id ? torch->node_sequence_nr
										  : torch->node_thread_id;
		node_span += sizeof(__u64);
		if (node_span >= GP_NODE_SPAN ||
		    bpf_probe_read_user(thread->node, node_span & (GP_NODE_SPAN - 1), (void *)node))
			return;
		out->autograd_node = field_of(thread->node, 0, GP_NODE_SPAN);
		out->autograd_seq = field_of(thread->node, torch->node_sequence_nr, GP_NODE_SPAN);
		out->autograd_thread = field_of(thread->node, torch->node_thread_id, GP_NODE_SPAN);
	} else if (close) {
		out->autograd_seq = field_of(thread->tls, torch->sequence_nr - low, GP_TLS_SPAN);
		out->autograd_thread = field_of(thread->tls, torch->thread_id - low, GP_TLS_SPAN);
	} else {
		out->autograd_seq = user_u64(block + torch->sequence_nr);
		if (!thread->autograd.thread_id)
			thread->autograd.thread_id = user_u64(block + torch->thread_id);
		out->autograd_thread = thread->autograd.thread_id;
	}
	rec->flags |= GP_FLAG_AUTOGRAD;
}

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct allocator_thread);
} allocator_threads SEC(".maps");

/*
 * One record of the allocator: a block handed out or taken back (GP_RECORD_ALLOCATOR: `ptr`, the
 * signed `size`), or a request it gave up on (GP_RECORD_ALLOCATOR_OOM: no block, `size` the
 * request), with its totals after it, the Python stack and autograd's state of the calling thread.
 */
static __always_inline int on_report(struct pt_regs *ctx, __u32 kind, __u64 ptr, __s64 size, __u64 allocated,
				     __u64 reserved, __u64 device)
{
	__u64 pid_tgid;

	if (!current_ids(&pid_tgid) || !record_call_of(pid_tgid >> 32))
		return 0;
	if ((__u8)device != GP_C10_DEVICE_CUDA) {
		count(GP_COUNTER_ALLOCATOR_OTHER_DEVICE);
		return 0;
	}
	__u64 stamp = profile_phases ? bpf_ktime_get_ns() : 0;
	struct allocator_thread *thread = bpf_task_storage_get(&allocator_threads, bpf_get_current_task_btf(), NULL,
							       BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!thread) {
		count(GP_COUNTER_PENDING_FULL);
		return 0;
	}
	struct gp_record *rec = &thread->out.rec;
	__u64 now = bpf_ktime_get_ns();

	__builtin_memset(rec, 0, sizeof(*rec));
	rec->kind = kind;
	rec->ts_ns = now;
	rec->pid = pid_tgid >> 32;
	rec->tid = (__u32)pid_tgid;
	rec->device = (__s8)(device >> 8);
	rec->addr = ptr;
	rec->size = size < 0 ? -size : size;
	rec->aux = (__u64)size;
	thread->out.totals.allocated = allocated;
	thread->out.totals.reserved = reserved;
	thread->out.totals.autograd_node = 0;
	thread->out.totals.autograd_seq = 0;
	thread->out.totals.autograd_thread = 0;
	thread->out.totals.stack_hash = 0;
	bpf_get_current_comm(rec->comm, sizeof(rec->comm));
	phase_done(GP_PHASE_ENTRY, &stamp);
	read_autograd(rec->pid, rec, thread);
	phase_done(GP_PHASE_AUTOGRAD, &stamp);

	__u32 depth = walk_python_stack(rec->pid, rec->tid, thread->out.frames, &thread->stack, &rec->flags, &stamp);
	rec->stack_depth = depth;
	/* A stack this thread sent whole before goes by its hash alone: most of a record's bytes, and
	 * of the time it takes to copy them into the ring buffer. */
	__u64 hash = depth ? thread->stack.hash | 1 : 0;
	__u64 tag = hash ^ (thread->stack.stack_tag * GP_HASH_MULTIPLIER);
	__u64 *sent = &thread->sent[(hash >> 7) & (GP_SENT_SLOTS - 1)];
	thread->out.totals.stack_hash = hash;
	if (hash && *sent == tag) {
		rec->flags |= GP_FLAG_STACK_KNOWN;
		rec->stack_depth = 0;
		depth = 0;
	} else {
		describe_new_codes(rec->pid, rec->tid, thread->out.frames, &thread->stack);
	}
	__u64 out_size = sizeof(struct gp_record) + sizeof(struct gp_allocator) +
			 (__u64)(depth & (GP_MAX_FRAMES - 1 + GP_MAX_FRAMES)) * sizeof(struct gp_frame);
	if (out_size > sizeof(thread->out))
		out_size = sizeof(thread->out);
	if (bpf_ringbuf_output(&events, &thread->out, out_size, wakeup_flags(now)))
		count(GP_COUNTER_RINGBUF_FULL);
	else if (hash)
		/* Only once the frames are on their way can later records leave them out. */
		*sent = tag;
	phase_done(GP_PHASE_OUTPUT, &stamp);
	if (profile_phases) {
		__u32 reports = GP_PHASE_REPORTS;
		__u64 *count = bpf_map_lookup_elem(&phases, &reports);

		if (count)
			*count += 1;
	}
	return 0;
}

/* c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, size_t total_allocated,
 * size_t total_reserved, c10::Device device). */
static __always_inline int on_usage_report(struct pt_regs *ctx)
{
	return on_report(ctx, GP_RECORD_ALLOCATOR, PT_REGS_PARM1(ctx), (__s64)PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx),
			 PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx));
}

/* c10::reportOutOfMemoryToProfiler(int64_t alloc_size, size_t total_allocated, size_t
 * total_reserved, c10::Device device): PyTorch's caching allocator gave up on a request (its cache
 * emptied and the driver asked again) and is about to raise OutOfMemoryError. Probed at every
 * level (it runs once per failure): the allocator's own totals at the failure, which the driver's
 * calls do not tell. */
static __always_inline int on_oom_report(struct pt_regs *ctx)
{
	return on_report(ctx, GP_RECORD_ALLOCATOR_OOM, 0, (__s64)PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
			 PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx));
}

/* As in driver.bpf.c: a uprobe-multi link on 6.6+, a perf-event link before. */
SEC("uprobe.multi")
int allocator_report_multi(struct pt_regs *ctx)
{
	return on_usage_report(ctx);
}

SEC("uprobe")
int allocator_report(struct pt_regs *ctx)
{
	return on_usage_report(ctx);
}

SEC("uprobe.multi")
int allocator_oom_multi(struct pt_regs *ctx)
{
	return on_oom_report(ctx);
}

SEC("uprobe")
int allocator_oom(struct pt_regs *ctx)
{
	return on_oom_report(ctx);
}

/*
 * The trap alone: an empty program on the same symbol, attached instead of the one above to
 * measure the floor every uprobe on it pays (bench/overhead.py, `--empty-probes`).
 */
SEC("uprobe.multi")
int allocator_empty_multi(struct pt_regs *ctx)
{
	return 0;
}

SEC("uprobe")
int allocator_empty(struct pt_regs *ctx)
{
	return 0;
}
