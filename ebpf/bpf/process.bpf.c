// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Process lifecycle of tracked processes: a fork of a tracked process tracks the child (so `run`
 * and `attach` follow multiprocessing and DataLoader workers), exec and exit are recorded so user
 * space can reset its caches and close each process's allocation table.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u8 one = 1;

	/* A new thread is not a new process. */
	if (child->pid != child->tgid)
		return 0;
	__u32 parent_tgid = id_of(parent, true);
	if (!parent_tgid || !is_tracked(parent_tgid))
		return 0;
	__u32 child_tgid = id_of(child, true);
	if (!child_tgid)
		return 0;
	bpf_map_update_elem(&tracked, &child_tgid, &one, BPF_ANY);
	/* A forked child runs the parent's interpreter at the same addresses. */
	struct gp_python *python = bpf_map_lookup_elem(&python_procs, &parent_tgid);
	if (python)
		bpf_map_update_elem(&python_procs, &child_tgid, python, BPF_ANY);
	/* ... and the same libtorch: a fork keeps the dynamic linker's module ids. */
	struct gp_autograd *torch = bpf_map_lookup_elem(&torch_procs, &parent_tgid);
	if (torch)
		bpf_map_update_elem(&torch_procs, &child_tgid, torch, BPF_ANY);

	struct gp_record *rec = reserve_record(GP_RECORD_FORK, sizeof(struct gp_record));
	if (!rec)
		return 0;
	rec->ts_ns = bpf_ktime_get_ns();
	rec->pid = child_tgid;
	rec->tid = child_tgid;
	rec->ppid = parent_tgid;
	bpf_probe_read_kernel_str(rec->comm, sizeof(rec->comm), child->comm);
	submit_process_record(rec);
	return 0;
}

/* Time, ids and parent of a record about `task`. */
static __always_inline void fill_task(struct gp_record *rec, struct task_struct *task)
{
	rec->ts_ns = bpf_ktime_get_ns();
	rec->pid = id_of(task, true);
	rec->tid = id_of(task, false);
	rec->ppid = id_of(BPF_CORE_READ(task, real_parent), true);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = id_of(task, true);

	if (!tgid || !is_tracked(tgid))
		return 0;
	/* A new program: whatever interpreter and libraries the old one ran are gone. */
	bpf_map_delete_elem(&python_procs, &tgid);
	bpf_map_delete_elem(&torch_procs, &tgid);
	struct gp_exec_record *exec =
		(struct gp_exec_record *)reserve_record(GP_RECORD_EXEC, sizeof(struct gp_exec_record));
	if (!exec)
		return 0;
	struct gp_record *rec = &exec->rec;
	fill_task(rec, task);
	bpf_probe_read_kernel_str(rec->comm, sizeof(rec->comm), task->comm);
	bpf_probe_read_kernel_str(exec->filename, sizeof(exec->filename), BPF_CORE_READ(bprm, filename));
	submit_process_record(rec);
	return 0;
}

/* Older kernels pass only the task; newer ones add group_dead. Reading the task alone fits both. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	__u32 tgid = id_of(task, true);

	if (!tgid || !is_tracked(tgid))
		return 0;
	/* signal->live is decremented before this tracepoint: zero means the last thread is leaving. */
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	bpf_map_delete_elem(&tracked, &tgid);
	bpf_map_delete_elem(&python_procs, &tgid);
	bpf_map_delete_elem(&torch_procs, &tgid);

	struct gp_record *rec = reserve_record(GP_RECORD_EXIT, sizeof(struct gp_record));
	if (!rec)
		return 0;
	fill_task(rec, task);
	/* wait(2)-style status: exit status in bits 8..15, or the killing signal in bits 0..6. */
	rec->result = task->exit_code;
	if (task->exit_code & 0x7f)
		rec->flags |= GP_FLAG_EXIT_SIGNALED;
	/* The last thread out may be a helper (CUDA's event thread): name the process by its leader. */
	bpf_probe_read_kernel_str(rec->comm, sizeof(rec->comm), BPF_CORE_READ(task, group_leader, comm));
	submit_process_record(rec);
	return 0;
}
