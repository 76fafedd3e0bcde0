//! The page: one HTML file with its styles, scripts (uPlot for the timelines, report.js for the
//! rest), their licenses and the report's data inside, so that it opens offline and from a
//! cluster without a route to any CDN.
//!
//! uPlot 1.6.32 (MIT; vendor/README.md says where it came from and its sha256) is compiled in
//! with `include_str!`: building needs no network and no npm.

use crate::output::text::escape_html;
use std::io::{self, Write};

use super::Report;

const TEMPLATE: &str = include_str!("report.html");
const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");
const UPLOT: &str = include_str!("vendor/uPlot.iife.min.js");
const UPLOT_STYLE: &str = include_str!("vendor/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("vendor/uPlot.LICENSE");

pub(super) fn write(report: &Report, writer: &mut dyn Write) -> io::Result<()> {
    let data = serde_json::to_string(report).map_err(io::Error::other)?;
    let title = format!("gpuprof report: {}", report.input.rsplit('/').next().unwrap_or(&report.input));
    let parts = [
        ("{{TITLE}}", escape_html(&title)),
        ("{{STYLE}}", format!("{UPLOT_STYLE}\n{STYLE}")),
        ("{{UPLOT_LICENSE}}", escape_html(UPLOT_LICENSE)),
        ("{{GENERATOR}}", escape_html(report.generator)),
        // '<' appears in JSON only inside strings, where \u003c means the same: no "</script>"
        // or "<!--" a file name or stack could carry ends the data early.
        ("{{DATA}}", data.replace('<', "\\u003c")),
        ("{{UPLOT}}", UPLOT.to_string()),
        ("{{SCRIPT}}", SCRIPT.to_string()),
    ];
    let mut rest = TEMPLATE;
    while let Some(at) = rest.find("{{") {
        writer.write_all(&rest.as_bytes()[..at])?;
        let (name, text) = parts.iter().find(|(name, _)| rest[at..].starts_with(name)).ok_or_else(|| {
            io::Error::other(format!(
                "report.html names an unknown part at {}",
                &rest[at..at + 20.min(rest.len() - at)]
            ))
        })?;
        writer.write_all(text.as_bytes())?;
        rest = &rest[at + name.len()..];
    }
    writer.write_all(rest.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_script_ends_early() {
        for script in [SCRIPT, UPLOT] {
            assert!(!script.contains("</script"));
            assert!(!script.contains("<!--"));
        }
    }
}
