//! What the integration tests of every package share: the workspace's binaries (the agent, the
//! collector, the shim), fixtures built from source (the libcuda stand-in, C workloads), the
//! Python interpreter, and readers for the event stream and the workloads' expected-event logs.
//! A dev-dependency of each package whose tests drive the real binaries.

pub mod caching_job;
pub mod collector;
pub mod daemon;
pub mod deadline;
pub mod prometheus;
mod workspace;

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpuprof_model::event::{Event, Layer};
use serde_json::Value;

pub use deadline::*;
pub use workspace::target_tmpdir;

/// The agent binary, `gpuprof`, brought up to date first.
pub fn gpuprof() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        // gpuprof finds the shim beside itself (`run --via shim`, a sidecar shares it): a test that
        // runs gpuprof first on a clean checkout must not find it missing.
        shim_library();
        let path = workspace::build("gpuprof", &["--bin", "gpuprof"], "gpuprof");
        path.into_os_string().into_string().expect("a UTF-8 target directory")
    })
}

/// The test fixtures' sources: stand-ins, workloads, scripts the tests run.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The values of C expressions over the declarations of a stand-in's header in `fixtures()`, as
/// cc lays them out: compiled into a program that prints them. The layout tests hold what a
/// capture reads (BPF structs, mirrored PyTorch and CUDA layouts) to the stand-ins the other
/// tests run against.
pub fn standin_values(header: &str, expressions: &[&str]) -> Vec<usize> {
    // One directory per call: the tests run side by side.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gpuprof-layout-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prints: String = expressions.iter().map(|e| format!("\tprintf(\"%zu\\n\", (size_t)({e}));\n")).collect();
    let source = dir.join("layout.c");
    std::fs::write(
        &source,
        format!("#include <stddef.h>\n#include <stdio.h>\n#include \"{header}\"\nint main(void)\n{{\n{prints}}}\n"),
    )
    .unwrap();
    let program = dir.join("layout");
    let status =
        Command::new("cc").arg("-I").arg(fixtures()).arg("-o").arg(&program).arg(&source).status_within(PATIENCE);
    assert!(status.success(), "compiling a program over {header} failed");
    let output = Command::new(&program).output_within(PATIENCE);
    std::fs::remove_dir_all(&dir).unwrap();
    String::from_utf8(output.stdout).unwrap().lines().map(|line| line.parse().unwrap()).collect()
}

pub fn workloads() -> PathBuf {
    fixtures().join("workloads")
}

/// A fresh directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = target_tmpdir().join("scratch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn build_dir() -> PathBuf {
    let dir = target_tmpdir().join("fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles a C fixture; the output is replaced atomically (a new inode), so probes that a
/// running test holds on the old file are not disturbed.
fn compile(source: &str, output: &Path, extra: &[&str]) {
    let staging = output.with_extension(format!("tmp{}", std::process::id()));
    let status = Command::new("cc")
        .args(["-O1", "-fno-ipa-icf", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&staging)
        .arg(fixtures().join(source))
        .args(extra)
        .status_within(PATIENCE);
    assert!(status.success(), "compiling {source} failed");
    std::fs::rename(&staging, output).unwrap();
}

/// How the probed stand-ins' functions begin: `endbr64; push %rbp`, as distributions' CET builds
/// do. The probes go past the `endbr64` onto the `push` (which the kernel runs without a second
/// trap), so every capture test checks that a probe placed there reads the call right.
const PROLOGUE: [&str; 3] = ["-fcf-protection=full", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"];

/// The directory holding the libcuda stand-in as `libcuda.so.1` (for LD_LIBRARY_PATH).
pub fn standin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = build_dir().join("standin");
        std::fs::create_dir_all(&dir).unwrap();
        compile(
            "libcuda_standin.c",
            &dir.join("libcuda.so.1"),
            &["-shared", "-fPIC", "-fvisibility=hidden", "-lpthread", "-ldl", PROLOGUE[0], PROLOGUE[1], PROLOGUE[2]],
        );
        // CUPTI beside the driver, found by name on the library path like a toolkit's.
        compile(
            "libcupti_standin.c",
            &dir.join("libcupti.so.13"),
            &["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libcupti.so.13", "-lpthread", "-ldl"],
        );
        dir
    })
}

/// A directory holding the libnvidia-ml stand-in as `libnvidia-ml.so.1` (for LD_LIBRARY_PATH, beside
/// `standin_dir`): NVML's per-process used memory, as the libcuda stand-in accounts it.
pub fn nvml_standin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = build_dir().join("standin-nvml");
        std::fs::create_dir_all(&dir).unwrap();
        compile(
            "libnvidia_ml_standin.c",
            &dir.join("libnvidia-ml.so.1"),
            &["-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1"],
        );
        dir
    })
}

/// A directory holding the libnccl stand-in as `libnccl.so.2` (for LD_LIBRARY_PATH, beside
/// `standin_dir`): a library that calls the driver from its own code and its own thread.
pub fn nccl_standin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = build_dir().join("standin-nccl");
        std::fs::create_dir_all(&dir).unwrap();
        compile(
            "libnccl_standin.c",
            &dir.join("libnccl.so.2"),
            &[
                "-shared",
                "-fPIC",
                "-fno-optimize-sibling-calls",
                "-fvisibility=hidden",
                "-Wl,-soname,libnccl.so.2",
                "-lpthread",
                "-ldl",
            ],
        );
        dir
    })
}

/// A directory holding the libcuda stand-in and no libcupti: a CUDA process CUPTI cannot watch.
pub fn standin_dir_without_cupti() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = build_dir().join("standin-no-cupti");
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libcuda.so.1");
        if !link.exists() {
            std::os::unix::fs::symlink(standin_dir().join("libcuda.so.1"), &link).unwrap();
        }
        dir
    })
}

/// The C workload `workloads/ipc_fork.c`, built.
pub fn ipc_fork_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let output = build_dir().join("ipc_fork");
        compile("workloads/ipc_fork.c", &output, &["-ldl"]);
        output
    })
}

/// The C workload `workloads/churn_worker.c`, built.
pub fn churn_worker_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let output = build_dir().join("churn_worker");
        compile("workloads/churn_worker.c", &output, &["-ldl"]);
        output
    })
}

/// The native-thread helper library (`c_thread.c`) the stack workload loads.
pub fn c_thread_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let output = build_dir().join("libc_thread.so");
        compile("c_thread.c", &output, &["-shared", "-fPIC", "-ldl", "-lpthread"]);
        output
    })
}

/// Where scripts/install-prerequisites.sh puts the test tools (`GPUPROF_TEST_TOOLS`).
pub fn test_tools() -> PathBuf {
    std::env::var_os("GPUPROF_TEST_TOOLS")
        .map_or_else(|| PathBuf::from("/usr/local/lib/gpuprof-test-tools"), PathBuf::from)
}

/// The Python that has the test tools' packages (OpenTelemetry, kubernetes-validate): their
/// virtual environment, else python3 (a machine that installed them its own way).
pub fn tools_python() -> String {
    let venv = test_tools().join("venv/bin/python3");
    if venv.is_file() {
        venv.to_string_lossy().into_owned()
    } else {
        python3().to_string()
    }
}

/// The python3.X executable of every CPython the tests cover (3.8–3.13), installed by pyenv.
/// Under CI (`CI=true`) every one is required and a missing one fails the test with what to
/// install; elsewhere the tests run on those present (at least one) and say which.
pub fn pythons() -> Vec<(String, PathBuf)> {
    let root = Command::new("pyenv")
        .arg("root")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| Path::new(&std::env::var("HOME").unwrap_or_default()).join(".pyenv"));
    let (found, missing): (Vec<_>, Vec<_>) = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]
        .iter()
        .map(|version| {
            let found = std::fs::read_dir(root.join("versions")).ok().and_then(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{version}.")))
                    })
                    .map(|p| p.join("bin").join(format!("python{version}")))
                    .find(|p| p.is_file())
            });
            (version.to_string(), found)
        })
        .partition(|(_, path)| path.is_some());
    let missing: Vec<String> = missing.into_iter().map(|(version, _)| version).collect();
    let install = format!("install with `pyenv install {}` (under {}/versions)", missing.join(" "), root.display());
    if !missing.is_empty() && std::env::var("CI").as_deref() == Ok("true") {
        panic!("CPython {} missing: CI requires every version the stack tests read: {install}", missing.join(", "));
    }
    let found: Vec<(String, PathBuf)> =
        found.into_iter().map(|(version, path)| (version, path.expect("partitioned"))).collect();
    assert!(!found.is_empty(), "no CPython 3.8-3.13 for the stack tests: {install}");
    if !missing.is_empty() {
        let covered: Vec<&str> = found.iter().map(|(v, _)| v.as_str()).collect();
        eprintln!("stack tests cover CPython {} (missing {}: {install})", covered.join(", "), missing.join(", "));
    }
    found
}

/// The directory holding the libc10 stand-in as `libc10.so`.
pub fn libc10_standin() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let dir = build_dir().join("torch_lib");
        std::fs::create_dir_all(&dir).unwrap();
        let output = dir.join("libc10.so");
        compile(
            "libc10_standin.c",
            &output,
            &["-shared", "-fPIC", "-fvisibility=hidden", PROLOGUE[0], PROLOGUE[1], PROLOGUE[2]],
        );
        output
    })
}

/// The libc10_cuda stand-in (`libc10_cuda.so`, next to the libc10 stand-in it imports from).
pub fn libc10_cuda_standin() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let libc10 = libc10_standin();
        let dir = libc10.parent().unwrap();
        let output = dir.join("libc10_cuda.so");
        let search = format!("-L{}", dir.display());
        // Full RELRO, as distributions build: an injected shim must lift it to rebind the import.
        compile(
            "libc10_cuda_standin.c",
            &output,
            &[
                "-shared",
                "-fPIC",
                &search,
                "-lc10",
                "-ldl",
                "-lpthread",
                "-Wl,-rpath,$ORIGIN",
                "-Wl,-z,relro,-z,now",
                PROLOGUE[0],
                PROLOGUE[1],
                PROLOGUE[2],
            ],
        );
        output
    })
}

/// The libtorch_cpu stand-in (`libtorch_cpu.so`, next to the libc10 stand-in it reports to):
/// autograd's thread-locals and nodes as PyTorch lays them out, and an "autograd thread".
pub fn libtorch_cpu_standin() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let libc10 = libc10_standin();
        let dir = libc10.parent().unwrap();
        let output = dir.join("libtorch_cpu.so");
        let search = format!("-L{}", dir.display());
        compile(
            "libtorch_cpu_standin.c",
            &output,
            &["-shared", "-fPIC", "-fvisibility=hidden", &search, "-lc10", "-Wl,-rpath,$ORIGIN", "-lpthread"],
        );
        output
    })
}

/// gpuprof's in-process shim (`libgpuprof_shim.so`), brought up to date first.
pub fn shim_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| workspace::build("gpuprof-shim", &["--lib"], gpuprof_model::shim::LIBRARY_FILE))
}

/// Calls and allocator blocks (every event but process transitions), in capture order.
pub fn memory_events(events: &[Event]) -> Vec<&Event> {
    events.iter().filter(|e| e.layer != Layer::Process).collect()
}

/// The real python3 executable (not a pyenv shim, whose exec chain would add noise).
pub fn python3() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output_within(PATIENCE);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
}

/// A command set up to use the stand-in and log expected events to `log`.
pub fn workload_env(command: &mut Command, log: &Path) {
    command
        .env("LD_LIBRARY_PATH", standin_dir())
        .env("GPUPROF_WORKLOAD_LOG", log)
        .env("PYTHONPATH", workloads())
        .env("PYTHONUNBUFFERED", "1")
        .env("GPUPROF_C_THREAD_LIB", c_thread_library())
        .env("GPUPROF_LIBC10", libc10_standin());
}

/// `gpuprof run [args] -- command…` with the workload environment; waits for it.
pub fn gpuprof_run(args: &[&str], command: &[&str], log: &Path) -> Output {
    let mut cmd = Command::new(gpuprof());
    cmd.arg("run").args(args).arg("--").args(command);
    workload_env(&mut cmd, log);
    cmd.output_within(PATIENCE)
}

/// The capture's counters at the end of a run given `--stats` (`gpuprof: N events (…/s) from …;
/// lost N (ring buffer full N, call table full N); …`): the last such line, after the ones
/// printed each second.
pub fn counters_line(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("gpuprof: ") && l.contains(" events (") && l.contains("; lost "))
        .unwrap_or_else(|| panic!("no counters line in {stderr}"))
}

/// Reads a jsonl event file; every line must be a contract event.
pub fn read_events(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{}:{}: {e}: {line}", path.display(), i + 1))
        })
        .collect()
}

/// Reads a workload's expected-event log.
pub fn read_expected(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// The expected driver events (notes left out).
pub fn expected_calls(expected: &[Value]) -> Vec<Value> {
    expected.iter().filter(|e| e["op"] != "note").cloned().collect()
}

/// The pid a workload noted for a role ("parent", "fork", "spawn").
pub fn pid_of_role(expected: &[Value], role: &str) -> u32 {
    expected
        .iter()
        .find(|e| e["op"] == "note" && e["role"] == role)
        .unwrap_or_else(|| panic!("workload noted no {role} pid"))["pid"]
        .as_u64()
        .unwrap() as u32
}

pub fn driver_events(events: &[Event]) -> Vec<&Event> {
    events.iter().filter(|e| e.layer == Layer::Driver).collect()
}

/// Checks, call by call and in order, that the captured events are exactly the expected ones:
/// every field the workload logged equals the event's field; nothing extra, nothing missing.
pub fn assert_same_calls(expected: &[Value], captured: &[&Event]) {
    assert_same_calls_from(expected, captured, gpuprof_model::event::Source::Ebpf);
}

/// As assert_same_calls, for events captured by `source`.
pub fn assert_same_calls_from(expected: &[Value], captured: &[&Event], source: gpuprof_model::event::Source) {
    for (index, (want, got)) in expected.iter().zip(captured).enumerate() {
        let got_json = serde_json::to_value(got).unwrap();
        for (field, value) in want.as_object().unwrap() {
            assert_eq!(
                &got_json[field], value,
                "call {index} ({}): field {field} differs\n expected {want}\n captured {got_json}",
                want["api"]
            );
        }
        assert_eq!(got.source, source);
    }
    assert_eq!(
        captured.len(),
        expected.len(),
        "captured {} calls, the workload made {}",
        captured.len(),
        expected.len()
    );
}

/// Opens an HTML report in headless Chromium and runs the steps on it (fixtures/browse_report.py
/// says which there are); checks the page threw nothing and asked for nothing but itself.
pub fn browse_report(page: &Path, steps: Value) -> Value {
    let steps_file = page.with_extension("steps.json");
    std::fs::write(&steps_file, steps.to_string()).unwrap();
    let output = Command::new(python3())
        .arg(fixtures().join("browse_report.py"))
        .arg(page)
        .arg(&steps_file)
        .output_within(PATIENCE);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["errors"], serde_json::json!([]), "{report}");
    assert_eq!(report["requests"], serde_json::json!([format!("file://{}", page.display())]));
    report
}

/// Starts a workload that prints "ready" when it may be attached to; returns it with stdin open.
pub fn start_ready_workload(mut command: Command) -> Child {
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = command.spawn().expect("workload starts");
    let line =
        line_within(&mut BufReader::new(child.stdout.as_mut().unwrap()), READY_LIMIT, "the workload's \"ready\"");
    assert_eq!(line.trim(), "ready", "workload did not get ready");
    child
}

/// Waits until gpuprof's stderr has a line containing `text` (30 s at most); returns the lines
/// read.
pub fn wait_for_stderr(stderr: &mut BufReader<ChildStderr>, text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = match read_line_before(stderr, deadline) {
            Ok(line) => line,
            Err(waited) => panic!("gpuprof never said {text:?} ({waited}); it said {lines:?}"),
        };
        let found = line.contains(text);
        lines.push(line);
        if found {
            return lines;
        }
    }
}

/// What one `gpuprof run` of a leaks.py scenario left behind.
pub struct LeaksRun {
    pub findings: Vec<gpuprof_model::Finding>,
    /// The jsonl event file.
    pub events: PathBuf,
    pub expected: Vec<Value>,
    pub stderr: String,
}

/// `gpuprof run --output … --findings … [args] -- python leaks.py SCENARIO` in a scratch
/// directory of its own, with `env` added; the run must exit 0.
pub fn run_leaks(dir_name: &str, scenario: &str, env: &[(&str, String)], args: &[&str]) -> LeaksRun {
    let dir = scratch(dir_name);
    let (log, events, findings) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("findings.json"));
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--output", events.to_str().unwrap(), "--findings", findings.to_str().unwrap()]);
    cmd.args(args).arg("--").arg(python3()).arg(workloads().join("leaks.py")).arg(scenario);
    workload_env(&mut cmd, &log);
    for (key, value) in env {
        cmd.env(key, value);
    }
    let output = cmd.output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    LeaksRun {
        findings: serde_json::from_str(&std::fs::read_to_string(&findings).unwrap()).unwrap(),
        events,
        expected: read_expected(&log),
        stderr,
    }
}

/// The autograd workload's backward blocks (`workloads/autograd.py`), as it logged them: each
/// node's gradient allocated and freed on the stand-in's engine thread with the node's class and
/// the forward line that made the node under an `<autograd>` frame; forward blocks with their own
/// stack and their thread's sequence counter.
pub fn assert_backward_attribution(expected: &[Value], events: &[Event]) {
    use gpuprof_model::event::{Layer, Op};
    assert_eq!(expected.len(), 2 * 2 * 3, "two steps of two blocks of three nodes");
    let backward: Vec<&Event> = events.iter().filter(|e| e.autograd_node.is_some()).collect();
    // Each node's gradient, allocated and freed.
    assert_eq!(backward.len(), 2 * expected.len());
    let forward_thread = events.iter().find(|e| e.layer == Layer::Allocator && e.autograd_node.is_none()).unwrap();
    for node in expected {
        let grad = node["grad"].as_u64().unwrap();
        let blocks: Vec<&&Event> = backward.iter().filter(|e| e.size == grad).collect();
        assert_eq!(blocks.iter().map(|e| e.op).collect::<Vec<_>>(), [Op::Alloc, Op::Free], "{node}");
        for block in blocks {
            assert_eq!(block.autograd_node.as_deref(), node["node"].as_str(), "{node}");
            assert_ne!(block.tid, forward_thread.tid);
            assert_eq!(block.autograd_thread, forward_thread.autograd_thread);
            assert_eq!(block.stack_origin.map(|o| o.as_str()), node["origin"].as_str(), "{node}");
            let frames = block.stack.frames();
            assert_eq!(
                (frames[0].function.as_str(), frames[0].file.as_str()),
                (node["node"].as_str().unwrap(), "<autograd>")
            );
            let forward: Vec<Value> = frames[1..]
                .iter()
                .map(|f| serde_json::json!({"function": f.function, "file": f.file, "line": f.line}))
                .collect();
            assert_eq!(Value::from(forward), node["stack"], "{node}");
        }
    }
    // Forward blocks keep their own stack and carry their thread's sequence counter: 3 nodes a
    // block, the addmm's output right after its node (1), the relu's after its (3).
    let outputs: Vec<u64> = events
        .iter()
        .filter(|e| e.layer == Layer::Allocator && e.autograd_node.is_none())
        .map(|e| e.autograd_seq.unwrap())
        .collect();
    assert_eq!(outputs, [1, 3, 4, 6, 7, 9, 10, 12]);
}

/// A Python program whose driver calls come from NCCL's stand-in (`libnccl.so.2`, found through
/// `nccl_standin_dir`): ncclMemAlloc on the Python thread (line 6), the communicator's buffer on
/// NCCL's own thread; then it lingers, so that its modules can be read from its maps.
pub const NCCL_CALLS: &str = "import ctypes\n\
    from cuda_driver import Driver\n\
    cuda = Driver(); cuda.init()\n\
    class UniqueId(ctypes.Structure): _fields_ = [('internal', ctypes.c_char * 128)]\n\
    nccl = ctypes.CDLL('libnccl.so.2'); uid = UniqueId(); assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0\n\
    buffer = ctypes.c_void_p(); assert nccl.ncclMemAlloc(ctypes.byref(buffer), 2 << 20) == 0\n\
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]\n\
    comm = ctypes.c_void_p(); assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0\n\
    import time; time.sleep(1.5)\n";

/// `NCCL_CALLS`'s driver allocations name NCCL as their caller, the one on the Python thread
/// with its line, the one on NCCL's thread with none; Python's own ctypes calls name libffi.
pub fn assert_nccl_callers(captured: &[Event], pid: u32) {
    let allocs: Vec<&Event> = captured.iter().filter(|e| e.pid == pid && e.api == "cuMemAlloc_v2").collect();
    let got: Vec<(u64, Option<&str>, bool, Option<u32>)> = allocs
        .iter()
        .map(|e| (e.size, e.caller_module.as_deref(), e.tid == e.pid, e.stack.first().map(|f| f.line)))
        .collect();
    assert_eq!(
        got,
        vec![(2 << 20, Some("libnccl.so.2"), true, Some(6)), (4 << 20, Some("libnccl.so.2"), false, None)],
        "{allocs:#?}"
    );
    let context = captured.iter().find(|e| e.pid == pid && e.api == "cuDevicePrimaryCtxRetain").unwrap();
    assert!(
        context.caller_module.as_deref().is_some_and(|m| m.starts_with("libffi.so") || m.starts_with("_ctypes")),
        "{context:?}"
    );
}
