/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Maps and helpers every gpuprof BPF object shares. Each object declares them; the agent creates
 * them once (with the driver object) and hands the same maps to the others before load, so one
 * ring buffer carries every record in the order it happened.
 */
#ifndef GPUPROF_MAPS_BPF_H
#define GPUPROF_MAPS_BPF_H

#include "gpuprof.h"

/* Records for user space. The agent sizes it before load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

/* Processes (tgid) whose calls are recorded: the target(s), then every descendant via fork. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u8);
} tracked SEC(".maps");

/* tgid → where its CPython keeps its threads and frames (set by user space, copied on fork). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct gp_python);
} python_procs SEC(".maps");

/* tgid → where its PyTorch keeps autograd's thread-locals (set by user space, copied on fork). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct gp_autograd);
} torch_procs SEC(".maps");

/* enum gp_counter → count, per CPU: nothing is dropped without being counted here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GP_COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* enum gp_phase → ns (or a count), per CPU: where the allocator probe's time goes, when profiled. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GP_PHASE_MAX);
	__type(key, __u32);
	__type(value, __u64);
} phases SEC(".maps");

/* Set by the agent before load: stamp the allocator probe's phases into `phases` (benchmarks). */
const volatile bool profile_phases = false;

/* Adds the time since `*since` to `phase` and moves `*since` on; nothing unless profiling. */
static __always_inline void phase_done(__u32 phase, __u64 *since)
{
	if (!profile_phases)
		return;
	__u64 now = bpf_ktime_get_ns();
	__u64 *sum = bpf_map_lookup_elem(&phases, &phase);

	if (sum)
		*sum += now - *since;
	*since = now;
}

/* Set by the agent before load (node daemon): a process that calls a probed function is tracked
 * from that call on, so nothing it does is missed while user space is still discovering it. Its
 * forks and exit then follow through the tracked map like any other. */
const volatile bool track_callers = false;

/* Set by the agent before load: wake the reader only once this many bytes wait in the ring
 * buffer (it also drains on a short timer). A wakeup per record would cost more than the record. */
const volatile __u64 wakeup_bytes = 1 << 20;

/* Set by the agent before load when it profiles one pid namespace (a pod's sidecar sharing the
 * pod's process namespace): every id a record carries is that namespace's, as the agent's own
 * /proc shows it, and a task outside the namespace is not seen at all. Zero: the host's ids (the
 * node daemon, run, attach). */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* The current task's tgid << 32 | pid, in the profiled namespace; false for a task outside it. */
static __always_inline bool current_ids(__u64 *pid_tgid)
{
	if (!pidns_ino) {
		*pid_tgid = bpf_get_current_pid_tgid();
		return true;
	}
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)) != 0)
		return false;
	*pid_tgid = ((__u64)ns.tgid << 32) | ns.pid;
	return true;
}

/* A task's id (`leader`: its thread group's) in the profiled namespace: from its struct pid,
 * which holds its number in each namespace it is in, the innermost at its level. Zero for a task
 * outside the namespace. */
static __always_inline __u32 id_of(struct task_struct *task, bool leader)
{
	if (!pidns_ino)
		return leader ? BPF_CORE_READ(task, tgid) : BPF_CORE_READ(task, pid);
	struct task_struct *owner = leader ? BPF_CORE_READ(task, group_leader) : task;
	struct pid *pid = BPF_CORE_READ(owner, thread_pid);
	unsigned int level = BPF_CORE_READ(pid, level);
	struct upid upid = {};

	if (level > 31)
		return 0;
	if (bpf_probe_read_kernel(&upid, sizeof(upid), &pid->numbers[level]) != 0)
		return 0;
	if (BPF_CORE_READ(upid.ns, ns.inum) != pidns_ino)
		return 0;
	return upid.nr;
}

static __always_inline bool is_tracked(__u32 tgid)
{
	return bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

static __always_inline void count(__u32 counter)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &counter);

	if (value)
		*value += 1;
}

/* Whether a probed call of this process is recorded: tracked ones always; under track_callers
 * the caller becomes tracked here (a full map is counted, and the call is still recorded). */
static __always_inline bool record_call_of(__u32 tgid)
{
	__u8 one = 1;

	if (is_tracked(tgid))
		return true;
	if (!track_callers)
		return false;
	if (bpf_map_update_elem(&tracked, &tgid, &one, BPF_NOEXIST) != 0 && !is_tracked(tgid))
		count(GP_COUNTER_TRACKED_FULL);
	return true;
}

/* Set by the agent before load: how often the reader is woken at the least, so records reach it
 * within this delay even at low rates (symbolizing a short-lived process needs it alive). */
const volatile __u64 wakeup_interval_ns = 10 * 1000 * 1000;

/* When the reader was last woken (any CPU). */
__u64 last_wakeup_ns = 0;

/* A reader that is behind gets no more than one wakeup per this long: it is awake anyway, and
 * a wakeup costs the traced thread more than its record. */
#define GP_WAKEUP_MIN_GAP_NS (1000 * 1000)

/* Wake the reader once a batch has built up or the interval has passed. */
static __always_inline __u64 wakeup_flags(__u64 now)
{
	__u64 since = now - last_wakeup_ns;

	if (since >= wakeup_interval_ns ||
	    (since >= GP_WAKEUP_MIN_GAP_NS && bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)) {
		last_wakeup_ns = now;
		return BPF_RB_FORCE_WAKEUP;
	}
	return BPF_RB_NO_WAKEUP;
}

/* A header-only record on the ring buffer (or, with `size`, one with a fixed tail), fields
 * zeroed; NULL (counted) when the buffer is full. */
static __always_inline struct gp_record *reserve_record(__u32 kind, __u64 size)
{
	struct gp_record *rec = bpf_ringbuf_reserve(&events, size, 0);

	if (!rec) {
		count(GP_COUNTER_RINGBUF_FULL);
		return NULL;
	}
	__builtin_memset(rec, 0, sizeof(*rec));
	rec->kind = kind;
	rec->device = -1;
	return rec;
}

/* Process records are rare and user space acts on them at once (new interpreters to find). */
static __always_inline void submit_process_record(struct gp_record *rec)
{
	last_wakeup_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);
}

#endif
