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
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	if (!record_call_of(pid_tgid >> 32))
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
