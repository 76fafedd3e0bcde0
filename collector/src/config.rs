//! The collector's one typed configuration: flags, each with an environment variable, and
//! defaults that run with nothing set (loopback only, state in the working directory).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "gpuprof-collector",
    version,
    about = "Receives OTLP from gpuprof agents, flags GPU memory leaks per node, serves findings"
)]
pub struct Args {
    /// OTLP/gRPC listen address.
    #[arg(long, env = "GPUPROF_COLLECTOR_GRPC", default_value = "127.0.0.1:4317")]
    pub grpc_listen: SocketAddr,
    /// OTLP/HTTP, findings API and Prometheus /metrics listen address.
    #[arg(long, env = "GPUPROF_COLLECTOR_HTTP", default_value = "127.0.0.1:4318")]
    pub http_listen: SocketAddr,
    /// The embedded database (created if missing): findings and each node's open allocations.
    #[arg(long, env = "GPUPROF_COLLECTOR_DB", default_value = "gpuprof-collector.redb")]
    pub db: PathBuf,
    /// Bearer token agents must send. Required unless both listen addresses are loopback.
    #[arg(long, env = "GPUPROF_COLLECTOR_TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// Read the bearer token from this file (a mounted secret).
    #[arg(long, env = "GPUPROF_COLLECTOR_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Bearer token readers must send for the findings, processes and profile API and /metrics
    /// (they show stacks with file paths and command names); separate from the agents' token.
    /// /healthz stays open. Without one, whoever reaches --http-listen may read.
    #[arg(long, env = "GPUPROF_COLLECTOR_READ_TOKEN", hide_env_values = true, conflicts_with = "read_token_file")]
    pub read_token: Option<String>,
    /// Read the readers' bearer token from this file (a mounted secret).
    #[arg(long, env = "GPUPROF_COLLECTOR_READ_TOKEN_FILE")]
    pub read_token_file: Option<PathBuf>,
    /// Largest OTLP request accepted, in MiB (larger: HTTP 413 / gRPC OUT_OF_RANGE).
    #[arg(long, env = "GPUPROF_COLLECTOR_MAX_REQUEST_MIB", default_value_t = 16)]
    pub max_request_mib: usize,
    /// OTLP requests per second one connection may make (burst: twice that); beyond it,
    /// HTTP 429 / gRPC RESOURCE_EXHAUSTED, which agents retry.
    #[arg(long, env = "GPUPROF_COLLECTOR_RATE_LIMIT", default_value_t = 1000.0)]
    pub rate_limit: f64,
    /// Forward spans (the agents' and one per finding) over OTLP/HTTP to this endpoint: Jaeger,
    /// Tempo or an OpenTelemetry Collector, e.g. http://jaeger:4318.
    #[arg(long, env = "GPUPROF_COLLECTOR_FORWARD")]
    pub forward_endpoint: Option<String>,
    /// Keep findings and exited processes this many hours.
    #[arg(long, env = "GPUPROF_COLLECTOR_RETENTION_HOURS", default_value_t = 168.0)]
    pub retention_hours: f64,
    /// Keep at most this many findings (the oldest go first).
    #[arg(long, env = "GPUPROF_COLLECTOR_MAX_FINDINGS", default_value_t = 100_000)]
    pub max_findings: usize,
    /// MiB of post-mortems' reports kept (gzipped; the oldest go first), for
    /// /api/v1/findings/{id}/report; kept no longer than findings (--retention-hours).
    #[arg(long, env = "GPUPROF_COLLECTOR_MAX_REPORT_MIB", default_value_t = 1024)]
    pub max_report_mib: u64,
    /// Save each node's state to the database this often (and at shutdown).
    #[arg(long, env = "GPUPROF_COLLECTOR_CHECKPOINT_SECS", default_value_t = 5.0)]
    pub checkpoint_secs: f64,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub db: PathBuf,
    pub token: Option<String>,
    pub read_token: Option<String>,
    pub max_request_bytes: usize,
    pub rate_limit: f64,
    pub forward_endpoint: Option<String>,
    pub retention: Duration,
    pub max_findings: usize,
    /// Bytes of post-mortems' reports kept at most (gzipped).
    pub max_report_bytes: u64,
    pub checkpoint_every: Duration,
}

impl Args {
    pub fn config(self) -> Result<Config> {
        let token = token_of(self.token.as_deref(), self.token_file.as_deref(), "--token")?;
        let read_token = token_of(self.read_token.as_deref(), self.read_token_file.as_deref(), "--read-token")?;
        if read_token.is_some() && read_token == token {
            bail!("--read-token is the agents' --token: give readers a token of their own, so that an agent's cannot read and a reader's cannot write");
        }
        for (flag, addr) in [("--grpc-listen", self.grpc_listen), ("--http-listen", self.http_listen)] {
            if token.is_none() && !addr.ip().is_loopback() {
                bail!("{flag} {addr} is reachable from other machines but no token is set: give --token-file (or GPUPROF_COLLECTOR_TOKEN), or listen on 127.0.0.1");
            }
        }
        if let Some(endpoint) = &self.forward_endpoint {
            if !endpoint.starts_with("http://") {
                bail!("--forward-endpoint {endpoint}: give an http:// OTLP/HTTP endpoint such as http://jaeger:4318");
            }
        }
        let positive = |flag: &str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                bail!("{flag} {value}: give a positive number")
            }
        };
        // Converting more seconds than a Duration holds would panic; a century is plenty.
        let duration = |flag: &str, value: f64, seconds_each: f64| -> Result<Duration> {
            let value = positive(flag, value)?;
            gpuprof_model::seconds::positive_seconds(value * seconds_each)
                .map_err(|_| anyhow::anyhow!("{flag} {value}: too long: give at most a century"))
        };
        if self.max_request_mib == 0 {
            bail!("--max-request-mib 0: give at least 1");
        }
        Ok(Config {
            grpc_listen: self.grpc_listen,
            http_listen: self.http_listen,
            db: self.db,
            token,
            read_token,
            max_request_bytes: self.max_request_mib << 20,
            rate_limit: positive("--rate-limit", self.rate_limit)?,
            forward_endpoint: self.forward_endpoint,
            retention: duration("--retention-hours", self.retention_hours, 3600.0)?,
            max_findings: self.max_findings.max(1),
            max_report_bytes: self.max_report_mib << 20,
            checkpoint_every: duration("--checkpoint-secs", self.checkpoint_secs, 1.0)?,
        })
    }
}

/// A bearer token given as a value or in a file (`flag` and `flag-file`); empty is refused.
fn token_of(value: Option<&str>, file: Option<&std::path::Path>, flag: &str) -> Result<Option<String>> {
    let token = match (value, file) {
        (Some(token), _) => Some(token.to_string()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("{flag}-file {}: cannot read it", path.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        bail!("the bearer token is empty: give a non-empty {flag} or {flag}-file");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(args: &[&str]) -> String {
        let args = Args::try_parse_from(std::iter::once("gpuprof-collector").chain(args.iter().copied())).unwrap();
        args.config().unwrap_err().to_string()
    }

    /// Converting more seconds than a Duration holds panicked; a century is the most taken.
    #[test]
    fn seconds_beyond_a_century_are_refused_naming_the_flag() {
        assert_eq!(
            refusal(&["--retention-hours", "1e300"]),
            format!("--retention-hours {}: too long: give at most a century", 1e300)
        );
        assert_eq!(
            refusal(&["--checkpoint-secs", "1e19"]),
            "--checkpoint-secs 10000000000000000000: too long: give at most a century"
        );
        assert_eq!(refusal(&["--checkpoint-secs", "0"]), "--checkpoint-secs 0: give a positive number");
    }
}
