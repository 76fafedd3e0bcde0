//! `gpuprof run --via shim -- CMD…`: capture without eBPF and without privileges. The command
//! runs with gpuprof's shim preloaded (`LD_PRELOAD`, inherited by every descendant); each of its
//! processes connects to a Unix socket this run listens on and sends its events (a binary stream,
//! `gpuprof_model::shim::wire`), at the level `--level` asks for. They go
//! through the same flow as eBPF events (tracker, leak rules, output, OTLP). A process that goes
//! away without saying so (`os._exit` in a forked worker) is closed out when its connection ends.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use gpuprof_model::shim;

use super::{exit_code, find_program};
use crate::flags::CaptureArgs;
use gpuprof_capture::session::{Session, ShimSource, Until};
use gpuprof_capture::{shim_socket, signals};

/// The shim's file name, looked for next to the gpuprof executable.
/// How long the end of the run waits for the command's processes to hang up.
const LAST_WORDS: Duration = Duration::from_secs(3);
const LAST_WORDS_POLL: Duration = Duration::from_millis(50);

/// Returns CMD's exit code.
pub fn run(command: &[OsString], args: &CaptureArgs, shim: Option<&Path>) -> Result<u8> {
    let duration = args.duration()?;
    let shim = gpuprof_capture::shim_library::find(shim)?;
    let (program, program_args) = command.split_first().ok_or_else(|| anyhow!("no command given after `--`"))?;
    let program = find_program(program)?;
    signals::install();

    let dir = socket_dir()?;
    let socket = dir.join("shim.sock");
    let received = shim_socket::listen(&socket, shim_socket::SocketAccess::PRIVATE)?;

    let destination = args.destination(&gpuprof_views::output::name_of_command(command))?;
    let session = Session::new(args.flow(&destination)?).with_shim(ShimSource::new(received, true));
    let mut session = args.watched(session);
    let mut hooks = args.watching(&destination);
    let mut child = Command::new(&program)
        .args(program_args)
        .env("LD_PRELOAD", preload_with(&shim))
        .env(shim::SOCKET_VAR, &socket)
        .envs((args.no_autograd || args.no_stacks).then_some((shim::AUTOGRAD_VAR, "off")))
        .env(shim::LEVEL_VAR, args.level.as_str())
        .spawn()
        .with_context(|| format!("cannot run `{}`", program.display()))?;
    eprintln!("gpuprof: capturing `{}` through {} (no eBPF)", program.display(), shim.display());

    let deadline = duration.map(|d| Instant::now() + d);
    let ended = session.run(Until::CommandExits(&mut child), deadline, &mut hooks)?;
    // The command's processes send what they still hold as they exit; signals wait (a Ctrl-C
    // that ended the command must not cut its workers' last words short).
    let waited = Instant::now();
    while session.shim().is_some_and(|s| s.processes().open() > 0) && waited.elapsed() < LAST_WORDS {
        session.pump(LAST_WORDS_POLL)?;
    }
    session.pump(Duration::ZERO)?;
    let _ = std::fs::remove_dir_all(&dir);
    let findings = args.finish(session, &destination)?;
    Ok(args.exit_status(&findings, exit_code(ended, &child)))
}

/// `--shim`, else next to the gpuprof executable (a cargo build), else in `../lib/gpuprof/` from
/// it (where the wheel installs it: `<prefix>/bin/gpuprof`, `<prefix>/lib/gpuprof/`; docs/install.md).
/// LD_PRELOAD with the shim first and what the environment already preloads after it.
fn preload_with(shim: &Path) -> OsString {
    let mut preload = shim.as_os_str().to_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(OsStr::new(":"));
        preload.push(existing);
    }
    preload
}

/// A private directory for the socket: under $XDG_RUNTIME_DIR when there is one.
fn socket_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("gpuprof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
