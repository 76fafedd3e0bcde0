//! The files a capture opens: the libcuda `run` would probe (the capture's own lookup, in the
//! dynamic loader's order), PyTorch's libc10 (where the tensor-level probe goes), NVML (opened
//! as a capture opens it) and the shim (where `run --via shim` looks for it).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_capture::{libcuda, nvml, shim_library};

use super::{Check, Way};

/// How long python3 may take to say where torch is (it is found, not imported).
const PYTHON_LIMIT: Duration = Duration::from_secs(5);

/// Where PyTorch keeps its core library, relative to the package.
const LIBC10_IN_TORCH: &str = "lib/libc10.so";

/// Asks the interpreter for torch's package directory without importing torch (seconds, and a
/// CUDA initialisation on some builds).
const FIND_TORCH: &str = "import importlib.util, sys\n\
    spec = importlib.util.find_spec('torch')\n\
    print(sys.executable)\n\
    print(spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else '')";

pub(super) fn libcuda() -> Check {
    let lookup = libcuda::look_up_for_loader();
    let Some(path) = lookup.found else {
        return Check::fail(
            "libcuda",
            format!("no {} in {}", libcuda::SONAME, lookup.looked_in.join(", ")),
            format!(
                "install the NVIDIA driver, or put the directory holding {} on LD_LIBRARY_PATH (`run --libcuda PATH` probes a file named outright)",
                libcuda::SONAME
            ),
        );
    };
    if let Err(error) = std::fs::File::open(&path) {
        return Check::fail(
            "libcuda",
            format!("cannot read {}: {error}", path.display()),
            "run gpuprof as a user who can read it (root)",
        );
    }
    match libcuda::driver_version(&path) {
        Some(version) => Check::ok("libcuda", format!("{} (driver {version})", path.display())),
        None => Check::ok("libcuda", path.display().to_string()),
    }
}

pub(super) fn libc10() -> Check {
    let none_found = "tensor-level capture needs PyTorch's libc10.so; none found";
    let (python, torch) = match ask_python() {
        Ok(answer) => answer,
        Err(why) => return Check::not_applicable("libc10", format!("{none_found}: {why}")),
    };
    let Some(torch) = torch else {
        return Check::not_applicable("libc10", format!("{none_found}: {python} has no torch"));
    };
    let library = torch.join(LIBC10_IN_TORCH);
    if library.is_file() {
        Check::ok("libc10", format!("{} (the torch of {python})", library.display()))
    } else {
        Check::fail(
            "libc10",
            format!("the torch of {python} ({}) has no {LIBC10_IN_TORCH}", torch.display()),
            "reinstall PyTorch (pip install --force-reinstall torch)",
        )
    }
}

/// python3 on PATH: its executable and torch's directory, if it has torch.
fn ask_python() -> Result<(String, Option<PathBuf>), String> {
    let mut child = Command::new("python3")
        .args(["-c", FIND_TORCH])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|_| "no python3 on PATH".to_string())?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PYTHON_LIMIT => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("python3 did not say within {} s", PYTHON_LIMIT.as_secs()));
            }
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        // What could not be read is judged below as no answer.
        let _ = stdout.read_to_string(&mut out);
    }
    let mut lines = out.lines();
    match (status.success(), lines.next()) {
        (true, Some(python)) => {
            let torch = lines.next().filter(|dir| !dir.is_empty()).map(PathBuf::from);
            Ok((python.to_string(), torch))
        }
        _ => Err(format!("python3 failed ({status})")),
    }
}

pub(super) fn nvml() -> Check {
    match nvml::open_here() {
        Ok(Some(here)) => {
            let file = here.path.map_or_else(|| nvml::LIBRARY.to_string(), |p| p.display().to_string());
            let devices = gpuprof_model::findings::wording::count(u64::from(here.devices), "device", "devices");
            Check::ok("nvml", format!("{file}: {devices}"))
        }
        Ok(None) => Check::not_applicable(
            "nvml",
            format!(
                "no {} (it comes with the NVIDIA driver): the per-process memory nvidia-smi shows is left out",
                nvml::LIBRARY
            ),
        ),
        Err(error) => Check::fail(
            "nvml",
            format!("{}: {error}", nvml::LIBRARY),
            "make the driver and its libraries match (nvidia-smi says what is wrong)",
        ),
    }
}

/// The shim's check, and whether it makes a way of capturing.
pub(super) fn shim(given: Option<&Path>) -> (Check, Way) {
    let looked_at = match given {
        Some(path) => Ok(path.to_path_buf()),
        None => shim_library::default_path(),
    };
    let found = looked_at.and_then(|path| {
        if path.is_file() {
            shim_library::find(Some(&path))
        } else {
            anyhow::bail!("no {} at {}", shim_library::LIBRARY_FILE, path.display())
        }
    });
    match found {
        Ok(found) => {
            let shown = found.display().to_string();
            (Check::ok("shim", shown.clone()), Way { works: true, why: shown })
        }
        Err(error) => {
            let why = format!("{error:#}");
            (Check::fail("shim", why.clone(), shim_library::MISSING_FIX), Way { works: false, why })
        }
    }
}
