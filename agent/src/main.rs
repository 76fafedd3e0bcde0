//! `gpuprof`: parse the command line, run the verb, turn any error into one line and a non-zero
//! exit code.

use std::process::ExitCode;

use clap::FromArgMatches;
use gpuprof::cli::{Cli, Command, Via};
use gpuprof::{attach, cli, daemon, export, report, run, top};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::from_arg_matches(&cli::command().get_matches()).unwrap_or_else(|error| error.exit());
    let outcome = dispatch(cli.command);
    match outcome {
        Ok(code) => ExitCode::from(code),
        // The reader went away (`gpuprof export … | head`): what it wanted was written.
        Err(error) if reader_went_away(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gpuprof: error: {error:#}");
            ExitCode::from(1)
        }
    }
}

/// Runs the verb; its exit code.
fn dispatch(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Attach { pid, pid_flag, wait, capture } => {
            attach::attach(pid.or(pid_flag).expect("clap requires one of them"), wait, &capture)
        }
        Command::Run { capture, command, via: Via::Ebpf, .. } => run::run(&command, &capture),
        Command::Run { capture, command, via: Via::Shim, shim } => {
            run::via_shim::run(&command, &capture, shim.as_deref())
        }
        Command::Summary { input, input_flag, pid, top, layer, format, output } => {
            let input = cli::one_input("summary", input, input_flag)?;
            export::summary::run(&export::summary::SummaryRequest {
                input: &input,
                output: output.as_deref(),
                pid,
                layer,
                top,
                format: format.unwrap_or(if cli::for_a_person(output.as_deref()) {
                    export::summary::SummaryFormat::Table
                } else {
                    export::summary::SummaryFormat::Json
                }),
            })
        }
        Command::Daemon { daemon: args } => daemon::run(&args),
        Command::Inject { inject } => gpuprof::inject::run(&inject),
        Command::Top { pid, interval } => top::run(&top::TopArgs { pid, interval }),
        Command::Report { input, input_flag, format, output, rules } => {
            let format = format.unwrap_or(if cli::for_a_person(output.as_deref()) {
                cli::ReportFormat::Table
            } else {
                cli::ReportFormat::Json
            });
            report::run(&cli::one_input("report", input, input_flag)?, format, output.as_deref(), &rules)
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
            let input = cli::one_input("export", input, input_flag)?;
            let moment = match (peak, end, at, oom) {
                (true, ..) => export::Moment::Peak,
                (_, true, ..) => export::Moment::End,
                (_, _, Some(secs), _) => export::Moment::At(secs),
                (_, _, None, Some(n)) => export::Moment::Oom(n as usize),
                _ if format == export::ExportFormat::MemoryViz => export::Moment::End,
                _ => export::Moment::Peak,
            };
            let window = export::TraceWindow { from, to, max_entries };
            let compress = compress == gpuprof::cli::Compression::Zstd;
            export::run(&export::ExportRequest { input: &input, format, output, pid, moment, layer, window, compress })
        }
    }
}

fn reader_went_away(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}
