/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PyTorch's autograd state of the calling thread, in libtorch_cpu's thread-locals: where the
 * thread's TLS block of libtorch_cpu is (found once through its DTV), and the node its autograd
 * engine is evaluating (the backward pass). The allocator probe reads more of it (allocator.bpf.c);
 * the driver probes only ask whether a node is being evaluated.
 */
#ifndef GPUPROF_AUTOGRAD_BPF_H
#define GPUPROF_AUTOGRAD_BPF_H

#include "maps.bpf.h"

/*
 * glibc x86-64: the thread pointer (fs base) points at the TCB, whose second word is the DTV
 * pointer; dtv[-1] holds the DTV's length and each entry is 16 bytes, its first word the module's
 * TLS block (TLS_DTV_UNALLOCATED, -1, until the thread first touches that module's thread-locals).
 */
#define GP_TCB_DTV 8
#define GP_DTV_ENTRY 16
#define GP_DTV_UNALLOCATED ((__u64)-1)

/* Where a thread's libtorch_cpu thread-locals are, found once in the address space `mm`, and the
 * thread's RecordFunction id once it has one (set once per thread, never changed). */
struct autograd_block {
	__u64 mm;
	__u64 module;
	__u64 block;
	__u64 thread_id;
};

/* The thread's TLS block of libtorch_cpu (0 when it has none yet): from the thread's DTV the
 * first time (fs base → TCB → DTV entry of the module id), then from `cached`. */
static __always_inline __u64 torch_block(const struct gp_autograd *torch, struct autograd_block *cached)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 mm = (__u64)task->mm, dtv, length, block;

	if (cached->block && cached->mm == mm && cached->module == torch->module)
		return cached->block;
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(task->thread.fsbase + GP_TCB_DTV)) ||
	    bpf_probe_read_user(&length, sizeof(length), (void *)(dtv - GP_DTV_ENTRY)) || torch->module > length ||
	    bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + torch->module * GP_DTV_ENTRY)) || block == 0 ||
	    block == GP_DTV_UNALLOCATED)
		return 0;
	cached->mm = mm;
	cached->module = torch->module;
	cached->block = block;
	cached->thread_id = 0;
	return block;
}

/* True when the calling thread's autograd engine is evaluating a node: a backward pass runs on
 * it. False for a process whose PyTorch user space did not describe (torch_procs). */
static __always_inline bool evaluating_node(__u32 tgid, struct autograd_block *cached)
{
	struct gp_autograd *torch = bpf_map_lookup_elem(&torch_procs, &tgid);
	__u64 node = 0;

	if (!torch)
		return false;
	__u64 block = torch_block(torch, cached);
	if (!block || bpf_probe_read_user(&node, sizeof(node), (void *)(block + torch->current_node)))
		return false;
	return node != 0;
}

#endif
