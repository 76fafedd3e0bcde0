//! libgpuprof_shim.so: gpuprof's capture from inside a process, where eBPF is not allowed or a
//! uprobe's trap per call costs too much. Loaded with `LD_PRELOAD` (its constructor starts it) or
//! named by `CUDA_INJECTION64_PATH` (the driver calls `InitializeInjection`); either way it
//! starts once.
//!
//! It captures PyTorch's caching allocator by interposing `c10::reportMemoryUsageToProfiler`
//! (every tensor block, with the allocator's totals, the Python stack and autograd's state),
//! forwarding each call to the real function: preloaded, by symbol resolution; injected, by
//! rewriting the callers' GOT slots. And the driver's memory entry points through CUPTI's
//! callbacks (with the module that called the driver), cross-checked with CUPTI's memory
//! activity records. Events leave through a bounded queue drained by a thread of the shim's own:
//! to the local agent's Unix socket (`GPUPROF_SHIM_SOCKET`) or to a jsonl file
//! (`GPUPROF_SHIM_OUTPUT`). The calling thread never waits: a full queue drops and counts.
//!
//! The modules, in layers; each imports only from the modules listed before it (a unit test
//! below holds them to it):
//! 1. `ring`, `queue`, `level`, `timing`, `loaded`: the bounded ring and queue between the
//!    calling threads and the sender, and the records they carry; the capture level the hot path
//!    reads; the hot path's own timing, when asked for; the walk over the loaded objects.
//! 2. `python_stack`, `autograd_state`: what a calling thread reads about itself — its Python
//!    stack (code objects described on first sight, into the queue), autograd's thread-locals.
//! 3. `recorder`: one call recorded by the thread that made it, its stack walked into the slot.
//! 4. The producers: `cupti` (the driver's entry points through CUPTI's callbacks, the activity
//!    cross-check, the subscriber slot), then `forward`, `got` and `allocator` (the interposed
//!    c10 hook, the real one found by name, imports rebound when injected).
//! 5. The sender: `stacks` (frames to JSON), `sink` (the thread that drains the queue and writes
//!    the events and the counters line).
//!
//! This file wires them: it has the queue start the sender, and resets each layer in a forked
//! child.

mod allocator;
mod autograd_state;
mod cupti;
mod forward;
mod got;
mod level;
mod loaded;
mod python_stack;
mod queue;
mod recorder;
mod ring;
mod sink;
mod stacks;
mod timing;

use std::sync::Once;

static START: Once = Once::new();

/// Everything the shim sets up, once per process image, whichever way it was loaded.
fn start() {
    START.call_once(|| {
        level::from_environment();
        timing::from_environment();
        queue::start_sender_with(sink::ensure_running);
        // SAFETY: registering a handler with no preconditions; it only touches atomics and the
        // lock-free queues.
        unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        sink::register_exit_flush();
    });
}

/// A forked child has copies of the parent's records, ids and sender state, and no sender
/// thread: each layer starts over, bottom up (the sender's bookkeeping starts from the emptied
/// ring).
extern "C" fn in_forked_child() {
    python_stack::forget_ids_after_fork();
    queue::restart_in_forked_child();
    sink::forget_sender_after_fork();
}

/// Run by the dynamic loader when the library is preloaded (and when it is loaded any other way).
extern "C" fn on_load() {
    start();
    cupti::arrange_injection();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// The CUDA driver's entry point for an injection library (`CUDA_INJECTION64_PATH`), called at
/// `cuInit`; returns nonzero for success, as the driver expects. Loaded this way the shim is not
/// in the global symbol scope: the allocator's already-bound imports are pointed at it. Then the
/// driver's memory entry points are subscribed to through CUPTI (once, however often this runs).
#[no_mangle]
pub extern "C" fn InitializeInjection() -> libc::c_int {
    start();
    got::redirect(forward::SYMBOL, allocator::report_memory_usage_to_profiler as *const std::ffi::c_void);
    for (name, interposer) in cupti::interposers() {
        got::redirect(name, interposer);
    }
    cupti::start();
    1
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The modules in the order of the layers above.
    const LAYERED: [&str; 14] = [
        "ring",
        "queue",
        "level",
        "timing",
        "loaded",
        "python_stack",
        "autograd_state",
        "recorder",
        "cupti",
        "forward",
        "got",
        "allocator",
        "stacks",
        "sink",
    ];

    /// The modules a source file names through `crate::` (`crate::queue::Call`,
    /// `crate::{autograd_state, cupti::caller}`).
    fn imported(source: &str) -> Vec<String> {
        let mut modules = Vec::new();
        for (at, _) in source.match_indices("crate::") {
            let rest = &source[at + "crate::".len()..];
            let paths = match rest.strip_prefix('{') {
                Some(group) => {
                    let mut depth = 1;
                    let end = group
                        .char_indices()
                        .find(|(_, c)| {
                            depth += match c {
                                '{' => 1,
                                '}' => -1,
                                _ => 0,
                            };
                            depth == 0
                        })
                        .map_or(group.len(), |(end, _)| end);
                    let mut paths = Vec::new();
                    let (mut depth, mut start) = (0, 0);
                    for (i, c) in group[..end].char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            ',' if depth == 0 => {
                                paths.push(&group[start..i]);
                                start = i + 1;
                            }
                            _ => {}
                        }
                    }
                    paths.push(&group[start..end]);
                    paths
                }
                None => vec![rest],
            };
            for path in paths {
                let name: String = path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    modules.push(name);
                }
            }
        }
        modules
    }

    /// The module a file under src/ belongs to (`cupti/callback.rs`: `cupti`).
    fn module_of(src: &Path, file: &Path) -> String {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_str().unwrap();
        first.trim_end_matches(".rs").to_string()
    }

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_module_imports_only_the_ones_listed_before_it() {
        assert_eq!(
            imported(
                "use crate::queue::{self, Call};\nuse crate::{autograd_state, cupti::caller::{x, y}, sink};\n crate::python_stack::walk()"
            ),
            ["queue", "autograd_state", "cupti", "sink", "python_stack"]
        );
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        for file in files.iter().filter(|f| !f.ends_with("src/lib.rs")) {
            let module = module_of(&src, file);
            let rank = LAYERED.iter().position(|m| *m == module);
            let rank = rank.unwrap_or_else(|| panic!("{} is in no layer of lib.rs's list", file.display()));
            for used in imported(&std::fs::read_to_string(file).unwrap()) {
                let used_rank = LAYERED.iter().position(|m| *m == used).unwrap_or(usize::MAX);
                assert!(
                    used_rank < rank,
                    "{} ({module}) imports {used}, which is not listed before it in lib.rs's layers",
                    file.display()
                );
            }
        }
    }
}
