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

/* enum gp_counter → count, per CPU: nothing is dropped without being counted here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GP_COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Set by the agent before load: record every process, not only tracked ones (node daemon). */
const volatile bool track_all = false;

static __always_inline bool is_tracked(__u32 tgid)
{
	return track_all || bpf_map_lookup_elem(&tracked, &tgid) != NULL;
}

static __always_inline void count(__u32 counter)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &counter);

	if (value)
		*value += 1;
}

/* A zeroed record on the ring buffer, or NULL (counted) when it is full. */
static __always_inline struct gp_record *reserve_record(__u32 kind)
{
	struct gp_record *rec = bpf_ringbuf_reserve(&events, sizeof(*rec), 0);

	if (!rec) {
		count(GP_COUNTER_RINGBUF_FULL);
		return NULL;
	}
	__builtin_memset(rec, 0, sizeof(*rec));
	rec->kind = kind;
	rec->device = -1;
	return rec;
}

#endif
