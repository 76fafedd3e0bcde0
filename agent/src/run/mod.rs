//! `gpuprof run -- CMD…`: a command started here and captured from its first instruction, with
//! eBPF (this module) or with the shim preloaded (`via_shim`), until it exits (then the processes
//! it leaves holding GPU memory), the duration passes or a second signal arrives (the first is
//! passed on to it).

pub mod via_shim;

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

use crate::flags::CaptureArgs;
use gpuprof_capture::kernel::Capture;
use gpuprof_capture::libcuda::{self, LibraryFile};
use gpuprof_capture::session::{EbpfSource, Ended, Session, Until};
use gpuprof_capture::signals;

/// `gpuprof run -- CMD…` with eBPF: returns CMD's exit code.
pub fn run(command: &[OsString], args: &CaptureArgs) -> Result<u8> {
    let duration = args.duration()?;
    args.rules.config()?;
    let (program, program_args) = command.split_first().ok_or_else(|| anyhow!("no command given after `--`"))?;
    let program = find_program(program)?;
    crate::doctor::check_ebpf_capture()?;
    signals::install();

    let library = match &args.libcuda {
        Some(path) => Some(LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?),
        None => libcuda::resolve_for_loader().and_then(|path| LibraryFile::open(path).ok()),
    };
    let destination = args.destination(&gpuprof_views::output::name_of_command(command))?;
    let capture = Capture::load(args.capture_options()?)?;
    let flow = args.flow(&destination)?;
    match &library {
        Some(library) => {
            let attachment = capture.attach_library(library)?;
            eprintln!("gpuprof: probing {} entry points of {}", attachment.probes, library.path.display());
        }
        None => eprintln!(
            "gpuprof: no {} where the dynamic loader looks; probes will be attached when a process of the command maps one {}",
            libcuda::SONAME,
            crate::doctor::SEE_DOCTOR
        ),
    }

    let mut child = spawn_tracked(&capture, &program, program_args)?;
    let session = Session::new(flow).with_ebpf(EbpfSource::new(&capture, args.ebpf_options(), Some(child.id())));
    let mut session = args.watched(session);
    let mut hooks = args.watching(&destination);
    let deadline = duration.map(|d| Instant::now() + d);
    let ended = session.run(Until::CommandExits(&mut child), deadline, &mut hooks)?;
    if let Ended::CommandExited(_) = ended {
        gpuprof_capture::session::leftovers::follow(&mut session, deadline, "command", &mut hooks)?;
    }
    let findings = args.finish(session, &destination)?;
    Ok(args.exit_status(&findings, exit_code(ended, &child)))
}

/// The command's exit code, or 0 when the capture stopped first (said, with where it still runs).
pub(crate) fn exit_code(ended: Ended, child: &Child) -> u8 {
    match ended {
        Ended::CommandExited(status) => match (status.code(), status.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(signal)) => (128 + signal) as u8,
            (None, None) => 1,
        },
        _ => {
            eprintln!("gpuprof: stopped before the command exited; it is still running as pid {}", child.id());
            0
        }
    }
}

/// Starts the command so that it is tracked before its first instruction: the child adds its
/// own pid to the tracked map between fork and exec.
fn spawn_tracked(capture: &Capture, program: &Path, args: &[OsString]) -> Result<Child> {
    let tracked_fd = capture.tracked_map_fd();
    let mut command = Command::new(program);
    command.args(args);
    // SAFETY: the closure runs between fork and exec and only makes raw syscalls
    // (getpid, bpf), which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let pid = libc::getpid() as u32;
            let value = 1u8;
            let rc = libbpf_rs::libbpf_sys::bpf_map_update_elem(
                tracked_fd,
                (&pid as *const u32).cast(),
                (&value as *const u8).cast(),
                0,
            );
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().with_context(|| format!("cannot run `{}`", program.display()))
}

/// The executable a command names, looked up in PATH like a shell would, before anything is
/// loaded into the kernel.
pub(crate) fn find_program(program: &OsString) -> Result<PathBuf> {
    let name = Path::new(program);
    let is_executable =
        |path: &Path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.components().count() > 1 {
        return match std::fs::metadata(name) {
            Ok(_) if is_executable(name) => Ok(name.to_path_buf()),
            Ok(_) => bail!("cannot run `{}`: it is not an executable file", name.display()),
            Err(error) => bail!("cannot run `{}`: {error}", name.display()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| anyhow!("cannot run `{}`: no such command in PATH", name.display()))
}
