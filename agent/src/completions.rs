//! `gpuprof completions SHELL`: the shell's completion script, made from the command line's own
//! definition (`flags`), so it completes every verb, flag and value `--help` names.

use std::io::Write;

use anyhow::Context;
use clap_complete::Shell;

use crate::flags;

/// Writes the script to stdout; the exit code.
pub fn run(shell: Shell) -> anyhow::Result<u8> {
    let mut command = flags::definition();
    // Made whole first: clap_complete panics on a write that fails (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "gpuprof", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("cannot write the completion script to stdout")?;
    Ok(0)
}
