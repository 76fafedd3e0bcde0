//! The flags of `gpuprof inject`, and the values of its `--via` and `--capture`.

use std::path::PathBuf;

use clap::Args;

values_of! {
    /// How the workload loads the shim.
    Preload => gpuprof_fleet::inject::Preload {
        /// LD_PRELOAD: PyTorch's allocator (every tensor) and, through CUPTI, the driver's calls.
        LdPreload,
        /// CUDA_INJECTION64_PATH: the driver's calls only (CUDA loads the shim itself).
        CudaInjection,
    }
}

values_of! {
    /// What the sidecar captures with.
    Capture => gpuprof_fleet::inject::Capture {
        /// The shim, preloaded by the workload: no privilege anywhere.
        Shim,
        /// eBPF probes on the pod's processes (shareProcessNamespace): the workload is unchanged;
        /// the sidecar needs root and CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE.
        Ebpf,
    }
}

/// `gpuprof inject` flags.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// The manifests (YAML, one or many documents; `-` or nothing: stdin).
    #[arg(value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Write here instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// These settings, as the chart's ConfigMap `<release>-sidecar` holds them (YAML: image,
    /// imagePullPolicy, collector, otlpProtocol, tokenSecret, port, via, capture); a flag given
    /// here wins over the file.
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// The gpuprof image the sidecar runs (it holds gpuprof and the shim) [default: gpuprof:VERSION].
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Where the sidecar sends OTLP (the collector, or an OpenTelemetry Collector)
    /// [default: http://gpuprof-collector.gpuprof:4317].
    #[arg(long, value_name = "URL")]
    pub collector: Option<String>,
    /// grpc or http [default: grpc].
    #[arg(long, value_name = "PROTOCOL", value_parser = ["grpc", "http"])]
    pub otlp_protocol: Option<String>,
    /// A Secret's key holding the collector's bearer token, as SECRET/KEY.
    #[arg(long, value_name = "SECRET/KEY")]
    pub token_secret: Option<String>,
    /// The containers to profile (repeat the flag; default: those asking for nvidia.com/gpu,
    /// else every container).
    #[arg(short, long = "container", value_name = "NAME")]
    pub containers: Vec<String>,
    /// How the workload loads the shim: ld-preload (allocator and driver events) or
    /// cuda-injection (CUDA_INJECTION64_PATH: driver calls only, for images that forbid
    /// LD_PRELOAD) [default: ld-preload].
    #[arg(long, value_enum)]
    pub via: Option<Preload>,
    /// What the sidecar captures with: shim (the workload preloads it; no privilege at all) or
    /// ebpf (probes on the pod's own processes: shareProcessNamespace, and the sidecar gets
    /// root with CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE; the workload is not changed) [default: shim].
    #[arg(long, value_enum)]
    pub capture: Option<Capture>,
    /// The port of the sidecar's /healthz, /readyz and /metrics (it shares the pod's network)
    /// [default: 9464].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
}

impl From<&InjectArgs> for gpuprof_fleet::inject::InjectRequest {
    fn from(args: &InjectArgs) -> Self {
        gpuprof_fleet::inject::InjectRequest {
            input: args.input.clone(),
            output: args.output.clone(),
            settings: args.settings.clone(),
            image: args.image.clone(),
            collector: args.collector.clone(),
            otlp_protocol: args.otlp_protocol.clone(),
            token_secret: args.token_secret.clone(),
            containers: args.containers.clone(),
            via: args.via.map(Into::into),
            capture: args.capture.map(Into::into),
            port: args.port,
        }
    }
}
