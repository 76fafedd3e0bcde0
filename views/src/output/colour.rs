//! Colour for people: findings' severity stands out on a terminal. Off in files and pipes, and
//! wherever `NO_COLOR` is set (no-color.org) or the terminal is `dumb`; lines drawn in place on
//! stderr (`live_line::drawn_on_stderr`) follow the same rule.

use std::io::IsTerminal;

use gpuprof_model::Severity;

/// Whether text for a stream gets colour.
pub(crate) fn wanted(stream_is_terminal: bool) -> bool {
    stream_is_terminal
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
}

pub(crate) fn on_stderr() -> bool {
    wanted(std::io::stderr().is_terminal())
}

pub fn on_stdout() -> bool {
    wanted(std::io::stdout().is_terminal())
}

/// `text` in the colour of `severity` (bold red for leaks, cyan for facts), or as it is.
pub(crate) fn severity(text: &str, severity: Severity, on: bool) -> String {
    if !on {
        return text.to_string();
    }
    let style = match severity {
        Severity::Leak => "\x1b[1;31m",
        Severity::Info => "\x1b[36m",
    };
    format!("{style}{text}\x1b[0m")
}
