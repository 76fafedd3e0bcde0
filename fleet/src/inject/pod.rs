//! One pod spec patched: the shared volume, the sidecar first among the init containers, and in
//! each profiled container the shim preloaded from the volume and the socket's path.

use anyhow::{bail, Result};
use yaml_rust2::yaml::Hash;
use yaml_rust2::Yaml;

use gpuprof_model::{job, shim};

use super::key;

/// What became of a document (or a pod template).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Injected,
    /// The sidecar was there already: left as it was.
    Already,
    /// Nothing that runs pods (a Service, a ConfigMap…): passed through.
    NoPodTemplate,
}

/// The sidecar's container name and the shared volume's.
pub(crate) const SIDECAR_NAME: &str = "gpuprof";
/// Where the volume is mounted, in the sidecar and in the workload.
pub(crate) const MOUNT: &str = "/gpuprof";
pub(crate) const DEFAULT_IMAGE: &str = concat!("gpuprof:", env!("CARGO_PKG_VERSION"));
/// The chart's collector, released as `gpuprof` in the namespace `gpuprof`.
pub(crate) const DEFAULT_COLLECTOR: &str = "http://gpuprof-collector.gpuprof:4317";
pub(crate) const DEFAULT_PORT: u16 = 9464;

/// How the workload loads the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preload {
    /// LD_PRELOAD: PyTorch's allocator (every tensor) and, through CUPTI, the driver's calls.
    LdPreload,
    /// CUDA_INJECTION64_PATH: the driver's calls only (CUDA loads the shim itself).
    CudaInjection,
}

/// What the sidecar captures with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// The shim, preloaded by the workload: no privilege anywhere.
    Shim,
    /// eBPF probes on the pod's processes (shareProcessNamespace): the workload is unchanged;
    /// the sidecar needs root and CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE.
    Ebpf,
}

impl std::str::FromStr for Preload {
    type Err = ();

    /// The names `--via` and the settings' `via` take.
    fn from_str(text: &str) -> Result<Preload, ()> {
        match text {
            "ld-preload" => Ok(Preload::LdPreload),
            "cuda-injection" => Ok(Preload::CudaInjection),
            _ => Err(()),
        }
    }
}

impl std::str::FromStr for Capture {
    type Err = ();

    /// The names `--capture` and the settings' `capture` take.
    fn from_str(text: &str) -> Result<Capture, ()> {
        match text {
            "shim" => Ok(Capture::Shim),
            "ebpf" => Ok(Capture::Ebpf),
            _ => Err(()),
        }
    }
}

/// What the sidecar is made of.
#[derive(Debug, Clone)]
pub(crate) struct SidecarSettings {
    pub image: String,
    pub pull_policy: String,
    pub collector: String,
    pub protocol: String,
    /// (Secret, key) of the collector's bearer token.
    pub token: Option<(String, String)>,
    pub containers: Vec<String>,
    pub via: Preload,
    pub capture: Capture,
    pub port: u16,
}

impl SidecarSettings {
    pub(crate) fn from_request(args: &super::InjectRequest) -> Result<SidecarSettings> {
        let file = match &args.settings {
            Some(path) => SettingsFile::read(path)?,
            None => SettingsFile::default(),
        };
        let token_text = args.token_secret.clone().or(file.token_secret);
        let token = match &token_text {
            Some(text) => match text.split_once('/') {
                Some((secret, key)) if !secret.is_empty() && !key.is_empty() => {
                    Some((secret.to_string(), key.to_string()))
                }
                _ => bail!("token secret {text}: give the Secret and its key as SECRET/KEY"),
            },
            None => None,
        };
        let port = args.port.or(file.port).unwrap_or(DEFAULT_PORT);
        if port == 0 {
            bail!("port 0: give the port the sidecar's health endpoints listen on (e.g. 9464)");
        }
        let protocol = args.otlp_protocol.clone().or(file.protocol).unwrap_or_else(|| "grpc".to_string());
        if protocol != "grpc" && protocol != "http" {
            bail!("otlpProtocol {protocol}: give grpc or http");
        }
        Ok(SidecarSettings {
            image: args.image.clone().or(file.image).unwrap_or_else(|| DEFAULT_IMAGE.to_string()),
            pull_policy: file.pull_policy.unwrap_or_else(|| "IfNotPresent".to_string()),
            collector: args.collector.clone().or(file.collector).unwrap_or_else(|| DEFAULT_COLLECTOR.to_string()),
            protocol,
            token,
            containers: args.containers.clone(),
            via: args.via.or(file.via).unwrap_or(Preload::LdPreload),
            capture: args.capture.or(file.capture).unwrap_or(Capture::Shim),
            port,
        })
    }

    fn shim_path(&self) -> String {
        format!("{MOUNT}/{}", gpuprof_capture::shim_library::LIBRARY_FILE)
    }
}

/// `--settings`: the chart's ConfigMap `<release>-sidecar`, key `settings.yaml`.
#[derive(Debug, Default)]
struct SettingsFile {
    image: Option<String>,
    pull_policy: Option<String>,
    collector: Option<String>,
    protocol: Option<String>,
    token_secret: Option<String>,
    port: Option<u16>,
    via: Option<Preload>,
    capture: Option<Capture>,
}

impl SettingsFile {
    fn read(path: &std::path::Path) -> Result<SettingsFile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the settings {}: {e}", path.display()))?;
        let documents = yaml_rust2::YamlLoader::load_from_str(&text)
            .map_err(|e| anyhow::anyhow!("the settings {} are not YAML: {e}", path.display()))?;
        let Some(Yaml::Hash(map)) = documents.into_iter().next() else {
            bail!(
                "the settings {} are not a mapping: give image, collector, otlpProtocol, tokenSecret, port, via",
                path.display()
            )
        };
        let mut file = SettingsFile::default();
        for (name, value) in map {
            let name = name.as_str().unwrap_or("").to_string();
            let text = || match &value {
                Yaml::String(s) => Ok(s.clone()),
                Yaml::Integer(i) => Ok(i.to_string()),
                _ => Err(anyhow::anyhow!("the settings {}: {name} is not a string", path.display())),
            };
            match name.as_str() {
                "image" => file.image = Some(text()?).filter(|s| !s.is_empty()),
                "imagePullPolicy" => file.pull_policy = Some(text()?).filter(|s| !s.is_empty()),
                "collector" => file.collector = Some(text()?).filter(|s| !s.is_empty()),
                "otlpProtocol" => file.protocol = Some(text()?),
                "tokenSecret" => file.token_secret = Some(text()?).filter(|s| !s.is_empty()),
                "port" => file.port = Some(text()?.parse().map_err(|_| anyhow::anyhow!("the settings {}: port is not a port number", path.display()))?),
                "via" => file.via = Some(text()?.parse::<Preload>().map_err(|_| anyhow::anyhow!("the settings {}: via is ld-preload or cuda-injection", path.display()))?),
                "capture" => file.capture = Some(text()?.parse::<Capture>().map_err(|_| anyhow::anyhow!("the settings {}: capture is shim or ebpf", path.display()))?),
                _ => bail!("the settings {}: {name} is not a setting (image, imagePullPolicy, collector, otlpProtocol, tokenSecret, port, via, capture)", path.display()),
            }
        }
        Ok(file)
    }
}

fn string(text: &str) -> Yaml {
    Yaml::String(text.to_string())
}

fn hash(entries: Vec<(&str, Yaml)>) -> Yaml {
    let mut map = Hash::new();
    for (name, value) in entries {
        map.insert(key(name), value);
    }
    Yaml::Hash(map)
}

fn name_of(item: &Yaml) -> Option<&str> {
    item["name"].as_str()
}

/// The array under `name`, made if missing; an error if it is something else.
fn array_at<'a>(map: &'a mut Hash, name: &str, what: &str) -> Result<&'a mut Vec<Yaml>> {
    let entry = map.entry(key(name)).or_insert(Yaml::Array(Vec::new()));
    if entry.is_null() {
        *entry = Yaml::Array(Vec::new());
    }
    match entry {
        Yaml::Array(items) => Ok(items),
        _ => bail!("its {what}.{name} is not a list"),
    }
}

fn field(name: &str, path: &str) -> Yaml {
    hash(vec![("name", string(name)), ("valueFrom", hash(vec![("fieldRef", hash(vec![("fieldPath", string(path))]))]))])
}

fn literal(name: &str, value: &str) -> Yaml {
    hash(vec![("name", string(name)), ("value", string(value))])
}

/// Adds the sidecar to `spec` (a pod spec).
pub(crate) fn patch(spec: &mut Yaml, settings: &SidecarSettings) -> Result<Outcome> {
    let Yaml::Hash(spec) = spec else { bail!("its pod spec is not a mapping") };
    let init = spec.get(&key("initContainers")).and_then(Yaml::as_vec).cloned().unwrap_or_default();
    if init.iter().any(|c| name_of(c) == Some(SIDECAR_NAME)) {
        return Ok(Outcome::Already);
    }
    let containers: Vec<Yaml> = spec.get(&key("containers")).and_then(Yaml::as_vec).cloned().unwrap_or_default();
    if containers.is_empty() {
        bail!("its pod spec has no containers");
    }
    let names: Vec<&str> = containers.iter().filter_map(name_of).collect();
    if names.contains(&SIDECAR_NAME) {
        bail!("it already has a container named {SIDECAR_NAME}, not gpuprof's sidecar: rename that container");
    }
    let targets: Vec<String> = if settings.containers.is_empty() {
        let gpu: Vec<String> =
            containers.iter().filter(|c| asks_for_gpu(c)).filter_map(name_of).map(str::to_string).collect();
        if gpu.is_empty() {
            names.iter().map(|n| n.to_string()).collect()
        } else {
            gpu
        }
    } else {
        for wanted in &settings.containers {
            if !names.contains(&wanted.as_str()) {
                bail!("it has no container named {wanted} (it has {}): check --container", names.join(", "));
            }
        }
        settings.containers.clone()
    };
    if settings.capture == Capture::Ebpf {
        if let Some(Yaml::Boolean(true)) = spec.get(&key("hostPID")) {
            bail!("it runs in the host's pid namespace (hostPID): an eBPF sidecar would see the node's processes; use the shim (--capture shim) or the node daemon");
        }
    }
    // eBPF: the sidecar sees the pod's processes, by their pids in the pod. The shim in several
    // containers: one pid namespace for them, or their pids would collide at the sidecar.
    if settings.capture == Capture::Ebpf || targets.len() > 1 {
        spec.insert(key("shareProcessNamespace"), Yaml::Boolean(true));
    }
    let volumes = array_at(spec, "volumes", "pod spec")?;
    if volumes.iter().any(|v| name_of(v) == Some(SIDECAR_NAME)) {
        bail!("it already has a volume named {SIDECAR_NAME} that is not gpuprof's: rename that volume");
    }
    volumes.push(hash(vec![("name", string(SIDECAR_NAME)), ("emptyDir", Yaml::Hash(Hash::new()))]));

    let Some(Yaml::Array(containers)) = spec.get_mut(&key("containers")) else { unreachable!("checked above") };
    // With eBPF the workload is left as it is.
    if settings.capture == Capture::Shim {
        for container in containers.iter_mut().filter(|c| name_of(c).is_some_and(|n| targets.iter().any(|t| t == n))) {
            patch_container(container, settings)?;
        }
    }
    let sidecar = sidecar(settings, &targets);
    array_at(spec, "initContainers", "pod spec")?.insert(0, sidecar);
    Ok(Outcome::Injected)
}

/// `resources.limits` (or requests) names a GPU: nvidia.com/gpu, or another vendor's `…/gpu`.
fn asks_for_gpu(container: &Yaml) -> bool {
    ["limits", "requests"].iter().any(|which| match &container["resources"][*which] {
        Yaml::Hash(map) => map.keys().filter_map(Yaml::as_str).any(|k| k.ends_with("/gpu")),
        _ => false,
    })
}

fn patch_container(container: &mut Yaml, settings: &SidecarSettings) -> Result<()> {
    let name = name_of(container).unwrap_or("?").to_string();
    let Yaml::Hash(map) = container else { bail!("container {name} is not a mapping") };
    let env = array_at(map, "env", &format!("container {name}"))?;
    let variable = match settings.via {
        Preload::LdPreload => "LD_PRELOAD",
        Preload::CudaInjection => "CUDA_INJECTION64_PATH",
    };
    let shim = settings.shim_path();
    // LD_PRELOAD composes (the shim goes first); CUDA loads one injection library only.
    let taken: &[&str] = match settings.via {
        Preload::LdPreload => &[shim::SOCKET_VAR],
        Preload::CudaInjection => &[shim::SOCKET_VAR, "CUDA_INJECTION64_PATH"],
    };
    for &taken in taken {
        if env.iter().any(|e| name_of(e) == Some(taken)) {
            bail!("container {name} already sets {taken} (another profiler, or gpuprof by hand): remove it, gpuprof's sidecar sets it");
        }
    }
    match env.iter_mut().find(|e| name_of(e) == Some(variable)) {
        Some(existing) => {
            let Some(value) = existing["value"].as_str().map(str::to_string) else {
                bail!("container {name} sets {variable} from valueFrom: gpuprof cannot put its shim in front; set it literally, or use --via cuda-injection")
            };
            *existing = literal(variable, &format!("{shim}:{value}"));
        }
        None => env.push(literal(variable, &shim)),
    }
    env.push(literal(shim::SOCKET_VAR, &format!("{MOUNT}/shim.sock")));
    // The sidecar's own level: the shim starts there, not at tensors until the sidecar's word.
    env.push(literal(shim::LEVEL_VAR, gpuprof_model::Level::Driver.as_str()));
    let mounts = array_at(map, "volumeMounts", &format!("container {name}"))?;
    if mounts.iter().any(|m| m["mountPath"].as_str() == Some(MOUNT)) {
        bail!("container {name} already mounts something at {MOUNT}: gpuprof's volume goes there");
    }
    mounts.push(hash(vec![
        ("name", string(SIDECAR_NAME)),
        ("mountPath", string(MOUNT)),
        ("readOnly", Yaml::Boolean(true)),
    ]));
    Ok(())
}

fn sidecar(settings: &SidecarSettings, targets: &[String]) -> Yaml {
    let mut env = vec![
        literal("GPUPROF_OTLP_ENDPOINT", &settings.collector),
        literal("GPUPROF_OTLP_PROTOCOL", &settings.protocol),
        field("K8S_NODE_NAME", "spec.nodeName"),
        field("K8S_POD_NAME", "metadata.name"),
        field("K8S_NAMESPACE", "metadata.namespace"),
        field("K8S_POD_UID", "metadata.uid"),
        // The pod's owner, the job its ranks are one of (empty where the label is absent): a
        // JobSet, a training operator's job (PyTorchJob…), a batch Job.
        field(job::K8S_JOBSET_NAME_VARIABLE, "metadata.labels['jobset.sigs.k8s.io/jobset-name']"),
        field(job::K8S_TRAINING_JOB_NAME_VARIABLE, "metadata.labels['training.kubeflow.org/job-name']"),
        field(job::K8S_JOB_NAME_VARIABLE, "metadata.labels['batch.kubernetes.io/job-name']"),
        literal("GPUPROF_WORKLOAD_CONTAINER", &targets.join(",")),
    ];
    if let Some((secret, secret_key)) = &settings.token {
        env.push(hash(vec![
            ("name", string("GPUPROF_OTLP_TOKEN")),
            (
                "valueFrom",
                hash(vec![("secretKeyRef", hash(vec![("name", string(secret)), ("key", string(secret_key))]))]),
            ),
        ]));
    }
    let port = Yaml::Integer(i64::from(settings.port));
    let mut args = vec![
        string("daemon"),
        string("--sidecar"),
        string(MOUNT),
        string("--listen"),
        string(&format!("0.0.0.0:{}", settings.port)),
    ];
    let security = match settings.capture {
        // Restricted Pod Security: no privilege at all.
        Capture::Shim => hash(vec![
            ("runAsNonRoot", Yaml::Boolean(true)),
            ("runAsUser", Yaml::Integer(65532)),
            ("runAsGroup", Yaml::Integer(65532)),
            ("allowPrivilegeEscalation", Yaml::Boolean(false)),
            ("readOnlyRootFilesystem", Yaml::Boolean(true)),
            ("capabilities", hash(vec![("drop", Yaml::Array(vec![string("ALL")]))])),
            ("seccompProfile", hash(vec![("type", string("RuntimeDefault"))])),
        ]),
        // What loading probes and reading the pod's processes take, and nothing more; the
        // runtimes' default seccomp and AppArmor profiles may refuse bpf(2) and /proc/PID/mem.
        Capture::Ebpf => {
            args.extend([string("--capture"), string("ebpf")]);
            hash(vec![
                ("runAsUser", Yaml::Integer(0)),
                ("allowPrivilegeEscalation", Yaml::Boolean(false)),
                ("readOnlyRootFilesystem", Yaml::Boolean(true)),
                (
                    "capabilities",
                    hash(vec![
                        ("drop", Yaml::Array(vec![string("ALL")])),
                        ("add", Yaml::Array(vec![string("BPF"), string("PERFMON"), string("SYS_PTRACE")])),
                    ]),
                ),
                ("seccompProfile", hash(vec![("type", string("Unconfined"))])),
                ("appArmorProfile", hash(vec![("type", string("Unconfined"))])),
            ])
        }
    };
    hash(vec![
        ("name", string(SIDECAR_NAME)),
        ("image", string(&settings.image)),
        ("imagePullPolicy", string(&settings.pull_policy)),
        // A native sidecar: started before the workload, kept running beside it, stopped after.
        ("restartPolicy", string("Always")),
        ("args", Yaml::Array(args)),
        ("env", Yaml::Array(env)),
        ("ports", Yaml::Array(vec![hash(vec![("name", string("gpuprof-health")), ("containerPort", port.clone())])])),
        // The workload starts once the shim is in the volume and the socket listens.
        (
            "startupProbe",
            hash(vec![
                ("httpGet", hash(vec![("path", string("/readyz")), ("port", port)])),
                ("periodSeconds", Yaml::Integer(1)),
                ("failureThreshold", Yaml::Integer(60)),
            ]),
        ),
        ("volumeMounts", Yaml::Array(vec![hash(vec![("name", string(SIDECAR_NAME)), ("mountPath", string(MOUNT))])])),
        (
            "resources",
            hash(vec![
                ("requests", hash(vec![("cpu", string("50m")), ("memory", string("64Mi"))])),
                ("limits", hash(vec![("memory", string("256Mi"))])),
            ]),
        ),
        ("securityContext", security),
    ])
}
