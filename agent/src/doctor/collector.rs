//! The collector a daemon started here would send to: its `GPUPROF_*` settings and config file
//! resolved as `gpuprof daemon` resolves them. Said, not connected to: gpuprof has no cheap way
//! to tell a collector from another OTLP receiver without sending it something.

use super::Check;
use crate::flags::DaemonArgs;

/// Often set for other OpenTelemetry programs, and not read by gpuprof: said when it is, so that
/// nobody takes it for gpuprof's.
const OTEL_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

pub(super) fn check() -> Check {
    let endpoint = DaemonArgs::from_environment()
        .map_err(|error| error.to_string().lines().next().unwrap_or_default().to_string())
        .and_then(|args| args.endpoint().map_err(|error| format!("{error:#}")));
    match endpoint {
        Ok(Some((url, said_by))) => Check::ok("collector", format!("{url}, from {said_by} (not contacted)")),
        Ok(None) => {
            let otel = std::env::var(OTEL_ENDPOINT)
                .map(|url| format!("; {OTEL_ENDPOINT} ({url}) is not read by gpuprof"))
                .unwrap_or_default();
            Check::not_applicable(
                "collector",
                format!(
                    "none configured (the daemon's GPUPROF_OTLP_ENDPOINT or otlp_endpoint in its config file; `run --otlp-endpoint URL`){otel}"
                ),
            )
        }
        Err(error) => Check::fail("collector", error, "correct the daemon's setting it names"),
    }
}
