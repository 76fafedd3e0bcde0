//! `gpuprof`: parse the command line, run the verb, turn any error into one line and a non-zero
//! exit code. The verbs that capture (`attach`, `run`, `top`) are configurations of
//! `gpuprof_capture::session::Session`; `daemon` and `inject` are `gpuprof_fleet`'s; `report`,
//! `summary` and `export` are `gpuprof_views`'; `doctor` says which of the captures this machine
//! can run; `completions` and `man` are made here from the command line's own definition.

use std::process::ExitCode;

mod attach;
mod completions;
mod doctor;
mod flags;
mod man;
mod run;
mod setup;
mod top;

use clap::FromArgMatches;
use flags::{Cli, Command, Via};
use gpuprof_fleet::{daemon, inject};
use gpuprof_views::output::progress;
use gpuprof_views::{export, report};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::from_arg_matches(&flags::command().get_matches()).unwrap_or_else(|error| error.exit());
    let outcome = dispatch(cli.command);
    match outcome {
        Ok(code) => ExitCode::from(code),
        // The reader went away (`gpuprof export … | head`): what it wanted was written.
        Err(error) if reader_went_away(&error) => ExitCode::SUCCESS,
        Err(error) => {
            gpuprof_views::output::live_line::clear();
            eprintln!("gpuprof: error: {error:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs the verb; its exit code.
fn dispatch(command: Command) -> anyhow::Result<u8> {
    // The views read whole recordings, several times for some: a person at a terminal is told
    // how far each pass is; but an export streaming onto that terminal is not drawn over.
    let _progress = match &command {
        Command::Export { output: Some(output), .. }
            if output.as_os_str() == "-" && std::io::IsTerminal::is_terminal(&std::io::stdout()) =>
        {
            None
        }
        Command::Summary { .. } | Command::Report { .. } | Command::Export { .. } | Command::Whatif { .. } => {
            Some(progress::show(None))
        }
        _ => None,
    };
    match command {
        Command::Attach { pid, pid_flag, wait, capture } => {
            attach::attach(pid.or(pid_flag).expect("clap requires one of them"), wait, &capture)
        }
        Command::Run { capture, command, via: Via::Ebpf, .. } => run::run(&command, &capture),
        Command::Run { capture, command, via: Via::Shim, shim } => {
            run::via_shim::run(&command, &capture, shim.as_deref())
        }
        Command::Summary { input, input_flag, pid, top, layer, format, output } => {
            let input = setup::one_input("summary", input, input_flag)?;
            export::summary::run(&export::summary::SummaryRequest {
                input: &input,
                output: output.as_deref(),
                pid,
                layer: layer.into(),
                top,
                format: format.map(Into::into).unwrap_or(if gpuprof_views::output::for_a_person(output.as_deref()) {
                    export::summary::SummaryFormat::Table
                } else {
                    export::summary::SummaryFormat::Json
                }),
            })
        }
        Command::Whatif { whatif: args } => whatif(args),
        Command::Daemon { daemon: args } => daemon::run(args.resolve()?),
        Command::Inject { inject: args } => inject::run(&(&args).into()),
        Command::Top { pid, interval } => top::run(&top::TopArgs { pid, interval }),
        Command::Doctor { format, shim } => {
            let format = format.map(Into::into).unwrap_or(if gpuprof_views::output::for_a_person(None) {
                doctor::DoctorFormat::Table
            } else {
                doctor::DoctorFormat::Json
            });
            doctor::run(format, shim.as_deref())
        }
        Command::Completions { shell } => completions::run(shell),
        Command::Man { dir } => man::run(dir.as_deref()),
        Command::Report { input, input_flag, format, output, rules, fail_on } => {
            let format = format.map(Into::into).unwrap_or(if gpuprof_views::output::for_a_person(output.as_deref()) {
                report::ReportFormat::Table
            } else {
                report::ReportFormat::Json
            });
            let input = setup::one_input("report", input, input_flag)?;
            report::run(&input, format, output.as_deref(), rules.config()?, fail_on.map(Into::into))
        }
        Command::Export {
            input,
            input_flag,
            format,
            output,
            pid,
            peak,
            end,
            at,
            oom,
            layer,
            from,
            to,
            max_entries,
            compress,
        } => {
            let input = setup::one_input("export", input, input_flag)?;
            let (format, layer) = (format.into(), layer.into());
            let moment = export::Moment::chosen(format, peak, end, at, oom);
            let window = export::TraceWindow { from, to, max_entries };
            let compress = compress == flags::Compression::Zstd;
            export::run(&export::ExportRequest { input: &input, format, output, pid, moment, layer, window, compress })
        }
    }
}

fn reader_went_away(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

/// One recording's what-if, or with --scale a plan from several.
fn whatif(args: flags::WhatifArgs) -> anyhow::Result<u8> {
    use gpuprof_views::whatif::{plan, WhatifFormat};
    let format =
        args.format.map(Into::into).unwrap_or(if gpuprof_views::output::for_a_person(args.output.as_deref()) {
            WhatifFormat::Table
        } else {
            WhatifFormat::Json
        });
    if let Some((size, values)) = args.scale {
        if args.suggest || args.pid.is_some() {
            anyhow::bail!(
                "--scale plans every process of the recordings, with the usual settings under --largest: leave --suggest and --pid out"
            );
        }
        let inputs: Vec<std::path::PathBuf> = args.input.into_iter().chain(args.input_flag).collect();
        return plan::run(&plan::PlanRequest {
            inputs: &inputs,
            size,
            values,
            at: args.at,
            largest: args.largest,
            step: args.step,
            settings: args.settings,
            ran_with: args.ran_with,
            device_memory: args.device_memory,
            format: match format {
                WhatifFormat::Table => plan::PlanFormat::Table,
                WhatifFormat::Json => plan::PlanFormat::Json,
                WhatifFormat::Html => plan::PlanFormat::Html,
            },
            output: args.output.as_deref(),
        });
    }
    let input = setup::one_input("whatif", args.input, args.input_flag)?;
    gpuprof_views::whatif::run(&gpuprof_views::whatif::WhatifRequest {
        input: &input,
        output: args.output.as_deref(),
        pid: args.pid,
        settings: args.settings,
        ran_with: args.ran_with,
        device_memory: args.device_memory,
        suggest: args.suggest,
        smallest_device: args.suggest,
        format,
    })
}
