/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Python stack of the current thread, read from its CPython frame chain: (code object,
 * instruction) pairs, innermost first, for user space to symbolize. The thread's PyThreadState is
 * the one whose thread_id (pthread_t) equals the thread pointer; it is found once by walking the
 * interpreter's thread list and cached in the thread's own storage (with the address space it was
 * found in: a new program is another interpreter). A thread without one has no Python frames: an
 * empty stack, never somebody else's.
 */
#ifndef GPUPROF_PYSTACK_BPF_H
#define GPUPROF_PYSTACK_BPF_H

#include "maps.bpf.h"

#define GP_MAX_THREADS 64
/* Frames looked at, C-stack shims included, to return up to GP_MAX_FRAMES Python frames. */
#define GP_MAX_WALK 96
/* Code objects a thread remembers having described to user space (direct-mapped). */
#define GP_SEEN_SLOTS 256
/* The top of a thread's data stack read at once (3.11+): the frames in it need no read each,
 * and a read costs more than copying a few KiB. */
#define GP_STACK_BUF 16384
/* The multiply of the stack hash's multiply-rotate (an odd constant with bits spread). */
#define GP_HASH_MULTIPLIER 0x517cc1b727220a95ull

/* A code record being put together. */
struct code_record {
	struct gp_record rec;
	struct gp_code code;
	__u8 data[GP_CODE_NAME_CAP + GP_CODE_FILE_CAP + GP_CODE_TABLE_CAP];
};

/*
 * Per-thread state of the walk, kept in the thread's task storage: which code objects it has
 * already described (so each is sent once, while the process is alive to be read, not when user
 * space gets to it — a short-lived worker may be gone by then), and room to build a code record.
 */
struct stack_scratch {
	/* code object | generation << 48: user addresses have 47 bits, and a new program (new
	 * generation) must describe its code objects again. */
	__u64 seen[GP_SEEN_SLOTS];
	/* The thread's PyThreadState, found in the address space `thread_state_mm` (checked at each use:
	 * a hash map lookup per event cost more than the check). */
	__u64 thread_state;
	__u64 thread_state_mm;
	/* One frame's fields, read at once (frames outside the data stack copy). */
	__u8 frame[GP_FRAME_READ_MAX];
	/* The thread state's fields, read at once. */
	__u8 tstate[GP_TSTATE_READ_MAX];
	__u32 depth;
	__u32 reserved;
	/* The process's program generation and stack epoch, as the walk read them: a stack sent
	 * under others must be sent again. */
	__u64 stack_tag;
	/* A hash of the walk's (code object, instruction) pairs. */
	__u64 hash;
	/* The top of the thread's data stack. */
	__u8 stack[GP_STACK_BUF];
	struct code_record code_out;
};

/* Set by the agent before load: walk Python stacks at all (off only to measure their cost). */
const volatile bool python_stacks = true;

static __always_inline int read_ptr(__u64 *dst, __u64 addr)
{
	*dst = 0;
	return bpf_probe_read_user(dst, sizeof(*dst), (void *)addr);
}

struct thread_scan {
	const struct gp_python *py;
	__u64 thread_pointer;
	__u64 tstate; /* the candidate, then the match */
	bool found;
};

static long scan_thread(__u64 index, void *ctx)
{
	struct thread_scan *scan = ctx;
	__u64 id = 0;

	if (!scan->tstate || read_ptr(&id, scan->tstate + scan->py->tstate_thread_id))
		return 1;
	if (id == scan->thread_pointer) {
		scan->found = true;
		return 1;
	}
	return read_ptr(&scan->tstate, scan->tstate + scan->py->tstate_next) ? 1 : 0;
}

/* A field of the thread state copy in scratch->tstate. */
static __always_inline __u64 tstate_field(const struct stack_scratch *scratch, const struct gp_python *py, __u16 offset)
{
	__u16 at = offset - py->tstate_read_start;

	if (offset < py->tstate_read_start || at > GP_TSTATE_READ_MAX - sizeof(__u64))
		return 0;
	return *(const __u64 *)(scratch->tstate + (at & (GP_TSTATE_READ_MAX - 8)));
}

/* Copies the fields the walk needs of a thread state into scratch->tstate (one read). */
static __always_inline int read_tstate(struct stack_scratch *scratch, const struct gp_python *py, __u64 tstate)
{
	__u32 len = py->tstate_read_len;

	if (len > GP_TSTATE_READ_MAX)
		len = GP_TSTATE_READ_MAX;
	return bpf_probe_read_user(scratch->tstate, len, (void *)(tstate + py->tstate_read_start));
}

/* The PyThreadState of the current thread, its fields copied into scratch->tstate; or 0. */
static __always_inline __u64 current_tstate(const struct gp_python *py, struct stack_scratch *scratch)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct thread_scan scan = { .py = py, .thread_pointer = task->thread.fsbase };
	__u64 mm = (__u64)task->mm;
	__u64 interp = 0;

	if (scratch->thread_state && scratch->thread_state_mm == mm &&
	    !read_tstate(scratch, py, scratch->thread_state) &&
	    tstate_field(scratch, py, py->tstate_thread_id) == scan.thread_pointer)
		return scratch->thread_state;
	if (read_ptr(&interp, py->runtime + py->interpreters_head) || !interp)
		return 0;
	if (read_ptr(&scan.tstate, interp + py->threads_head))
		return 0;
	bpf_loop(GP_MAX_THREADS, scan_thread, &scan, 0);
	if (!scan.found || read_tstate(scratch, py, scan.tstate))
		return 0;
	scratch->thread_state = scan.tstate;
	scratch->thread_state_mm = mm;
	return scan.tstate;
}

/* Copies a compact str's data (up to `cap` bytes); returns the bytes copied. */
static __always_inline __u32 read_py_str(const struct gp_python *py, __u64 str, __u8 *dst, __u32 cap, __u8 *kind_out,
					 __u32 *chars_out)
{
	__u64 length = 0;
	__u32 state = 0;

	*kind_out = 0;
	if (!str || read_ptr(&length, str + py->unicode_length) ||
	    bpf_probe_read_user(&state, sizeof(state), (void *)(str + py->unicode_state)))
		return 0;
	__u8 kind = (state >> 2) & 7;
	bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
	if (!compact || (kind != 1 && kind != 2 && kind != 4))
		return 0;
	__u64 data = str + (ascii ? py->unicode_ascii_size : py->unicode_compact_size);
	__u64 len = length * kind;
	if (len > cap)
		len = cap;
	len &= 0x1fff;
	if (len > cap)
		len = cap;
	if (bpf_probe_read_user(dst, len, (void *)data))
		return 0;
	*kind_out = kind;
	*chars_out = length;
	return len;
}

/* Sends what symbolizing a code object needs (see struct gp_code). */
static __always_inline void describe_code(const struct gp_python *py, struct code_record *out, __u64 code, __u32 tgid,
					  __u32 tid)
{
	__u64 name = 0, file = 0, table = 0, table_size = 0;
	struct gp_code *c = &out->code;

	__builtin_memset(&out->rec, 0, sizeof(out->rec));
	__builtin_memset(c, 0, sizeof(*c));
	out->rec.kind = GP_RECORD_CODE;
	out->rec.ts_ns = bpf_ktime_get_ns();
	out->rec.pid = tgid;
	out->rec.tid = tid;
	out->rec.device = -1;
	out->rec.addr = code;
	if (bpf_probe_read_user(&c->first_line, sizeof(c->first_line), (void *)(code + py->code_firstlineno)) ||
	    read_ptr(&name, code + py->code_name) || read_ptr(&file, code + py->code_filename) ||
	    read_ptr(&table, code + py->code_linetable))
		return;

	__u32 name_len = read_py_str(py, name, out->data, GP_CODE_NAME_CAP, &c->function_kind, &c->function_chars);
	if (name_len > GP_CODE_NAME_CAP)
		return;
	__u32 file_len = read_py_str(py, file, out->data + name_len, GP_CODE_FILE_CAP, &c->file_kind, &c->file_chars);
	if (file_len > GP_CODE_FILE_CAP)
		return;
	__u32 table_len = 0;
	if (table && !read_ptr(&table_size, table + py->bytes_size)) {
		table_len = table_size > GP_CODE_TABLE_CAP ? GP_CODE_TABLE_CAP : table_size;
		table_len &= 0x1fff;
		if (table_len > GP_CODE_TABLE_CAP)
			table_len = GP_CODE_TABLE_CAP;
		if (bpf_probe_read_user(out->data + name_len + file_len, table_len, (void *)(table + py->bytes_data)))
			table_len = 0;
		c->table_size = table_size;
	}
	c->function_len = name_len;
	c->file_len = file_len;
	c->table_len = table_len;
	__u64 size = sizeof(out->rec) + sizeof(*c) + name_len + file_len + table_len;
	if (size > sizeof(*out))
		size = sizeof(*out);
	if (bpf_ringbuf_output(&events, out, size, wakeup_flags(out->rec.ts_ns)))
		count(GP_COUNTER_RINGBUF_FULL);
}

struct frame_walk {
	const struct gp_python *py;
	struct gp_frame *frames;
	struct stack_scratch *scratch;
	__u64 frame;
	__u64 stack_base; /* the data stack copy covers [stack_base, stack_base + stack_len) */
	__u64 stack_len;
	__u32 tgid;
	__u32 tid;
	__u32 depth;
	bool lost;
	bool truncated;
};

/* A pointer-sized field of a frame copy (fields are 8-byte aligned; offsets were checked by user
 * space to lie within frame_read_len). */
static __always_inline __u64 frame_field(const __u8 *frame, __u16 offset)
{
	if (offset > GP_FRAME_READ_MAX - sizeof(__u64))
		return 0;
	return *(const __u64 *)(frame + (offset & (GP_FRAME_READ_MAX - 8)));
}

/* One frame of the walk (a bpf_loop callback): 1 when the walk is over. */
static long walk_frame(__u64 index, void *ctx)
{
	struct frame_walk *walk = ctx;
	const struct gp_python *py = walk->py;
	struct stack_scratch *scratch = walk->scratch;
	__u64 frame = walk->frame;
	__u32 len = py->frame_read_len;

	if (!frame)
		return 1;
	if (len > GP_FRAME_READ_MAX)
		len = GP_FRAME_READ_MAX;
	const __u8 *copy;
	__u64 at = frame - walk->stack_base;
	if (frame >= walk->stack_base && at + len <= walk->stack_len && at <= GP_STACK_BUF - GP_FRAME_READ_MAX &&
	    (at & 7) == 0) {
		copy = scratch->stack + (at & (GP_STACK_BUF - 8));
	} else if (!bpf_probe_read_user(scratch->frame, len, (void *)frame)) {
		copy = scratch->frame;
	} else {
		walk->lost = true;
		return 1;
	}
	__u64 code = frame_field(copy, py->frame_code);
	__u64 instr = frame_field(copy, py->frame_instr);
	__u8 owner = py->frame_owner > GP_FRAME_READ_MAX - 1 ? 0 : copy[py->frame_owner & (GP_FRAME_READ_MAX - 1)];
	walk->frame = frame_field(copy, py->frame_previous);
	if (py->skip_cstack_frames && owner == GP_FRAME_OWNED_BY_CSTACK)
		return 0;
	/* Kept in the map value, not a register: the verifier need not follow every depth. */
	__u32 depth = scratch->depth;
	if (depth >= GP_MAX_FRAMES) {
		walk->truncated = true;
		return 1;
	}
	struct gp_frame *slot = &walk->frames[depth & (GP_MAX_FRAMES - 1)];
	slot->code = code;
	slot->instr = instr;
	scratch->depth = depth + 1;
	scratch->hash = ((scratch->hash << 5 | scratch->hash >> 59) ^ code) * GP_HASH_MULTIPLIER;
	scratch->hash = ((scratch->hash << 5 | scratch->hash >> 59) ^ instr) * GP_HASH_MULTIPLIER;
	return 0;
}

/* What a pass over a walk's frames needs to describe the code objects new to the thread. */
struct description_pass {
	const struct gp_python *py;
	const struct gp_frame *frames;
	struct stack_scratch *scratch;
	__u32 tgid;
	__u32 tid;
};

/* One frame of that pass (a bpf_loop callback). */
static long describe_if_new(__u64 index, void *ctx)
{
	struct description_pass *pass = ctx;
	struct stack_scratch *scratch = pass->scratch;
	__u64 code = pass->frames[index & (GP_MAX_FRAMES - 1)].code;
	__u32 seen = ((code >> 4) ^ (code >> 12)) & (GP_SEEN_SLOTS - 1);
	__u64 tagged = code | ((__u64)pass->py->generation << 48);

	if (scratch->seen[seen] != tagged) {
		scratch->seen[seen] = tagged;
		describe_code(pass->py, &scratch->code_out, code, pass->tgid, pass->tid);
	}
	return 0;
}

/*
 * Sends what symbolizing needs of each code object of a walk's frames that the thread has not
 * described yet: before the record that names them goes out, so user space meets them first. A
 * pass apart from the walk: a record of a stack the thread sent before needs none.
 */
static __always_inline void describe_new_codes(__u32 tgid, __u32 tid, const struct gp_frame *frames,
					       struct stack_scratch *scratch)
{
	struct gp_python *py = bpf_map_lookup_elem(&python_procs, &tgid);
	struct description_pass pass = { .py = py, .frames = frames, .scratch = scratch, .tgid = tgid, .tid = tid };
	__u32 depth = scratch->depth;

	if (!py || !python_stacks)
		return;
	if (depth > GP_MAX_FRAMES)
		depth = GP_MAX_FRAMES;
	bpf_loop(depth, describe_if_new, &pass, 0);
}

/*
 * Fills `frames` with the Python frames of the thread state whose fields read_tstate copied into
 * scratch->tstate, innermost first; returns how many and sets GP_FLAG_STACK_TRUNCATED /
 * GP_FLAG_STACK_LOST in `flags`.
 */
static __always_inline __u32 walk_frames_of(const struct gp_python *py, __u32 tgid, __u32 tid, struct gp_frame *frames,
					    struct stack_scratch *scratch, __u8 *flags, __u64 *stamp)
{
	struct frame_walk walk = { .py = py, .frames = frames, .scratch = scratch, .tgid = tgid, .tid = tid };

	walk.frame = tstate_field(scratch, py, py->tstate_frame);
	if (py->cframe_current_frame != GP_NO_OFFSET && walk.frame &&
	    read_ptr(&walk.frame, walk.frame + py->cframe_current_frame))
		walk.lost = true;
	phase_done(GP_PHASE_THREAD, stamp);
	if (py->tstate_datastack_chunk != GP_NO_OFFSET && !walk.lost) {
		/* One read for the frames at the top of the data stack (the usual whole stack). */
		__u64 chunk = tstate_field(scratch, py, py->tstate_datastack_chunk);
		__u64 top = tstate_field(scratch, py, py->tstate_datastack_top);

		if (chunk && top > chunk + py->chunk_data) {
			__u64 base = chunk + py->chunk_data;
			__u64 len = top - base;

			if (len > GP_STACK_BUF) {
				base = top - GP_STACK_BUF;
				len = GP_STACK_BUF;
			}
			len &= (GP_STACK_BUF * 2 - 1);
			if (len <= GP_STACK_BUF && !bpf_probe_read_user(scratch->stack, len, (void *)base)) {
				walk.stack_base = base;
				walk.stack_len = len;
			}
		}
	}
	phase_done(GP_PHASE_DATA_STACK, stamp);
	scratch->stack_tag = (__u64)py->generation << 32 | py->stack_epoch;
	scratch->depth = 0;
	scratch->hash = 0;
	if (!walk.lost)
		bpf_loop(GP_MAX_WALK, walk_frame, &walk, 0);
	phase_done(GP_PHASE_FRAMES, stamp);
	walk.depth = scratch->depth;
	if (walk.lost) {
		count(GP_COUNTER_STACK_UNREADABLE);
		*flags |= GP_FLAG_STACK_LOST;
	}
	if (walk.truncated || (!walk.lost && walk.frame))
		*flags |= GP_FLAG_STACK_TRUNCATED;
	return walk.depth;
}

/*
 * Fills `frames` with the current thread's Python frames, innermost first; returns how many and
 * sets GP_FLAG_STACK_TRUNCATED / GP_FLAG_STACK_LOST in `flags`.
 */
static __always_inline __u32 walk_python_stack(__u32 tgid, __u32 tid, struct gp_frame *frames,
					       struct stack_scratch *scratch, __u8 *flags, __u64 *stamp)
{
	if (!python_stacks)
		return 0;
	struct gp_python *py = bpf_map_lookup_elem(&python_procs, &tgid);
	if (!py)
		return 0;
	scratch->depth = 0;
	if (!current_tstate(py, scratch))
		return 0;
	return walk_frames_of(py, tgid, tid, frames, scratch, flags, stamp);
}

struct list_end {
	const struct gp_python *py;
	__u64 tstate; /* the thread state looked at, then the last one */
	__u64 last;
};

static long to_list_end(__u64 index, void *ctx)
{
	struct list_end *end = ctx;
	__u64 next = 0;

	if (!end->tstate)
		return 1;
	end->last = end->tstate;
	if (read_ptr(&next, end->tstate + end->py->tstate_next))
		return 1;
	end->tstate = next;
	return 0;
}

/*
 * Fills `frames` with the Python frames of the process's main thread: the last thread state of
 * the interpreter's list (every version puts new threads at its head), the one a training loop
 * runs `loss.backward()` on and waits in while autograd's threads run the pass.
 */
static __always_inline __u32 walk_main_thread(__u32 tgid, __u32 tid, struct gp_frame *frames,
					      struct stack_scratch *scratch, __u8 *flags, __u64 *stamp)
{
	if (!python_stacks)
		return 0;
	struct gp_python *py = bpf_map_lookup_elem(&python_procs, &tgid);
	struct list_end end = { .py = py };
	__u64 interp = 0;

	if (!py || read_ptr(&interp, py->runtime + py->interpreters_head) || !interp ||
	    read_ptr(&end.tstate, interp + py->threads_head))
		return 0;
	bpf_loop(GP_MAX_THREADS, to_list_end, &end, 0);
	scratch->depth = 0;
	if (!end.last || read_tstate(scratch, py, end.last))
		return 0;
	return walk_frames_of(py, tgid, tid, frames, scratch, flags, stamp);
}

#endif
