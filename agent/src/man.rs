//! `gpuprof man`: the manual pages, made from the command line's own definition (`flags`), so
//! they say what `--help` says: gpuprof.1 on stdout, or gpuprof.1 and gpuprof-VERB.1 for every
//! verb written into a folder (`--dir`), as packagers install them under share/man/man1.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap_mangen::Man;

use crate::flags;

/// The exit code.
pub fn run(dir: Option<&Path>) -> anyhow::Result<u8> {
    // `gpuprof help VERB` is --help again: no page of its own.
    let mut command = flags::definition().disable_help_subcommand(true);
    command.build();
    let Some(dir) = dir else {
        let mut page = Vec::new();
        man(&command, &command).render(&mut page)?;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&page).and_then(|()| stdout.flush()).context("cannot write the man page to stdout")?;
        return Ok(0);
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create {}: give --dir a folder you can write", dir.display()))?;
    let mut written: Vec<PathBuf> = Vec::new();
    for page in std::iter::once(&command).chain(command.get_subcommands()) {
        let path = man(&command, page)
            .generate_to(dir)
            .with_context(|| format!("cannot write the man page of {} into {}", page.get_name(), dir.display()))?;
        written.push(path);
    }
    eprintln!(
        "gpuprof: wrote {} man pages to {} (gpuprof.1 and gpuprof-VERB.1); read one with `man -l {}`, or install them under share/man/man1",
        written.len(),
        dir.display(),
        written[0].display()
    );
    Ok(0)
}

/// The page of `page` (gpuprof itself or one of its verbs), its footer naming gpuprof's version.
fn man(gpuprof: &clap::Command, page: &clap::Command) -> Man {
    let version = gpuprof.get_version().unwrap_or_default();
    Man::new(page.clone()).source(format!("gpuprof {version}")).manual("gpuprof manual")
}
