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

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * glibc x86-64: the thread pointer (fs base) points at the TCB, whose second word is the DTV
 * pointer; dtv[-1] holds the DTV's length and each entry is 16 bytes, its first word the module's
 * TLS block (TLS_DTV_UNALLOCATED, -1, until the thread first touches that module's thread-locals).
 */
#define GP_TCB_DTV 8
#define GP_DTV_ENTRY 16
#define GP_DTV_UNALLOCATED ((__u64)-1)

/*
 * PyTorch's autograd state of the calling thread, read from libtorch_cpu's thread-locals: the node
 * being evaluated (backward pass) or the thread's sequence counter (forward pass). A few reads of
 * memory the thread has just touched, no extra probe.
 */
static __always_inline void read_autograd(__u32 tgid, struct gp_record *rec, struct gp_allocator *out)
{
	struct gp_autograd *torch = bpf_map_lookup_elem(&torch_procs, &tgid);
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 dtv, length, block, node;

	if (!torch)
		return;
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(task->thread.fsbase + GP_TCB_DTV)) ||
	    bpf_probe_read_user(&length, sizeof(length), (void *)(dtv - GP_DTV_ENTRY)) || torch->module > length ||
	    bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + torch->module * GP_DTV_ENTRY)) || block == 0 ||
	    block == GP_DTV_UNALLOCATED)
		return;
	if (bpf_probe_read_user(&node, sizeof(node), (void *)(block + torch->current_node)))
		return;
	if (node) {
		if (bpf_probe_read_user(&out->autograd_node, sizeof(out->autograd_node), (void *)node) ||
		    bpf_probe_read_user(&out->autograd_seq, sizeof(out->autograd_seq),
					(void *)(node + torch->node_sequence_nr)) ||
		    bpf_probe_read_user(&out->autograd_thread, sizeof(out->autograd_thread),
					(void *)(node + torch->node_thread_id)))
			return;
	} else if (bpf_probe_read_user(&out->autograd_seq, sizeof(out->autograd_seq),
				       (void *)(block + torch->sequence_nr)) ||
		   bpf_probe_read_user(&out->autograd_thread, sizeof(out->autograd_thread),
				       (void *)(block + torch->thread_id))) {
		return;
	}
	rec->flags |= GP_FLAG_AUTOGRAD;
}

struct allocator_record {
	struct gp_record rec;
	struct gp_allocator totals;
	struct gp_frame frames[GP_MAX_FRAMES];
};

/* A thread's room to build its records and walk its stack. */
struct allocator_thread {
	struct allocator_record out;
	struct stack_scratch stack;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct allocator_thread);
} allocator_threads SEC(".maps");

static __always_inline int on_report(struct pt_regs *ctx)
{
	__u64 pid_tgid;

	if (!current_ids(&pid_tgid) || !record_call_of(pid_tgid >> 32))
		return 0;
	__u64 device = PT_REGS_PARM5(ctx);
	if ((__u8)device != GP_C10_DEVICE_CUDA) {
		count(GP_COUNTER_ALLOCATOR_OTHER_DEVICE);
		return 0;
	}
	struct allocator_thread *thread = bpf_task_storage_get(&allocator_threads, bpf_get_current_task_btf(), NULL,
							       BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!thread) {
		count(GP_COUNTER_PENDING_FULL);
		return 0;
	}
	struct gp_record *rec = &thread->out.rec;
	__s64 size = (__s64)PT_REGS_PARM2(ctx);
	__u64 now = bpf_ktime_get_ns();

	__builtin_memset(rec, 0, sizeof(*rec));
	rec->kind = GP_RECORD_ALLOCATOR;
	rec->ts_ns = now;
	rec->pid = pid_tgid >> 32;
	rec->tid = (__u32)pid_tgid;
	rec->device = (__s8)(device >> 8);
	rec->addr = PT_REGS_PARM1(ctx);
	rec->size = size < 0 ? -size : size;
	rec->aux = (__u64)size;
	thread->out.totals.allocated = PT_REGS_PARM3(ctx);
	thread->out.totals.reserved = PT_REGS_PARM4(ctx);
	thread->out.totals.autograd_node = 0;
	thread->out.totals.autograd_seq = 0;
	thread->out.totals.autograd_thread = 0;
	read_autograd(rec->pid, rec, &thread->out.totals);
	bpf_get_current_comm(rec->comm, sizeof(rec->comm));

	__u32 depth = walk_python_stack(rec->pid, rec->tid, thread->out.frames, &thread->stack, &rec->flags);
	rec->stack_depth = depth;
	__u64 out_size = sizeof(struct gp_record) + sizeof(struct gp_allocator) +
			 (__u64)(depth & (GP_MAX_FRAMES - 1 + GP_MAX_FRAMES)) * sizeof(struct gp_frame);
	if (out_size > sizeof(thread->out))
		out_size = sizeof(thread->out);
	if (bpf_ringbuf_output(&events, &thread->out, out_size, wakeup_flags(now)))
		count(GP_COUNTER_RINGBUF_FULL);
	return 0;
}

/* As in driver.bpf.c: a uprobe-multi link on 6.6+, a perf-event link before. */
SEC("uprobe.multi")
int allocator_report_multi(struct pt_regs *ctx)
{
	return on_report(ctx);
}

SEC("uprobe")
int allocator_report(struct pt_regs *ctx)
{
	return on_report(ctx);
}
