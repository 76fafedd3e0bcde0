//! The Kubernetes deployment, checked with the real validators: the Helm chart passes `helm lint`
//! and its values schema, renders objects that Kubernetes' own schemas accept (kubernetes-validate,
//! strict: an unknown field fails) with the documented security settings, and configuration the
//! daemon and collector binaries themselves accept; the plain manifests are exactly the chart's
//! render; every PromQL expression of the Grafana dashboards parses (promtool) and names only
//! metrics gpuprof exports; the OpenTelemetry Collector load-balancer routes on host.name.
//! Needs helm, kubernetes-validate, PyYAML and promtool: scripts/install-prerequisites.sh.

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpuprof_testkit::{
    collector::collector_bin, gpuprof, http_client, line_within, scratch, test_tools, tools_python, ChildWithin,
    CommandWithin, PATIENCE, READY_LIMIT,
};
use serde_json::{json, Value};

/// Sample names of the collector's /metrics, as Prometheus stores them (counters end in _total).
const COLLECTOR_METRICS: &[&str] = &[
    "gpuprof_live_bytes",
    "gpuprof_allocator_allocated_bytes",
    "gpuprof_allocator_reserved_bytes",
    "gpuprof_nvml_used_bytes",
    "gpuprof_not_probed_bytes",
    "gpuprof_findings",
    "gpuprof_recent_finding_bytes",
    "gpuprof_top_stack_live_bytes",
    "gpuprof_job_rank_allocated_bytes",
    "gpuprof_job_rank_reserved_bytes",
    "gpuprof_job_rank_over_median_bytes",
    "gpuprof_job_world_size",
    "gpuprof_job_rank_findings",
    "gpuprof_collector_received_total",
    "gpuprof_collector_rejected_log_records_total",
    "gpuprof_collector_refused_requests_total",
    "gpuprof_collector_findings_received_total",
    "gpuprof_collector_received_profiles_total",
    "gpuprof_collector_store_errors_total",
    "gpuprof_collector_forwarded_spans_total",
    "gpuprof_collector_forward_dropped_spans_total",
];

/// Sample names of the daemon's /metrics (OpenMetrics; counters' samples end in _total).
const DAEMON_METRICS: &[&str] = &[
    "gpuprof_daemon_processes_followed",
    "gpuprof_daemon_processes_retained",
    "gpuprof_daemon_libraries_probed",
    "gpuprof_daemon_resident_bytes",
    "gpuprof_daemon_processes_discovered_total",
    "gpuprof_daemon_processes_exited_total",
    "gpuprof_daemon_processes_forgotten_total",
    "gpuprof_daemon_events_total",
    "gpuprof_daemon_events_lost_total",
    "gpuprof_daemon_callers_untracked_total",
    "gpuprof_daemon_stacks_unreadable_total",
    "gpuprof_daemon_findings_total",
    "gpuprof_daemon_otlp_sent_items_total",
    "gpuprof_daemon_otlp_lost_items_total",
    "gpuprof_daemon_otlp_queued_bytes",
];

/// The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
/// kubernetes-validate knows.
const KUBERNETES_VERSIONS: &[&str] = &["1.30.0", "1.37.0"];

/// Kinds of prometheus-operator, validated against their CRDs' schemas instead.
const CRD_KINDS: &[&str] = &["ServiceMonitor", "PodMonitor"];
/// Where scripts/install-prerequisites.sh puts @kubernetes-models/prometheus-operator.
/// Under the test tools (scripts/install-prerequisites.sh).
const MONITOR_MODELS: &str = "node_modules/@kubernetes-models/prometheus-operator";

/// Objects of `helm template gpuprof … --namespace gpuprof --set auth.token=…`.
const DEFAULT_OBJECTS: &[(&str, &str)] = &[
    ("ConfigMap", "gpuprof-daemon-config"),
    ("ConfigMap", "gpuprof-grafana-dashboards"),
    ("ConfigMap", "gpuprof-grafana-datasources"),
    ("ConfigMap", "gpuprof-prometheus-scrape"),
    ("DaemonSet", "gpuprof-daemon"),
    ("Deployment", "gpuprof-collector"),
    ("Deployment", "gpuprof-jaeger"),
    ("PersistentVolumeClaim", "gpuprof-collector"),
    ("Secret", "gpuprof-token"),
    ("Service", "gpuprof-collector"),
    ("Service", "gpuprof-jaeger"),
    ("ServiceAccount", "gpuprof-collector"),
    ("ServiceAccount", "gpuprof-daemon"),
];

/// What otelCollector.enabled and serviceMonitor.enabled add.
const OPTIONAL_OBJECTS: &[(&str, &str)] = &[
    ("ConfigMap", "gpuprof-otel-collector"),
    ("Deployment", "gpuprof-otel-collector"),
    ("Service", "gpuprof-otel-collector"),
    ("ServiceMonitor", "gpuprof-collector"),
    ("PodMonitor", "gpuprof-daemon"),
    ("Secret", "gpuprof-read-token"),
    ("NetworkPolicy", "gpuprof-collector"),
    ("NetworkPolicy", "gpuprof-daemon"),
];

/// Target expressions in the Fleet, Pipeline and Job dashboards, and selectors of their variables.
const DASHBOARD_EXPRESSIONS: usize = 19 + 23 + 8;
const VARIABLE_SELECTORS: usize = 3 + 1 + 2;

/// The documented render of deploy/manifests/gpuprof.yaml (deploy/manifests/README.md).
const MANIFESTS_RENDER: &[&str] = &["--namespace", "gpuprof", "--set", "auth.existingSecret=gpuprof-token"];

const INSTALL: &str = "run scripts/install-prerequisites.sh";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/gpuprof")
}

/// Runs a validation tool; its absence fails the test with the remedy.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::new(program);
    command.args(args).current_dir(repo()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{program}: {e}: {INSTALL}"));
    let input = stdin.unwrap_or("").to_string();
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut pipe, input.as_bytes()));
    let output = child.output_within(PATIENCE, &format!("{program} {}", args.join(" ")));
    // A program refusing its arguments may exit before it reads its input.
    match writer.join().unwrap() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written.unwrap(),
    }
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Python with the given modules, or a failure that says how to get them.
fn python(modules: &str, script: &str, stdin: &str) -> Output {
    let check = run(&tools_python(), &["-c", &format!("import {modules}")], None);
    assert!(check.status.success(), "python3 lacks {modules}: {INSTALL}\n{}", text(&check.stderr));
    run(&tools_python(), &["-c", script], Some(stdin))
}

fn helm(args: &[&str]) -> Output {
    let version = run("helm", &["version", "--short"], None);
    assert!(version.status.success() && text(&version.stdout).starts_with("v4."), "helm 4 is needed: {INSTALL}");
    run("helm", args, None)
}

/// `helm template gpuprof deploy/helm/gpuprof` with these arguments; the YAML text.
fn render(args: &[&str]) -> String {
    let chart = chart();
    let mut all = vec!["template", "gpuprof", chart.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = helm(&all);
    assert!(output.status.success(), "helm {}: {}", all.join(" "), text(&output.stderr));
    text(&output.stdout)
}

fn render_with_token(extra: &[&str]) -> String {
    let mut args = vec!["--namespace", "gpuprof", "--set", "auth.token=test-token"];
    args.extend_from_slice(extra);
    render(&args)
}

/// Every document of a YAML stream, as JSON.
fn yaml_documents(yaml: &str) -> Vec<Value> {
    let output = python(
        "yaml",
        "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d is not None], sys.stdout)",
        yaml,
    );
    assert!(output.status.success(), "YAML does not parse: {}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn yaml_document(yaml: &str) -> Value {
    let mut documents = yaml_documents(yaml);
    assert_eq!(documents.len(), 1, "one YAML document expected");
    documents.remove(0)
}

fn kind_and_name(object: &Value) -> (String, String) {
    (object["kind"].as_str().unwrap().to_string(), object["metadata"]["name"].as_str().unwrap().to_string())
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind_and_name(o) == (kind.to_string(), name.to_string()))
        .unwrap_or_else(|| panic!("{kind} {name} is not rendered"))
}

fn expected(sets: &[&[(&str, &str)]]) -> BTreeSet<(String, String)> {
    sets.iter().flat_map(|set| set.iter()).map(|(k, n)| (k.to_string(), n.to_string())).collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// Validates every object with kubernetes-validate (strict) against each supported version, and
/// the prometheus-operator objects against their CRDs' schemas. A kind without a schema is a
/// failure: kubernetes-validate only warns of it.
fn validate(dir: &Path, objects: &[Value]) {
    let (custom, core): (Vec<&Value>, Vec<&Value>) =
        objects.iter().partition(|o| CRD_KINDS.contains(&o["kind"].as_str().unwrap()));
    // A YAML stream of JSON documents (JSON is YAML).
    let file = dir.join("objects.yaml");
    let stream: Vec<String> = core.iter().map(|o| serde_json::to_string(o).unwrap()).collect();
    std::fs::write(&file, stream.join("\n---\n")).unwrap();
    let mut args = vec!["-m", "kubernetes_validate", "--strict"];
    for version in KUBERNETES_VERSIONS {
        args.extend(["-k", version]);
    }
    args.push(file.to_str().unwrap());
    let check = run(&tools_python(), &["-c", "import kubernetes_validate"], None);
    assert!(check.status.success(), "kubernetes-validate is missing: {INSTALL}");
    let output = run(&tools_python(), &args, None);
    let report = text(&output.stdout);
    assert!(output.status.success(), "kubernetes-validate:\n{report}{}", text(&output.stderr));
    let passed = report.lines().filter(|l| l.starts_with("INFO ") && l.contains(" passed for resource ")).count();
    assert_eq!(passed, core.len() * KUBERNETES_VERSIONS.len(), "every object validated, none skipped:\n{report}");

    // prometheus-operator's kinds: the models of its npm package (installed by the prerequisites).
    let models = test_tools().join(MONITOR_MODELS);
    assert!(models.join("package.json").exists(), "{} is missing: {INSTALL}", models.display());
    let script = gpuprof_testkit::fixtures().join("deploy").join("validate_monitors.mjs");
    let output = run(
        "node",
        &[script.to_str().unwrap(), models.to_str().unwrap()],
        Some(&serde_json::to_string(&custom).unwrap()),
    );
    assert!(output.status.success(), "prometheus-operator objects do not match their CRDs: {}", text(&output.stderr));
    assert_eq!(text(&output.stdout).lines().count(), custom.len());
}

#[test]
fn helm_lint_passes_and_bad_values_fail_with_their_reason() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let lint = helm(&["lint", chart, "--set", "auth.token=x"]);
    assert!(lint.status.success(), "helm lint: {}{}", text(&lint.stdout), text(&lint.stderr));
    assert!(text(&lint.stdout).contains("0 chart(s) failed"), "{}", text(&lint.stdout));

    assert!(render(&["--set", "auth.token=x"]).contains("kind: DaemonSet"));

    let no_token = helm(&["template", "gpuprof", chart]);
    assert!(!no_token.status.success());
    assert!(text(&no_token.stderr).contains("set auth.token or auth.existingSecret"), "{}", text(&no_token.stderr));
    let same = helm(&["template", "gpuprof", chart, "--set", "auth.token=x", "--set", "auth.readToken=x"]);
    assert!(!same.status.success());
    assert!(
        text(&same.stderr).contains("auth.readToken is auth.token: give readers a token of their own"),
        "{}",
        text(&same.stderr)
    );

    for bad in [
        "daemon.listenPort=notanumber",
        "daemon.config.scan_intervall=0.5",
        "daemon.config.buffer_mib=3",
        "daemon.otlpProtocol=udp",
    ] {
        let output = helm(&["template", "gpuprof", chart, "--set", "auth.token=x", "--set", bad]);
        assert!(!output.status.success(), "--set {bad} was accepted");
        assert!(
            text(&output.stderr).contains("values don't meet the specifications of the schema"),
            "{bad}: {}",
            text(&output.stderr)
        );
    }
}

#[test]
fn the_chart_renders_valid_objects_with_the_documented_security() {
    let dir = scratch("deploy_chart");
    let defaults = yaml_documents(&render_with_token(&[]));
    let found: BTreeSet<_> = defaults.iter().map(kind_and_name).collect();
    assert_eq!(found, expected(&[DEFAULT_OBJECTS]));
    let everything = yaml_documents(&render_with_token(&[
        "--set",
        "otelCollector.enabled=true",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "auth.readToken=r3ad",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.readers[0].namespaceSelector.matchLabels.team=monitoring",
    ]));
    let found: BTreeSet<_> = everything.iter().map(kind_and_name).collect();
    assert_eq!(found, expected(&[DEFAULT_OBJECTS, OPTIONAL_OBJECTS]));
    validate(&dir, &everything);
    for object in &everything {
        assert_eq!(object["metadata"]["namespace"], "gpuprof", "{:?} has no namespace", kind_and_name(object));
    }
    // Readers' token: the collector reads it from its Secret, the daemons take it for /metrics,
    // the monitors send it.
    let read_secret = serde_json::json!({"name": "gpuprof-read-token", "key": "token"});
    let collector_pod = &object(&everything, "Deployment", "gpuprof-collector")["spec"]["template"]["spec"];
    assert!(
        strings(&collector_pod["containers"][0]["args"]).contains(&"--read-token-file=/etc/gpuprof/read-token/token")
    );
    let read_volume = collector_pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "read-token").unwrap();
    assert_eq!(read_volume["secret"]["secretName"], "gpuprof-read-token");
    let daemon_env =
        &object(&everything, "DaemonSet", "gpuprof-daemon")["spec"]["template"]["spec"]["containers"][0]["env"];
    let metrics_token = daemon_env.as_array().unwrap().iter().find(|e| e["name"] == "GPUPROF_METRICS_TOKEN").unwrap();
    assert_eq!(metrics_token["valueFrom"]["secretKeyRef"], read_secret);
    for (kind, name, endpoints) in
        [("ServiceMonitor", "gpuprof-collector", "endpoints"), ("PodMonitor", "gpuprof-daemon", "podMetricsEndpoints")]
    {
        let authorization = &object(&everything, kind, name)["spec"][endpoints][0]["authorization"];
        assert_eq!(authorization, &serde_json::json!({"type": "Bearer", "credentials": read_secret}), "{kind}");
    }
    // OTLP from the release's daemons and OpenTelemetry Collector; the API and /metrics from the readers.
    let readers = serde_json::json!([{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]);
    let collector_policy = &object(&everything, "NetworkPolicy", "gpuprof-collector")["spec"];
    let senders: Vec<&str> = collector_policy["ingress"][0]["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["podSelector"]["matchLabels"]["app.kubernetes.io/component"].as_str().unwrap())
        .collect();
    assert_eq!(senders, ["daemon", "otel-collector"]);
    assert_eq!(
        collector_policy["ingress"][0]["ports"],
        serde_json::json!([{"port": 4317, "protocol": "TCP"}, {"port": 4318, "protocol": "TCP"}])
    );
    assert_eq!(
        collector_policy["ingress"][1],
        serde_json::json!({"from": readers, "ports": [{"port": 4318, "protocol": "TCP"}]})
    );
    let daemon_policy = &object(&everything, "NetworkPolicy", "gpuprof-daemon")["spec"];
    assert_eq!(
        daemon_policy["ingress"],
        serde_json::json!([{"from": readers, "ports": [{"port": 9464, "protocol": "TCP"}]}])
    );

    // The daemon: every process of the node in view, three capabilities, nothing privileged.
    let daemon = object(&defaults, "DaemonSet", "gpuprof-daemon");
    let pod = &daemon["spec"]["template"];
    assert_eq!(pod["spec"]["hostPID"], true);
    assert!(pod["spec"]["hostNetwork"].is_null() && pod["spec"]["hostIPC"].is_null());
    let container = &pod["spec"]["containers"][0];
    let security = &container["securityContext"];
    let mut added = strings(&security["capabilities"]["add"]);
    added.sort();
    assert_eq!(added, ["BPF", "PERFMON", "SYS_PTRACE"]);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(security["runAsUser"], 0);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["seccompProfile"]["type"], "Unconfined");
    assert_eq!(security["appArmorProfile"]["type"], "Unconfined");
    assert_eq!(strings(&container["args"]), ["daemon", "--config", "/etc/gpuprof/daemon.toml"]);
    assert_eq!(container["env"][0]["name"], "K8S_NODE_NAME");
    assert_eq!(container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(container["env"][1]["name"], "GPUPROF_OTLP_TOKEN");
    assert_eq!(
        container["env"][1]["valueFrom"]["secretKeyRef"],
        serde_json::json!({"name": "gpuprof-token", "key": "token"})
    );
    assert_eq!(container["livenessProbe"]["httpGet"], serde_json::json!({"path": "/healthz", "port": "metrics"}));
    assert_eq!(container["readinessProbe"]["httpGet"], serde_json::json!({"path": "/readyz", "port": "metrics"}));
    assert_eq!(container["ports"][0], serde_json::json!({"name": "metrics", "containerPort": 9464, "protocol": "TCP"}));
    let host_paths: Vec<&str> =
        pod["spec"]["volumes"].as_array().unwrap().iter().filter_map(|v| v["hostPath"]["path"].as_str()).collect();
    assert_eq!(
        host_paths,
        ["/sys/kernel/btf", "/var/lib/gpuprof/postmortems"],
        "the daemon mounts the kernel's BTF and the directory of its post-mortems from the host, nothing else"
    );
    // The one place it writes, its root file system read-only.
    let writable: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["readOnly"] != true)
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert_eq!((writable, &security["readOnlyRootFilesystem"]), (vec!["/var/lib/gpuprof/postmortems"], &true.into()));
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(
        (&annotations["prometheus.io/scrape"], &annotations["prometheus.io/port"]),
        (&"true".into(), &"9464".into())
    );
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");

    // The collector: one writer, not root.
    let collector = object(&defaults, "Deployment", "gpuprof-collector");
    assert_eq!(collector["spec"]["replicas"], 1);
    assert_eq!(collector["spec"]["strategy"]["type"], "Recreate");
    let pod = &collector["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert!(pod["containers"][0]["securityContext"]["capabilities"]["add"].is_null());
    let args = strings(&pod["containers"][0]["args"]);
    for arg in [
        "--grpc-listen=0.0.0.0:4317",
        "--http-listen=0.0.0.0:4318",
        "--db=/var/lib/gpuprof/collector.redb",
        "--token-file=/etc/gpuprof/token/token",
        "--forward-endpoint=http://gpuprof-jaeger.gpuprof.svc:4318",
    ] {
        assert!(args.contains(&arg), "collector args lack {arg}: {args:?}");
    }
    let service = object(&defaults, "Service", "gpuprof-collector");
    let ports: Vec<(&str, u64)> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["port"].as_u64().unwrap()))
        .collect();
    assert_eq!(ports, [("otlp-grpc", 4317), ("otlp-http", 4318)]);
    assert_eq!(service["metadata"]["annotations"]["prometheus.io/port"], "4318");

    // Every container of every workload: read-only root, no capability kept, never privileged.
    for workload in everything.iter().filter(|o| o["spec"]["template"]["spec"]["containers"].is_array()) {
        for container in workload["spec"]["template"]["spec"]["containers"].as_array().unwrap() {
            let security = &container["securityContext"];
            let what = format!("{:?} container {}", kind_and_name(workload), container["name"]);
            assert_ne!(security["privileged"], true, "{what} is privileged");
            assert_eq!(security["readOnlyRootFilesystem"], true, "{what}");
            assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{what}");
            assert!(!container["image"].as_str().unwrap().ends_with(":latest"), "{what}: pin the image");
        }
    }

    // prometheus-operator objects select what the chart renders.
    let monitor = object(&everything, "ServiceMonitor", "gpuprof-collector");
    let labels = &object(&everything, "Service", "gpuprof-collector")["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "the ServiceMonitor does not select the collector's Service");
    }
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "otlp-http");
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true, "the collector's namespace/pod labels must win");
    let monitor = object(&everything, "PodMonitor", "gpuprof-daemon");
    let labels = &object(&everything, "DaemonSet", "gpuprof-daemon")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "the PodMonitor does not select the daemon's pods");
    }
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "metrics");

    // The seccomp profile is a choice.
    let runtime_default = yaml_documents(&render_with_token(&["--set", "daemon.seccompProfile.type=RuntimeDefault"]));
    let daemon = object(&runtime_default, "DaemonSet", "gpuprof-daemon");
    assert_eq!(
        daemon["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
}

#[test]
fn the_plain_manifests_are_the_charts_render() {
    let committed = std::fs::read_to_string(repo().join("deploy/manifests/gpuprof.yaml")).unwrap();
    let fresh = render(MANIFESTS_RENDER);
    assert!(
        committed == fresh,
        "deploy/manifests/gpuprof.yaml is not the chart's render: run `helm template gpuprof deploy/helm/gpuprof {} > deploy/manifests/gpuprof.yaml`",
        MANIFESTS_RENDER.join(" ")
    );
    let objects = yaml_documents(&committed);
    assert!(
        !objects.iter().any(|o| o["kind"] == "Secret"),
        "the manifests take the token from a Secret the user creates"
    );
    validate(&scratch("deploy_manifests"), &objects);
}

#[test]
fn the_rendered_configuration_is_what_the_binaries_and_prometheus_accept() {
    let dir = scratch("deploy_configuration");
    let objects = yaml_documents(&render_with_token(&["--set", "daemon.hostDriver.enabled=true"]));

    // The daemon's file: a flag that fails a check made after the file is read proves the file
    // itself was accepted (a key the daemon does not know names the file and line instead).
    let daemon_accepts = |objects: &[Value], expected_line: &str| {
        let toml =
            object(objects, "ConfigMap", "gpuprof-daemon-config")["data"]["daemon.toml"].as_str().unwrap().to_string();
        assert!(toml.contains(expected_line), "{toml}");
        let config = dir.join("daemon.toml");
        std::fs::write(&config, &toml).unwrap();
        let output = Command::new(gpuprof())
            .env_clear()
            .args(["daemon", "--config", config.to_str().unwrap(), "--scan-interval", "5"])
            .output_within(PATIENCE);
        let stderr = text(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains("scan_interval 5s: at most 1 second"),
            "the daemon refused daemon.toml:\n{toml}\n{stderr}"
        );
    };
    daemon_accepts(&objects, "libcuda = \"/host/driver/libcuda.so.1\"");
    // Post-mortems in the node's directory the DaemonSet mounts, or none.
    daemon_accepts(&objects, "postmortem_dir = \"/var/lib/gpuprof/postmortems\"");
    let without = yaml_documents(&render_with_token(&["--set", "daemon.postmortems.enabled=false"]));
    daemon_accepts(&without, "no_postmortems = true");
    // Without eBPF, on the shims' socket in a host directory the workloads share.
    let shim_only = yaml_documents(&render_with_token(&[
        "--set",
        "daemon.shim.enabled=true",
        "--set",
        "daemon.shim.only=true",
        "--set",
        "daemon.shim.socketGroup=4242",
    ]));
    daemon_accepts(&shim_only, "shim_socket = \"/run/gpuprof/shim.sock\"\nshim_socket_mode = \"0660\"\nshim_socket_group = \"4242\"\ncapture = \"shim\"");
    validate(&dir, &shim_only);
    let daemonset = object(&shim_only, "DaemonSet", "gpuprof-daemon");
    let volume = daemonset["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shim-socket")
        .unwrap();
    assert_eq!(
        (volume["hostPath"]["path"].as_str(), volume["hostPath"]["type"].as_str()),
        (Some("/run/gpuprof"), Some("DirectoryOrCreate"))
    );

    // The collector's flags: every one parses; it then stops at the token file, absent here.
    let collector = object(&objects, "Deployment", "gpuprof-collector");
    let args = strings(&collector["spec"]["template"]["spec"]["containers"][0]["args"]);
    let output = Command::new(collector_bin()).env_clear().args(&args).output_within(PATIENCE);
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("--token-file /etc/gpuprof/token/token: cannot read it"),
        "the collector refused {args:?}:\n{stderr}"
    );

    // The scrape jobs. Debian's promtool is built without Kubernetes discovery, so it checks
    // them (intervals, relabeling, regexes) with the discovery swapped for a static target.
    let scrape = object(&objects, "ConfigMap", "gpuprof-prometheus-scrape")["data"]["prometheus.yml"].as_str().unwrap();
    let mut scrape = yaml_document(scrape);
    let jobs = scrape["scrape_configs"].as_array_mut().unwrap();
    let names: Vec<&str> = jobs.iter().map(|j| j["job_name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpuprof-collector", "gpuprof-daemon"]);
    assert_eq!(jobs[0]["honor_labels"], true, "the collector's namespace/pod labels must win");
    for (job, role) in jobs.iter_mut().zip(["endpoints", "pod"]) {
        let discovery = job.as_object_mut().unwrap().remove("kubernetes_sd_configs").unwrap();
        assert_eq!(discovery[0]["role"], role);
        assert_eq!(strings(&discovery[0]["namespaces"]["names"]), ["gpuprof"]);
        job["static_configs"] = serde_json::json!([{"targets": ["127.0.0.1:9"]}]);
    }
    assert_eq!(jobs[0]["relabel_configs"][0]["regex"], "gpuprof;collector;otlp-http");
    assert_eq!(jobs[1]["relabel_configs"][0]["regex"], "gpuprof;daemon;metrics");
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, serde_json::to_string(&scrape).unwrap()).unwrap();
    let output = run("promtool", &["check", "config", path.to_str().unwrap()], None);
    assert!(output.status.success(), "promtool check config: {}{}", text(&output.stdout), text(&output.stderr));

    // Grafana's data sources, by the uids the dashboards' links name.
    let sources = object(&objects, "ConfigMap", "gpuprof-grafana-datasources")["data"]["gpuprof-datasources.yaml"]
        .as_str()
        .unwrap();
    let sources = yaml_document(sources);
    let found: Vec<(&str, &str, &str)> = sources["datasources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["uid"].as_str().unwrap(), s["type"].as_str().unwrap(), s["url"].as_str().unwrap()))
        .collect();
    assert_eq!(
        found,
        [
            ("gpuprof-prometheus", "prometheus", "http://prometheus-server.monitoring.svc:80"),
            ("gpuprof-jaeger", "jaeger", "http://gpuprof-jaeger.gpuprof.svc:16686")
        ]
    );

    // The dashboards ConfigMap carries the files as they are.
    let dashboards = &object(&objects, "ConfigMap", "gpuprof-grafana-dashboards")["data"];
    assert_eq!(dashboards.as_object().unwrap().len(), dashboard_files().len());
    for path in dashboard_files() {
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(dashboards[name].as_str(), Some(std::fs::read_to_string(&path).unwrap().trim_end()), "{name}");
    }
}

fn dashboard_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("dashboards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// Every target expression of every panel, rows' nested panels included.
fn targets(panels: &[Value], found: &mut Vec<String>) {
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            found.push(
                target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {} has a target without expr", panel["title"]))
                    .to_string(),
            );
        }
        targets(panel["panels"].as_array().map(Vec::as_slice).unwrap_or_default(), found);
    }
}

struct Dashboard {
    title: String,
    expressions: Vec<String>,
    /// The series selectors of `label_values(SELECTOR, label)` variables.
    selectors: Vec<String>,
    variables: Vec<String>,
}

fn dashboards() -> Vec<Dashboard> {
    dashboard_files()
        .iter()
        .map(|path| {
            let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let title = json["title"].as_str().unwrap_or_else(|| panic!("{} has no title", path.display())).to_string();
            assert!(json["uid"].as_str().is_some_and(|u| !u.is_empty()), "{title} has no uid");
            assert!(json["schemaVersion"].as_u64().is_some(), "{title} has no schemaVersion");
            let mut expressions = Vec::new();
            targets(json["panels"].as_array().unwrap(), &mut expressions);
            let mut selectors = Vec::new();
            let mut variables = Vec::new();
            for variable in json["templating"]["list"].as_array().unwrap() {
                variables.push(variable["name"].as_str().unwrap().to_string());
                if variable["type"] == "datasource" {
                    assert_eq!(variable["query"], "prometheus", "{title}: the data source variable picks a Prometheus");
                    continue;
                }
                if variable["type"] == "textbox" {
                    // An address links go to (the collector's): no query.
                    assert!(
                        variable["query"].as_str().is_some_and(|q| q.starts_with("http://")),
                        "{title}: {variable}"
                    );
                    continue;
                }
                let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap();
                let inner = query
                    .strip_prefix("label_values(")
                    .and_then(|q| q.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("{title}: {query}"));
                if let Some((selector, _label)) = inner.rsplit_once(',') {
                    selectors.push(selector.trim().to_string());
                }
            }
            Dashboard { title, expressions, selectors, variables }
        })
        .collect()
}

/// An expression as Prometheus gets it from Grafana: template variables replaced by values of
/// the kind Grafana puts there.
fn substituted(expression: &str, variables: &[String]) -> String {
    let mut out = expression.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$__interval", "1m");
    for variable in variables {
        out = out.replace(&format!("${{{variable}}}"), ".*").replace(&format!("${variable}"), ".*");
    }
    assert!(!out.contains('$'), "an unknown variable in {expression}");
    out
}

#[test]
fn every_dashboard_expression_is_valid_promql() {
    let dir = scratch("deploy_promql");
    let mut rules = String::from("groups:\n  - name: gpuprof-dashboards\n    rules:\n");
    let (mut expressions, mut selectors) = (0, 0);
    for dashboard in dashboards() {
        assert!(dashboard.variables.iter().any(|v| v == "datasource"), "{}: no datasource variable", dashboard.title);
        for (i, expression) in dashboard.expressions.iter().chain(&dashboard.selectors).enumerate() {
            let expr = serde_json::to_string(&substituted(expression, &dashboard.variables)).unwrap();
            rules.push_str(&format!(
                "      - record: gpuprof:dashboard_expression_{}\n        expr: {expr}\n",
                expressions + selectors + i
            ));
        }
        expressions += dashboard.expressions.len();
        selectors += dashboard.selectors.len();
    }
    assert_eq!((expressions, selectors), (DASHBOARD_EXPRESSIONS, VARIABLE_SELECTORS));
    // promtool parses every rule's expression.
    let path = dir.join("dashboards.rules.yml");
    std::fs::write(&path, &rules).unwrap();
    let output = run("promtool", &["check", "rules", path.to_str().unwrap()], None);
    let report = text(&output.stdout) + &text(&output.stderr);
    assert!(output.status.success(), "promtool check rules:\n{report}\n{rules}");
    assert!(report.contains(&format!("SUCCESS: {} rules found", expressions + selectors)), "{report}");
}

/// Metric names (identifiers starting with gpuprof_) of a PromQL expression.
fn metric_names(expression: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expression.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        if starts_word && expression[i..].starts_with("gpuprof_") {
            let end = expression[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(bytes.len(), |n| i + n);
            names.push(expression[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn dashboards_use_every_documented_metric_and_no_other() {
    let known: BTreeSet<&str> = COLLECTOR_METRICS.iter().chain(DAEMON_METRICS).copied().collect();
    let mut used = BTreeSet::new();
    for dashboard in dashboards() {
        for expression in dashboard.expressions.iter().chain(&dashboard.selectors) {
            let names = metric_names(expression);
            assert!(!names.is_empty(), "{}: {expression} names no gpuprof metric", dashboard.title);
            for name in names {
                assert!(
                    known.contains(name.as_str()),
                    "{}: {name} is not a metric gpuprof exports ({expression})",
                    dashboard.title
                );
                used.insert(name);
            }
        }
    }
    let unused: Vec<&&str> = known.iter().filter(|m| !used.contains(**m)).collect();
    assert!(unused.is_empty(), "no panel shows {unused:?}");
}

#[test]
fn the_otel_collector_routes_each_job_to_one_collector() {
    let objects = yaml_documents(&render_with_token(&["--set", "otelCollector.enabled=true"]));
    let config = object(&objects, "ConfigMap", "gpuprof-otel-collector")["data"]["config.yaml"].as_str().unwrap();
    let config = yaml_document(config);
    let balancer = &config["exporters"]["load_balancing"];
    assert_eq!(balancer["routing_key"], "attributes");
    assert_eq!(strings(&balancer["routing_attributes"]), ["gpuprof.job.id"]);
    assert_eq!(balancer["resolver"]["static"]["hostnames"], "${env:GPUPROF_COLLECTOR_SHARDS}");
    assert_eq!(strings(&config["service"]["pipelines"]["logs"]["exporters"]), ["load_balancing"]);
    assert_eq!(strings(&config["service"]["pipelines"]["traces"]["exporters"]), ["load_balancing", "otlp_grpc/traces"]);
    assert_eq!(strings(&config["service"]["pipelines"]["metrics"]["exporters"]), ["load_balancing", "prometheus"]);
    // The daemons send to it, and it to the collectors with the token, the spans to this
    // release's Jaeger; the collectors then forward none themselves.
    let daemon = object(&objects, "ConfigMap", "gpuprof-daemon-config")["data"]["daemon.toml"].as_str().unwrap();
    assert!(daemon.contains("otlp_endpoint = \"http://gpuprof-otel-collector.gpuprof.svc:4317\""), "{daemon}");
    let env =
        &object(&objects, "Deployment", "gpuprof-otel-collector")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[0]["name"], "GPUPROF_COLLECTOR_TOKEN");
    assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["name"], "gpuprof-token");
    assert_eq!(
        (&env[1]["name"], &env[1]["value"]),
        (&json!("GPUPROF_COLLECTOR_SHARDS"), &json!("[gpuprof-collector.gpuprof.svc:4317]"))
    );
    assert_eq!(
        (&env[2]["name"], &env[2]["value"]),
        (&json!("GPUPROF_TRACES_OTLP"), &json!("gpuprof-jaeger.gpuprof.svc:4317"))
    );
    let collector_args =
        &object(&objects, "Deployment", "gpuprof-collector")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(!collector_args.to_string().contains("--forward-endpoint"), "{collector_args}");

    // The same configuration as the standalone file, which the Collector's test runs as it is.
    let standalone = std::fs::read_to_string(repo().join("deploy/otel-collector/loadbalancing.yaml")).unwrap();
    assert_eq!(
        config,
        yaml_document(&standalone),
        "the chart's OpenTelemetry Collector configuration differs from deploy/otel-collector/loadbalancing.yaml"
    );
    // Several shards, and a trace store of the user's own.
    let objects = yaml_documents(&render_with_token(&[
        "--set",
        "otelCollector.enabled=true",
        "--set",
        "otelCollector.collectors={shard-0.gpuprof:4317,shard-1.gpuprof:4317}",
        "--set",
        "jaeger.enabled=false",
        "--set",
        "otelCollector.tracesEndpoint=tempo.tracing:4317",
    ]));
    let env =
        &object(&objects, "Deployment", "gpuprof-otel-collector")["spec"]["template"]["spec"]["containers"][0]["env"];
    assert_eq!(env[1]["value"], "[shard-0.gpuprof:4317, shard-1.gpuprof:4317]");
    assert_eq!(env[2]["value"], "tempo.tracing:4317");
}

/// The metric names the dashboards may use are what a running collector and daemon serve: a
/// collector fed one PyTorch-like process as its node sends it (a driver segment, the
/// allocator's gauges and a memory profile) and one that exits holding memory (its finding), and
/// forwarding spans, and a daemon with nothing to capture yet.
#[test]
fn the_dashboards_metrics_are_served_by_a_running_collector_and_daemon() {
    use gpuprof_model::{Event, Layer, Op, Source};
    use gpuprof_testkit::collector::{
        allocator_gauges, logs_request, nvml_gauge, profile_record, records_request, synthetic, trainer, Collector,
    };

    let dir = scratch("deploy_live_metrics");
    let collector = Collector::start(&dir.join("c.redb"), &["--forward-endpoint", "http://127.0.0.1:9"]);
    let base = 1_800_000_000_000_000_000u64;
    let segment = synthetic(base, 900, Op::Alloc, "cuMemAlloc_v2", 0x1000_0000, 2 << 20);
    assert_eq!(
        collector.post("/v1/logs", "application/x-protobuf", &logs_request("node-m", 900, &[segment]), None).0,
        200
    );
    assert_eq!(
        collector
            .post(
                "/v1/metrics",
                "application/x-protobuf",
                &allocator_gauges(&trainer("node-m", 900), base + 1, 1 << 20, 2 << 20),
                None
            )
            .0,
        200
    );
    assert_eq!(
        collector
            .post(
                "/v1/metrics",
                "application/x-protobuf",
                &nvml_gauge(&trainer("node-m", 900), base + 1, 514 << 20),
                None
            )
            .0,
        200
    );
    let profile = profile_record(base + 1, "allocator", &[("step", 42, 1 << 20, 1)]);
    assert_eq!(
        collector
            .post("/v1/logs", "application/x-protobuf", &records_request(&trainer("node-m", 900), vec![profile]), None)
            .0,
        200
    );
    let exit = Event::new(
        base + 2,
        901,
        901,
        Source::Ebpf,
        Layer::Process,
        Op::Exit,
        std::borrow::Cow::Borrowed("sched_process_exit"),
    );
    let leaker = [synthetic(base + 1, 901, Op::Alloc, "cuMemAlloc_v2", 0x2000_0000, 1 << 20), exit];
    assert_eq!(
        collector.post("/v1/logs", "application/x-protobuf", &logs_request("node-m", 901, &leaker), None).0,
        200
    );
    let found = gpuprof_model::analyze(&leaker, gpuprof_model::RuleConfig::default());
    let finding = gpuprof_otlp::logs::finding_record(&found[0], base + 2);
    assert_eq!(
        collector
            .post("/v1/logs", "application/x-protobuf", &records_request(&trainer("node-m", 901), vec![finding]), None)
            .0,
        200
    );
    // Two ranks of a job, one with a finding: the Job dashboard's series.
    let rank = |pid: u32, rank: u32| {
        let mut identity = trainer("node-m", pid);
        identity.job_id = "torchrun:deploy-1".into();
        identity.rank = Some(rank);
        identity.world_size = Some(2);
        identity
    };
    for (pid, r) in [(902, 0), (903, 1)] {
        let gauges = allocator_gauges(&rank(pid, r), base + 1, (1 + u64::from(r)) << 20, 4 << 20);
        assert_eq!(collector.post("/v1/metrics", "application/x-protobuf", &gauges, None).0, 200);
    }
    let mut ranked = found[0].clone();
    (ranked.pid, ranked.rank) = (903, Some(1));
    let finding = gpuprof_otlp::logs::finding_record(&ranked, base + 3);
    assert_eq!(
        collector.post("/v1/logs", "application/x-protobuf", &records_request(&rank(903, 1), vec![finding]), None).0,
        200
    );
    let (status, text) = collector.get("/metrics");
    assert_eq!(status, 200);
    let served = sample_names(&text);
    for name in COLLECTOR_METRICS {
        assert!(served.contains(*name), "the collector does not serve {name}:\n{text}");
    }
    collector.stop();

    let postmortems = dir.join("postmortems");
    let mut daemon = Command::new(gpuprof())
        .args(["daemon", "--output", "/dev/null", "--listen", "127.0.0.1:0", "--postmortem-dir"])
        .arg(&postmortems)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(daemon.stderr.take().unwrap());
    let address = loop {
        let line = line_within(&mut stderr, READY_LIMIT, "the daemon to say where /metrics is");
        if let Some(rest) = line.split("/metrics on ").nth(1) {
            break rest.split(';').next().unwrap().to_string();
        }
    };
    let agent: ureq::Agent = http_client();
    let text = agent.get(&format!("http://{address}/metrics")).call().unwrap().body_mut().read_to_string().unwrap();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let served = sample_names(&text);
    for name in DAEMON_METRICS {
        assert!(served.contains(*name), "the daemon does not serve {name}:\n{text}");
    }
}

/// The sample names of a Prometheus or OpenMetrics exposition.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// The image recipe copies the binaries onto a base with glibc and libgcc_s alone
/// (distroless/cc): libbpf, libelf and zlib must be linked in.
#[test]
fn the_binaries_need_only_glibc_and_libgcc_at_run_time() {
    const BASE_IMAGE_LIBRARIES: &[&str] =
        &["linux-vdso.so.1", "libc.so.6", "libm.so.6", "libgcc_s.so.1", "/lib64/ld-linux-x86-64.so.2"];
    for binary in [Path::new(gpuprof()), collector_bin()] {
        let output = run("ldd", &[binary.to_str().unwrap()], None);
        assert!(output.status.success(), "ldd {}: {}", binary.display(), text(&output.stderr));
        let libraries: Vec<String> =
            text(&output.stdout).lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
        for library in &libraries {
            assert!(
                BASE_IMAGE_LIBRARIES.contains(&library.as_str()),
                "{} needs {library}, which distroless/cc lacks",
                binary.display()
            );
        }
        assert!(libraries.iter().any(|l| l == "libc.so.6"), "{libraries:?}");
    }
}

// ---- gpuprof inject ---------------------------------------------------------------------------

const SHIM: &str = "/gpuprof/libgpuprof_shim.so";

/// What inject says when the sidecars get no token.
const NO_TOKEN: &str = "gpuprof: warning: the sidecars send no bearer token (no --token-secret, no tokenSecret in --settings), and a collector that asks for one (the Helm chart's always does) refuses them: give --token-secret SECRET/KEY (the chart's Secret: <release>-token/token, or auth.existingSecret/token), or --settings with the chart's <release>-sidecar ConfigMap\n";

fn inject(args: &[&str], input: &str) -> Output {
    let mut all = vec!["inject"];
    all.extend_from_slice(args);
    run(gpuprof(), &all, Some(input))
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(gpuprof_testkit::fixtures().join("inject").join(name)).unwrap()
}

/// The Job of workloads.yaml alone: a GPU container with its own LD_PRELOAD, and a log shipper.
fn training_job() -> String {
    fixture("workloads.yaml").split("\n---\n").nth(1).unwrap().to_string()
}

/// What gpuprof inject's sidecar is, with the defaults or the flags the test gave.
struct Expected<'a> {
    image: &'a str,
    collector: &'a str,
    protocol: &'a str,
    port: u16,
    token: Option<(&'a str, &'a str)>,
    variable: &'a str,
    /// `--capture ebpf`: the pod's processes probed; the workload left alone.
    ebpf: bool,
}

const DEFAULTS: Expected<'static> = Expected {
    image: concat!("gpuprof:", env!("CARGO_PKG_VERSION")),
    collector: "http://gpuprof-collector.gpuprof:4317",
    protocol: "grpc",
    port: 9464,
    token: None,
    variable: "LD_PRELOAD",
    ebpf: false,
};

fn expected_sidecar(expected: &Expected<'_>, targets: &[&str]) -> Value {
    let field = |name: &str, path: &str| serde_json::json!({ "name": name, "valueFrom": { "fieldRef": { "fieldPath": path } } });
    let mut env = vec![
        serde_json::json!({ "name": "GPUPROF_OTLP_ENDPOINT", "value": expected.collector }),
        serde_json::json!({ "name": "GPUPROF_OTLP_PROTOCOL", "value": expected.protocol }),
        field("K8S_NODE_NAME", "spec.nodeName"),
        field("K8S_POD_NAME", "metadata.name"),
        field("K8S_NAMESPACE", "metadata.namespace"),
        field("K8S_POD_UID", "metadata.uid"),
        field("GPUPROF_K8S_JOBSET_NAME", "metadata.labels['jobset.sigs.k8s.io/jobset-name']"),
        field("GPUPROF_K8S_TRAINING_JOB_NAME", "metadata.labels['training.kubeflow.org/job-name']"),
        field("K8S_JOB_NAME", "metadata.labels['batch.kubernetes.io/job-name']"),
        serde_json::json!({ "name": "GPUPROF_WORKLOAD_CONTAINER", "value": targets.join(",") }),
    ];
    if let Some((secret, key)) = expected.token {
        env.push(serde_json::json!({ "name": "GPUPROF_OTLP_TOKEN", "valueFrom": { "secretKeyRef": { "name": secret, "key": key } } }));
    }
    let mut args = vec![
        Value::from("daemon"),
        "--sidecar".into(),
        "/gpuprof".into(),
        "--listen".into(),
        format!("0.0.0.0:{}", expected.port).into(),
    ];
    let security = if expected.ebpf {
        args.extend(["--capture".into(), "ebpf".into()]);
        serde_json::json!({
            "runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"], "add": ["BPF", "PERFMON", "SYS_PTRACE"] },
            "seccompProfile": { "type": "Unconfined" }, "appArmorProfile": { "type": "Unconfined" }
        })
    } else {
        serde_json::json!({
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" }
        })
    };
    serde_json::json!({
        "name": "gpuprof",
        "image": expected.image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": args,
        "env": env,
        "ports": [{ "name": "gpuprof-health", "containerPort": expected.port }],
        "startupProbe": { "httpGet": { "path": "/readyz", "port": expected.port }, "periodSeconds": 1, "failureThreshold": 60 },
        "volumeMounts": [{ "name": "gpuprof", "mountPath": "/gpuprof" }],
        "resources": { "requests": { "cpu": "50m", "memory": "64Mi" }, "limits": { "memory": "256Mi" } },
        "securityContext": security
    })
}

/// Checks every field gpuprof inject adds to a pod spec, and takes them out again: what is left
/// must be the spec as it was.
fn take_out_sidecar(spec: &mut Value, expected: &Expected<'_>, targets: &[&str]) {
    let object = spec.as_object_mut().unwrap();
    let init = object.get_mut("initContainers").unwrap().as_array_mut().unwrap();
    assert_eq!(init.remove(0), expected_sidecar(expected, targets));
    if init.is_empty() {
        object.remove("initContainers");
    }
    let volumes = object.get_mut("volumes").unwrap().as_array_mut().unwrap();
    assert_eq!(volumes.pop().unwrap(), serde_json::json!({ "name": "gpuprof", "emptyDir": {} }));
    assert!(volumes.iter().all(|v| v["name"] != "gpuprof"));
    if volumes.is_empty() {
        object.remove("volumes");
    }
    if expected.ebpf || targets.len() > 1 {
        assert_eq!(object.remove("shareProcessNamespace"), Some(Value::Bool(true)));
    }
    for container in object.get_mut("containers").unwrap().as_array_mut().unwrap() {
        let name = container["name"].as_str().unwrap().to_string();
        let container = container.as_object_mut().unwrap();
        if !targets.contains(&name.as_str()) || expected.ebpf {
            assert!(
                !container.get("env").is_some_and(|e| e
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == "GPUPROF_SHIM_SOCKET")),
                "{name}"
            );
            continue;
        }
        let env = container.get_mut("env").unwrap().as_array_mut().unwrap();
        // The shim starts at the sidecar's level, the driver's.
        assert_eq!(
            env.pop().unwrap(),
            serde_json::json!({ "name": "GPUPROF_SHIM_LEVEL", "value": "driver" }),
            "{name}"
        );
        assert_eq!(
            env.pop().unwrap(),
            serde_json::json!({ "name": "GPUPROF_SHIM_SOCKET", "value": "/gpuprof/shim.sock" }),
            "{name}"
        );
        let preload = env
            .iter()
            .position(|v| v["name"] == expected.variable)
            .unwrap_or_else(|| panic!("{name} has no {}", expected.variable));
        let value = env[preload]["value"].as_str().unwrap().to_string();
        match value.strip_prefix(&format!("{SHIM}:")) {
            Some(before) => env[preload]["value"] = Value::String(before.to_string()),
            None => {
                assert_eq!(value, SHIM, "{name}");
                env.remove(preload);
            }
        }
        if env.is_empty() {
            container.remove("env");
        }
        let mounts = container.get_mut("volumeMounts").unwrap().as_array_mut().unwrap();
        assert_eq!(
            mounts.pop().unwrap(),
            serde_json::json!({ "name": "gpuprof", "mountPath": "/gpuprof", "readOnly": true }),
            "{name}"
        );
        if mounts.is_empty() {
            container.remove("volumeMounts");
        }
    }
}

fn pod_spec(document: &mut Value) -> &mut Value {
    let kind = document["kind"].as_str().unwrap().to_string();
    match kind.as_str() {
        "Pod" => &mut document["spec"],
        "CronJob" => &mut document["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &mut document["spec"]["template"]["spec"],
    }
}

#[test]
fn inject_adds_the_sidecar_to_every_pod_template_and_nothing_else() {
    let input = fixture("workloads.yaml");
    let output = inject(&[], &input);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stderr),
        format!("gpuprof: injected document 1 (Pod notebook), document 2 (Job train), document 3 (Deployment inference), document 5 (StatefulSet embeddings), document 6 (CronJob nightly-eval); already injected none; no pod template (unchanged) document 4 (Service inference)\n{NO_TOKEN}")
    );
    let injected = text(&output.stdout);
    let objects = yaml_documents(&injected);
    let originals = yaml_documents(&input);
    assert_eq!(objects.len(), 6);
    // Kubernetes' own schemas accept them: native sidecars are 1.29+, the oldest checked is 1.30.
    validate(&scratch("inject_workloads"), &objects);

    // Only GPU containers where some ask for one; every container where none does.
    let targets: [&[&str]; 6] = [&["jupyter"], &["trainer"], &["server"], &[], &["encoder"], &["eval"]];
    for ((mut object, original), targets) in objects.into_iter().zip(originals).zip(targets) {
        if !targets.is_empty() {
            take_out_sidecar(pod_spec(&mut object), &DEFAULTS, targets);
        }
        assert_eq!(object, original);
    }
    // The Job's own LD_PRELOAD stays, after the shim; its init container runs after the sidecar.
    let job = &yaml_documents(&injected)[1]["spec"]["template"]["spec"];
    assert_eq!(job["containers"][0]["env"][0]["value"], format!("{SHIM}:/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"));
    assert_eq!(job["initContainers"][1]["name"], "fetch-data");
    // Written so that YAML 1.1 and 1.2 read the same: 0755 is 493, yes is true.
    assert!(injected.contains("defaultMode: 493\n") && injected.contains("tty: true\n"), "{injected}");

    // Again: nothing changes.
    let again = inject(&[], &injected);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), injected);
    assert!(
        text(&again.stderr)
            .starts_with("gpuprof: injected none; already injected document 1 (Pod notebook), document 2 (Job train)"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn inject_takes_the_collector_the_token_the_containers_and_cuda_injection() {
    let job = training_job();
    let dir = scratch("inject_flags");
    let job_file = dir.join("job.yaml");
    std::fs::write(&job_file, &job).unwrap();
    let out_file = dir.join("job.profiled.yaml");
    let args = [
        job_file.to_str().unwrap(),
        "-o",
        out_file.to_str().unwrap(),
        "--image",
        "registry.example/gpuprof:0.1.0",
        "--collector",
        "http://otel.monitoring:4318",
        "--otlp-protocol",
        "http",
        "--token-secret",
        "gpuprof-auth/token",
        "--container",
        "log-shipper",
        "--container",
        "trainer",
        "--via",
        "cuda-injection",
        "--port",
        "9500",
    ];
    let output = inject(&args, "");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(output.stdout.is_empty());
    let mut object = yaml_document(&std::fs::read_to_string(&out_file).unwrap());
    validate(&dir, &[object.clone()]);
    let expected = Expected {
        image: "registry.example/gpuprof:0.1.0",
        collector: "http://otel.monitoring:4318",
        protocol: "http",
        port: 9500,
        token: Some(("gpuprof-auth", "token")),
        variable: "CUDA_INJECTION64_PATH",
        ..DEFAULTS
    };
    take_out_sidecar(pod_spec(&mut object), &expected, &["log-shipper", "trainer"]);
    assert_eq!(object, yaml_document(&job));
}

#[test]
fn inject_patches_each_replica_of_a_pytorchjob() {
    let input = fixture("pytorchjob.yaml");
    let output = inject(&[], &input);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        text(&output.stderr),
        format!("gpuprof: injected document 1 (PyTorchJob ddp); already injected none; no pod template (unchanged) none\n{NO_TOKEN}")
    );
    let mut object = yaml_document(&text(&output.stdout));
    // No schema knows PyTorchJob: each replica's pod template is validated as a Pod.
    let pods: Vec<Value> = ["Master", "Worker"]
        .iter()
        .map(|role| serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": role.to_lowercase() }, "spec": object["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"] }))
        .collect();
    validate(&scratch("inject_pytorchjob"), &pods);
    for role in ["Master", "Worker"] {
        take_out_sidecar(&mut object["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"], &DEFAULTS, &["pytorch"]);
    }
    assert_eq!(object, yaml_document(&input));
}

#[test]
fn inject_refuses_what_it_cannot_patch_and_writes_nothing() {
    let refused = fixture("refused.yaml");
    let documents: Vec<&str> = refused.split("\n---\n").collect();
    let cases = [
        (documents[0], "gpuprof: error: stdin: document 1 (Job preload-from-configmap): cannot inject: container trainer sets LD_PRELOAD from valueFrom: gpuprof cannot put its shim in front; set it literally, or use --via cuda-injection"),
        (documents[1], "gpuprof: error: stdin: document 1 (Pod volume-taken): cannot inject: it already has a volume named gpuprof that is not gpuprof's: rename that volume"),
        (documents[2], "gpuprof: error: stdin: document 1 (Deployment no-template): cannot inject: it has no spec.template.spec"),
        (documents[3], "gpuprof: error: stdin: document 1 (no kind no-kind): cannot inject: it names no kind: every Kubernetes object has apiVersion and kind"),
        ("kind: [Pod", "gpuprof: error: stdin: not YAML: "),
    ];
    for (input, said) in cases {
        let output = inject(&[], input);
        assert_eq!(output.status.code(), Some(1), "{input}");
        assert!(output.stdout.is_empty());
        let stderr = text(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(said), "{stderr}");
    }
    // A refused document anywhere in a stream: nothing of the stream is written.
    let stream = format!("{}\n---\n{}", fixture("pytorchjob.yaml"), documents[1]);
    let output = inject(&[], &stream);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert!(text(&output.stderr).contains("document 2 (Pod volume-taken)"), "{}", text(&output.stderr));
    let job = training_job();
    let output = inject(&["--container", "trainr"], &job);
    assert_eq!(text(&output.stderr), "gpuprof: error: stdin: document 1 (Job train): cannot inject: it has no container named trainr (it has trainer, log-shipper): check --container\n");
}

/// Sidecar mode: the chart runs no DaemonSet and writes the settings `gpuprof inject --settings`
/// takes — this release's collector, the image, the token's Secret — and a flag still wins.
#[test]
fn the_charts_sidecar_settings_are_what_inject_gives_each_pod() {
    let objects = yaml_documents(&render_with_token(&[
        "--set",
        "daemon.enabled=false",
        "--set",
        "sidecar.enabled=true",
        "--set",
        "sidecar.image.tag=0.1.0-rc1",
        "--set",
        "sidecar.tokenSecret=ml-gpuprof-token",
        "--set",
        "sidecar.port=9500",
    ]));
    assert!(objects.iter().all(|o| o["kind"] != "DaemonSet"));
    let dir = scratch("inject_chart");
    validate(&dir, &objects);
    let config = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "gpuprof-sidecar")
        .expect("the sidecar's ConfigMap");
    let settings = dir.join("gpuprof-sidecar.yaml");
    std::fs::write(&settings, config["data"]["settings.yaml"].as_str().unwrap()).unwrap();
    let job = training_job();
    let output = inject(&["--settings", settings.to_str().unwrap()], &job);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut object = yaml_document(&text(&output.stdout));
    let expected = Expected {
        image: "gpuprof:0.1.0-rc1",
        collector: "http://gpuprof-collector.gpuprof.svc:4317",
        protocol: "grpc",
        port: 9500,
        token: Some(("ml-gpuprof-token", "token")),
        ..DEFAULTS
    };
    take_out_sidecar(pod_spec(&mut object), &expected, &["trainer"]);
    assert_eq!(object, yaml_document(&job));

    let output = inject(&["--settings", settings.to_str().unwrap(), "--image", "registry.example/gpuprof:2"], &job);
    let object = yaml_document(&text(&output.stdout));
    assert_eq!(object["spec"]["template"]["spec"]["initContainers"][0]["image"], "registry.example/gpuprof:2");
    // A setting gpuprof does not know is refused, naming it.
    std::fs::write(&settings, "image: x\ncolector: http://c:4317\n").unwrap();
    let output = inject(&["--settings", settings.to_str().unwrap()], &job);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stderr),
        format!("gpuprof: error: the settings {}: colector is not a setting (image, imagePullPolicy, collector, otlpProtocol, tokenSecret, port, via, capture)\n", settings.display())
    );
}

/// `--capture ebpf`: the pod shares its process namespace with the sidecar, which gets what
/// loading probes takes (and no more); the workload's containers are left as they were.
#[test]
fn inject_with_ebpf_shares_the_pods_processes_and_leaves_the_workload_alone() {
    let job = training_job();
    let output = inject(&["--capture", "ebpf"], &job);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut object = yaml_document(&text(&output.stdout));
    validate(&scratch("inject_ebpf"), &[object.clone()]);
    take_out_sidecar(pod_spec(&mut object), &Expected { ebpf: true, ..DEFAULTS }, &["trainer"]);
    assert_eq!(object, yaml_document(&job));
    // A pod in the host's pid namespace would show the sidecar the whole node.
    let host = "apiVersion: v1\nkind: Pod\nmetadata: {name: host}\nspec:\n  hostPID: true\n  containers: [{name: main, image: busybox}]\n";
    let output = inject(&["--capture", "ebpf"], host);
    assert_eq!(
        text(&output.stderr),
        "gpuprof: error: stdin: document 1 (Pod host): cannot inject: it runs in the host's pid namespace (hostPID): an eBPF sidecar would see the node's processes; use the shim (--capture shim) or the node daemon\n"
    );
}
