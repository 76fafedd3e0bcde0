//! `gpuprof doctor` on this machine, as root, as a user without capabilities, and without a
//! libcuda: every check's status, detail and fix, and the verdict, exactly. Each runs in a PID
//! namespace of its own, so that the CUDA processes it sees are the test's alone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuprof_testkit::*;
use serde_json::{json, Value};

const PRIVILEGES_FIX: &str =
    "run it as root (sudo), grant them with `setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(command -v gpuprof)`";
const LIBCUDA_FIX: &str = "install the NVIDIA driver, or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH (`run --libcuda PATH` probes a file named outright)";
const SHIM_FIX: &str = "build it with `cargo build -p gpuprof-shim` (it is installed next to gpuprof, or in ../lib/gpuprof/ by the wheel), or name it with --shim PATH";
const FEATURES: [(&str, &str); 5] = [
    ("bpf_loop", "bpf_loop (the Python stack walk) (Linux 5.17)"),
    ("uprobe_cookies", "bpf_get_attach_cookie in uprobes (one program for every driver entry point) (Linux 5.15)"),
    ("task_storage", "task storage in uprobes (the calls in flight of each thread) (Linux 5.13)"),
    ("task_btf", "bpf_get_current_task_btf (Linux 5.11)"),
    ("ring_buffer", "the BPF ring buffer (Linux 5.8)"),
];

/// `gpuprof doctor ARGS` (after `wrapper`, e.g. setpriv) in a new PID namespace with its own
/// /proc, in an environment of `env` alone but PATH; `before` runs first in the namespace's
/// shell (a workload to see).
fn doctor_in_namespace(binary: &Path, wrapper: &[&str], args: &[&str], env: &[(&str, &str)], before: &str) -> Output {
    // The shell is the namespace's first process: when it exits, the kernel ends the rest.
    let script = format!("{before}\n\"$@\" {}", args.join(" "));
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script, "sh"])
        .args(wrapper)
        .arg(binary)
        .arg("doctor");
    command.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
    command.envs(env.iter().copied());
    command.output_within(PATIENCE)
}

fn json_of(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr)))
}

fn check(name: &str, status: &str, detail: &str, fix: Option<&str>) -> Value {
    json!({"name": name, "status": status, "detail": detail, "fix": fix})
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string()
}

/// What python3 on PATH calls itself to whom `wrapper` makes the doctor (the libc10 check names
/// it): another user may not reach the same one.
fn python_on_path(wrapper: &[&str]) -> String {
    // Through env: it searches PATH as gpuprof does, past directories the user cannot enter.
    let words: Vec<&str> =
        wrapper.iter().copied().chain(["env", "python3", "-c", "import sys; print(sys.executable)"]).collect();
    let out = Command::new(words[0])
        .args(&words[1..])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output_within(PATIENCE);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The machine these tests describe has no GPU driver and no PyTorch: a system libcuda, NVML or
/// torch would change the lines asserted, so it is refused here rather than read as a failure.
fn assert_bare_machine() {
    let cache = Command::new("ldconfig").arg("-p").output_within(PATIENCE);
    let cache = String::from_utf8_lossy(&cache.stdout);
    assert!(
        !cache.contains("libcuda.so.1") && !cache.contains("libnvidia-ml.so.1"),
        "this machine has an NVIDIA driver"
    );
    let torch = Command::new("python3")
        .args(["-c", "import importlib.util; print(importlib.util.find_spec('torch') is None)"])
        .output_within(PATIENCE);
    assert_eq!(String::from_utf8_lossy(&torch.stdout).trim(), "True", "python3 on PATH has torch");
}

/// A torch package that holds only what the doctor looks for: `torch/lib/libc10.so`.
fn torch_with_libc10() -> PathBuf {
    let dir = scratch("doctor_torch");
    std::fs::create_dir_all(dir.join("torch/lib")).unwrap();
    std::fs::write(dir.join("torch/__init__.py"), "").unwrap();
    std::fs::copy(libc10_standin(), dir.join("torch/lib/libc10.so")).unwrap();
    dir
}

#[test]
fn as_root_every_ebpf_check_passes_and_each_library_is_named() {
    assert_bare_machine();
    let torch = torch_with_libc10();
    let ready = scratch("doctor_root").join("ready");
    let library_path = format!("{}:{}", standin_dir().display(), nvml_standin_dir().display());
    let python = python3();
    // A CUDA process for the doctor to see: the stand-in loaded, then waiting (pid 2 in the
    // namespace, after its shell).
    let workload = format!(
        "\"{python}\" -c 'import ctypes, sys, time; ctypes.CDLL(\"libcuda.so.1\"); open(sys.argv[1], \"w\").close(); time.sleep(60)' {} &\nwhile [ ! -e {} ]; do sleep 0.02; done",
        ready.display(),
        ready.display()
    );
    let output = doctor_in_namespace(
        Path::new(gpuprof()),
        &[],
        &["-f", "json"],
        &[
            ("LD_LIBRARY_PATH", &library_path),
            ("PYTHONPATH", torch.to_str().unwrap()),
            ("GPUPROF_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
        ],
        &workload,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let shim = shim_library().canonicalize().unwrap();
    let comm: String = Path::new(python).file_name().unwrap().to_str().unwrap().chars().take(15).collect();
    let version =
        Command::new(python).args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).output_within(PATIENCE);
    let version = String::from_utf8(version.stdout).unwrap().trim().to_string();

    let mut checks = vec![
        check("kernel", "ok", &format!("Linux {}", kernel_release()), None),
        check("privileges", "ok", "uid 0 (root) with CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE", None),
        check("btf", "ok", "/sys/kernel/btf/vmlinux", None),
        check("uprobes", "ok", "/sys/bus/event_source/devices/uprobe/type", None),
    ];
    checks.extend(FEATURES.iter().map(|(name, what)| check(name, "ok", what, None)));
    checks.extend([
        check("libcuda", "ok", &format!("{}/libcuda.so.1", standin_dir().display()), None),
        check(
            "libc10",
            "ok",
            &format!("{}/torch/lib/libc10.so (the torch of {})", torch.display(), python_on_path(&[])),
            None,
        ),
        check("nvml", "ok", &format!("{}/libnvidia-ml.so.1: 1 device", nvml_standin_dir().display()), None),
        check("cuda_processes", "ok", &format!("2 {comm} (CPython {version})"), None),
        check("shim", "ok", shim.to_str().unwrap(), None),
        check("collector", "ok", "http://127.0.0.1:4317, from GPUPROF_OTLP_ENDPOINT (not contacted)", None),
    ]);
    assert_eq!(
        json_of(&output),
        json!({
            "checks": checks,
            "verdict": {
                "ebpf": {"works": true, "why": "privileges and kernel features all there"},
                "shim": {"works": true, "why": shim.to_str().unwrap()},
                "line": format!("eBPF capture: yes (privileges and kernel features all there); shim: yes ({})", shim.display()),
            }
        })
    );
}

#[test]
fn without_capabilities_the_shim_alone_captures() {
    assert_bare_machine();
    // A copy an unprivileged user can run, with the shim beside it, wherever the checkout lives.
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("gpuprof-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (binary, shim) = (dir.join("gpuprof"), dir.join("libgpuprof_shim.so"));
    std::fs::copy(gpuprof(), &binary).unwrap();
    std::fs::copy(shim_library(), &shim).unwrap();
    let unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"];
    let env =
        [("LD_LIBRARY_PATH", standin_dir().to_str().unwrap()), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4317")];
    let with_shim = doctor_in_namespace(&binary, &unprivileged, &["-f", "json"], &env, "");
    std::fs::remove_file(&shim).unwrap();
    let without_shim = doctor_in_namespace(&binary, &unprivileged, &["-f", "json"], &env, "");
    let refused = Command::new(unprivileged[0])
        .args(&unprivileged[1..])
        .arg(&binary)
        .args(["run", "--", "true"])
        .output_within(PATIENCE);
    std::fs::remove_dir_all(&dir).unwrap();

    let mut checks = vec![
        check("kernel", "ok", &format!("Linux {}", kernel_release()), None),
        check(
            "privileges",
            "fail",
            "uid 65534 without CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE: shim only (eBPF probes need them)",
            Some(PRIVILEGES_FIX),
        ),
        check("btf", "ok", "/sys/kernel/btf/vmlinux", None),
        check("uprobes", "ok", "/sys/bus/event_source/devices/uprobe/type", None),
    ];
    checks.extend(FEATURES.iter().map(|(name, what)| {
        check(name, "n/a", &format!("{what}: not probed, probing loads a BPF program (CAP_BPF)"), None)
    }));
    checks.extend([
        check("libcuda", "ok", &format!("{}/libcuda.so.1", standin_dir().display()), None),
        check(
            "libc10",
            "n/a",
            &format!("tensor-level capture needs PyTorch's libc10.so; none found: {} has no torch", python_on_path(&unprivileged)),
            None,
        ),
        check(
            "nvml",
            "n/a",
            "no libnvidia-ml.so.1 (it comes with the NVIDIA driver): the per-process memory nvidia-smi shows is left out",
            None,
        ),
        check("cuda_processes", "n/a", "none running that uid 65534 can see (other users' need CAP_SYS_PTRACE)", None),
        check("shim", "ok", shim.to_str().unwrap(), None),
        check(
            "collector",
            "n/a",
            "none configured (the daemon's GPUPROF_OTLP_ENDPOINT or otlp_endpoint in its config file; `run --otlp-endpoint URL`); OTEL_EXPORTER_OTLP_ENDPOINT (http://otel:4317) is not read by gpuprof",
            None,
        ),
    ]);
    assert_eq!(with_shim.status.code(), Some(0), "{}", String::from_utf8_lossy(&with_shim.stderr));
    assert_eq!(
        json_of(&with_shim),
        json!({
            "checks": checks,
            "verdict": {
                "ebpf": {"works": false, "why": "missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"},
                "shim": {"works": true, "why": shim.to_str().unwrap()},
                "line": format!(
                    "eBPF capture: no (missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE); shim: yes ({}); shim only: `gpuprof run --via shim -- CMD`",
                    shim.display()
                ),
            }
        })
    );

    // Without the shim nothing can capture: the shim's line says where it looked, and gpuprof exits 1.
    let missing = format!("no libgpuprof_shim.so at {}", shim.display());
    let shim_at = checks.iter().position(|c| c["name"] == "shim").unwrap();
    checks[shim_at] = check("shim", "fail", &missing, Some(SHIM_FIX));
    assert_eq!(without_shim.status.code(), Some(1), "{}", String::from_utf8_lossy(&without_shim.stderr));
    assert_eq!(
        json_of(&without_shim),
        json!({
            "checks": checks,
            "verdict": {
                "ebpf": {"works": false, "why": "missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"},
                "shim": {"works": false, "why": missing},
                "line": format!(
                    "eBPF capture: no (missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE); shim: no ({missing}); nothing can capture here"
                ),
            }
        })
    );

    // `run` refuses in one line, which points here.
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        format!(
            "gpuprof: error: missing privileges CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE: gpuprof loads eBPF probes (CAP_BPF, CAP_PERFMON) and reads other processes' memory maps (CAP_SYS_PTRACE); {PRIVILEGES_FIX}, or capture without them from inside the process: `gpuprof run --via shim -- CMD` (gpuprof doctor says what this machine can capture)\n"
        )
    );
}

#[test]
fn without_libcuda_its_line_names_every_place_looked_in() {
    assert_bare_machine();
    let dir = scratch("doctor_no_libcuda");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let config = dir.join("daemon.toml");
    std::fs::write(&config, "otlp_endpoint = \"http://collector:4317\"\n").unwrap();
    let output = doctor_in_namespace(
        Path::new(gpuprof()),
        &[],
        &["-f", "table"],
        &[("LD_LIBRARY_PATH", empty.to_str().unwrap()), ("GPUPROF_CONFIG", config.to_str().unwrap())],
        "",
    );
    // Through a pipe but asked for: the table, a line per check, ✗ lines with their fix.
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let shim = shim_library().canonicalize().unwrap();
    let not_found = format!(
        "no libcuda.so.1 in {} (LD_LIBRARY_PATH), the loader cache (ldconfig -p), /lib64, /usr/lib64, /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib, /usr/lib",
        empty.display()
    );
    let mut lines = vec![
        format!("✓ kernel          Linux {}", kernel_release()),
        "✓ privileges      uid 0 (root) with CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE".to_string(),
        "✓ btf             /sys/kernel/btf/vmlinux".to_string(),
        "✓ uprobes         /sys/bus/event_source/devices/uprobe/type".to_string(),
    ];
    lines.extend(FEATURES.iter().map(|(name, what)| format!("✓ {name:<14}  {what}")));
    lines.extend([
        format!("✗ libcuda         {not_found}; fix: {LIBCUDA_FIX}"),
        format!(
            "– libc10          tensor-level capture needs PyTorch's libc10.so; none found: {} has no torch",
            python_on_path(&[])
        ),
        "– nvml            no libnvidia-ml.so.1 (it comes with the NVIDIA driver): the per-process memory nvidia-smi shows is left out".to_string(),
        "– cuda_processes  none running".to_string(),
        format!("✓ shim            {}", shim.display()),
        format!("✓ collector       http://collector:4317, from otlp_endpoint in {} (not contacted)", config.display()),
        format!("eBPF capture: yes (privileges and kernel features all there); shim: yes ({})", shim.display()),
    ]);
    assert_eq!(String::from_utf8_lossy(&output.stdout), lines.join("\n") + "\n");

    // Through a pipe and not asked: JSON, as `report` and `summary` write for a program.
    let piped =
        doctor_in_namespace(Path::new(gpuprof()), &[], &[], &[("LD_LIBRARY_PATH", empty.to_str().unwrap())], "");
    assert_eq!(json_of(&piped)["checks"][9], check("libcuda", "fail", &not_found, Some(LIBCUDA_FIX)));
}
