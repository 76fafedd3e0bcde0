//! `gpuprof inject`: Kubernetes manifests in, the same manifests out with gpuprof's sidecar
//! added to every pod template (as `linkerd inject` does): a native sidecar (an init container
//! with `restartPolicy: Always`, Kubernetes 1.29 and later) running `gpuprof daemon --sidecar`,
//! an `emptyDir` it shares with the workload containers, and in those containers the shim
//! preloaded from it with the socket path beside it (docs/deploy.md, "Sidecar").
//!
//! Documents without a pod template (Services, ConfigMaps…) pass through unchanged; a pod
//! template already injected is left as it is (running it twice changes nothing); what cannot be
//! patched safely is refused with the document and the reason, and nothing is written.

mod pod;
mod workloads;
mod yaml11;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use yaml_rust2::{Yaml, YamlEmitter};

pub(crate) use pod::SidecarSettings;
pub use pod::{Capture, Preload};

/// What `gpuprof inject` is asked: the manifests, where they go, and the sidecar's settings
/// given on the command line (each wins over `settings`, the chart's file).
#[derive(Debug, Default)]
pub struct InjectRequest {
    /// The manifests (`-` or None: stdin).
    pub input: Option<PathBuf>,
    /// None: stdout.
    pub output: Option<PathBuf>,
    /// The chart's ConfigMap `<release>-sidecar` (YAML: image, imagePullPolicy, collector,
    /// otlpProtocol, tokenSecret, port, via, capture).
    pub settings: Option<PathBuf>,
    pub image: Option<String>,
    pub collector: Option<String>,
    /// grpc or http.
    pub otlp_protocol: Option<String>,
    /// SECRET/KEY.
    pub token_secret: Option<String>,
    /// The containers to profile (none: those asking for a GPU, else every container).
    pub containers: Vec<String>,
    pub via: Option<Preload>,
    pub capture: Option<Capture>,
    pub port: Option<u16>,
}

/// Said when the sidecars get no token: the chart's collector always asks for one.
const NO_TOKEN: &str = "warning: the sidecars send no bearer token (no --token-secret, no tokenSecret in --settings), and a collector that asks for one (the Helm chart's always does) refuses them: give --token-secret SECRET/KEY (the chart's Secret: <release>-token/token, or auth.existingSecret/token), or --settings with the chart's <release>-sidecar ConfigMap";

/// Returns gpuprof's exit code.
pub fn run(args: &InjectRequest) -> Result<u8> {
    let settings = SidecarSettings::from_request(args)?;
    let input = args.input.as_deref().filter(|p| *p != Path::new("-"));
    let text = read_input(input)?;
    let name = input.map_or_else(|| "stdin".to_string(), |p| p.display().to_string());
    let (output, report) = inject(&text, &settings).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    let mut writer = gpuprof_views::output::open_writer(args.output.as_deref())?;
    writer.write_all(output.as_bytes()).and_then(|_| writer.flush()).context("cannot write the manifests")?;
    eprintln!("gpuprof: {report}");
    if settings.token.is_none() && !report.injected.is_empty() {
        eprintln!("gpuprof: {NO_TOKEN}");
    }
    Ok(0)
}

fn read_input(input: Option<&Path>) -> Result<String> {
    let mut text = String::new();
    match input {
        Some(path) => {
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_string(&mut text))
                .with_context(|| format!("cannot read {}", path.display()))?;
        }
        None => {
            std::io::stdin().read_to_string(&mut text).context("cannot read the manifests from stdin")?;
        }
    }
    Ok(text)
}

/// What happened to the documents, for the one line on stderr.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    pub injected: Vec<String>,
    pub already: Vec<String>,
    pub passed: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |names: &[String]| if names.is_empty() { "none".to_string() } else { names.join(", ") };
        write!(
            f,
            "injected {}; already injected {}; no pod template (unchanged) {}",
            list(&self.injected),
            list(&self.already),
            list(&self.passed)
        )
    }
}

/// The manifests with the sidecar added, and what was done to each.
pub(crate) fn inject(text: &str, settings: &SidecarSettings) -> Result<(String, Report)> {
    let documents = yaml11::load(text).map_err(|e| anyhow::anyhow!("not YAML: {e}"))?;
    let mut report = Report::default();
    let mut out = String::new();
    for (index, mut document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let what = workloads::describe(&document, index + 1);
        let outcome =
            workloads::patch(&mut document, settings).map_err(|e| anyhow::anyhow!("{what}: cannot inject: {e}"))?;
        let mut emitted = String::new();
        YamlEmitter::new(&mut emitted)
            .dump(&document)
            .map_err(|e| anyhow::anyhow!("{what}: cannot write it back: {e}"))?;
        match outcome {
            pod::Outcome::Injected => report.injected.push(what),
            pod::Outcome::Already => report.already.push(what),
            pod::Outcome::NoPodTemplate => report.passed.push(what),
        }
        out.push_str(&emitted);
        out.push('\n');
    }
    if out.is_empty() {
        bail!("no document in the input: give a Pod, Job, Deployment, StatefulSet or PyTorchJob manifest");
    }
    Ok((out, report))
}

/// `Yaml` keys and lookups by name.
pub(crate) fn key(name: &str) -> Yaml {
    Yaml::String(name.to_string())
}
