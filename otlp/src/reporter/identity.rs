//! Who a process is, for the OTLP resource: the node, its command line, and where it runs in
//! Kubernetes — the pod and container from its cgroup path, the pod's name and namespace from
//! the downward-API variables in its environment (Kubernetes' own `K8S_*` only: a generic
//! `POD_NAME` or `CONTAINER_NAME` on a plain machine says nothing of Kubernetes) — and the node's
//! GPUs.

use std::fs;

use crate::resource::ProcessIdentity;

/// Kubernetes' downward-API names of the pod, its namespace and the container, as docs/deploy.md
/// asks a workload to set them (`gpuprof inject` gives its sidecar the pod's, `fleet/src/inject`).
const K8S_POD_NAME: &str = "K8S_POD_NAME";
const K8S_NAMESPACE: &str = "K8S_NAMESPACE";
const K8S_CONTAINER_NAME: &str = "K8S_CONTAINER_NAME";

/// The node's name: `--node-name`, else `K8S_NODE_NAME` (the downward API in a DaemonSet), else
/// the kernel's host name.
pub fn node_name(given: Option<&str>) -> String {
    if let Some(name) = given {
        return name.to_string();
    }
    if let Ok(name) = std::env::var("K8S_NODE_NAME") {
        if !name.is_empty() {
            return name;
        }
    }
    fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

/// The UUIDs of the NVIDIA GPUs the driver lists, in bus order.
pub(crate) fn gpu_uuids() -> Vec<String> {
    let Ok(entries) = fs::read_dir("/proc/driver/nvidia/gpus") else { return Vec::new() };
    let mut buses: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    buses.sort();
    buses
        .iter()
        .filter_map(|bus| fs::read_to_string(bus.join("information")).ok())
        .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("GPU UUID:")).map(|u| u.trim().to_string()))
        .collect()
}

/// What /proc says of a live process (fields stay empty for one that is gone).
pub(crate) fn of_process(
    pid: u32,
    node: &str,
    gpus: &[String],
    comm: &str,
    parent_pid: Option<u32>,
) -> ProcessIdentity {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok().map(|raw| command_line(&raw)).filter(|c| !c.is_empty());
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let (container_id, pod_uid) = kubernetes_of_cgroup(&cgroup);
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let env = |name| variable(&environ, name);
    ProcessIdentity {
        host_name: node.to_string(),
        pid,
        parent_pid,
        executable: comm.to_string(),
        command_line: cmdline,
        container_id,
        k8s_pod_uid: pod_uid,
        k8s_pod_name: env(K8S_POD_NAME),
        k8s_namespace: env(K8S_NAMESPACE),
        k8s_node_name: std::env::var("K8S_NODE_NAME").ok().filter(|n| !n.is_empty()),
        k8s_container_name: env(K8S_CONTAINER_NAME),
        gpu_uuids: gpus.to_vec(),
    }
}

/// The pod a sidecar runs in, from its own downward-API environment: its processes' /proc is
/// another pid namespace's (or none at all), so the pod speaks for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub node: Option<String>,
    /// The profiled container, when the pod profiles one.
    pub container: Option<String>,
    /// The processes are in the sidecar's pid namespace (an eBPF sidecar, the pod's namespace
    /// shared): their /proc is read, and the pod fills in what it does not say.
    pub processes_visible: bool,
}

impl PodIdentity {
    /// From K8S_POD_NAME, K8S_NAMESPACE, K8S_POD_UID (else this container's cgroup),
    /// K8S_NODE_NAME and GPUPROF_WORKLOAD_CONTAINER (one name; several leave it unsaid): the
    /// variables `gpuprof inject` gives the sidecar, Kubernetes' own.
    pub fn from_environment() -> PodIdentity {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let uid = var("K8S_POD_UID")
            .or_else(|| kubernetes_of_cgroup(&fs::read_to_string("/proc/self/cgroup").unwrap_or_default()).1);
        PodIdentity {
            name: var(K8S_POD_NAME),
            namespace: var(K8S_NAMESPACE),
            uid,
            node: var("K8S_NODE_NAME"),
            container: var("GPUPROF_WORKLOAD_CONTAINER").filter(|names| !names.contains(',')),
            processes_visible: false,
        }
    }

    /// A process of the pod, as /proc says it (visible processes) or as its shim said it.
    pub(crate) fn identify(
        &self,
        pid: u32,
        node: &str,
        gpus: &[String],
        comm: &str,
        parent_pid: Option<u32>,
    ) -> ProcessIdentity {
        if !self.processes_visible {
            return self.process(pid, node, gpus, comm, parent_pid);
        }
        let mut identity = of_process(pid, node, gpus, comm, parent_pid);
        let fill = |field: &mut Option<String>, value: &Option<String>| {
            if field.is_none() {
                field.clone_from(value);
            }
        };
        fill(&mut identity.k8s_pod_uid, &self.uid);
        fill(&mut identity.k8s_pod_name, &self.name);
        fill(&mut identity.k8s_namespace, &self.namespace);
        fill(&mut identity.k8s_node_name, &self.node);
        fill(&mut identity.k8s_container_name, &self.container);
        identity
    }

    /// A process of the pod: its pid and name as its shim said them.
    pub(crate) fn process(
        &self,
        pid: u32,
        node: &str,
        gpus: &[String],
        comm: &str,
        parent_pid: Option<u32>,
    ) -> ProcessIdentity {
        ProcessIdentity {
            host_name: node.to_string(),
            pid,
            parent_pid,
            executable: comm.to_string(),
            command_line: None,
            container_id: None,
            k8s_pod_uid: self.uid.clone(),
            k8s_pod_name: self.name.clone(),
            k8s_namespace: self.namespace.clone(),
            k8s_node_name: self.node.clone(),
            k8s_container_name: self.container.clone(),
            gpu_uuids: gpus.to_vec(),
        }
    }
}

/// NUL-separated arguments joined by spaces.
fn command_line(raw: &[u8]) -> String {
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>().join(" ")
}

fn variable(environ: &[u8], name: &str) -> Option<String> {
    environ.split(|b| *b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        let value = entry.strip_prefix(name)?.strip_prefix('=')?;
        (!value.is_empty()).then(|| value.to_string())
    })
}

/// (container id, pod uid) from /proc/PID/cgroup, for the layouts the kubelet and container
/// runtimes write: cgroupfs (`/kubepods/burstable/pod<uid>/<id>`) and systemd
/// (`…-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`), docker and cri-o alike.
pub(crate) fn kubernetes_of_cgroup(cgroup: &str) -> (Option<String>, Option<String>) {
    let mut container = None;
    let mut pod = None;
    for line in cgroup.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for segment in path.split('/') {
            if let Some(uid) = pod_uid(segment) {
                pod = Some(uid);
            }
            if let Some(id) = container_id(segment) {
                container = Some(id);
            }
        }
    }
    (container, pod)
}

fn pod_uid(segment: &str) -> Option<String> {
    // The last "pod": "kubepods-burstable-pod<uid>" names the pod after the class.
    let at = segment.rfind("pod")?;
    let uid: String = segment[at + 3..].chars().take(36).collect();
    let looks_like_uid = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-' || c == '_');
    looks_like_uid.then(|| uid.replace('_', "-"))
}

fn container_id(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = name.rsplit(['-', ':']).next().unwrap_or(name);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f8e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f";

    #[test]
    fn pod_and_container_from_systemd_and_cgroupfs_layouts() {
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5f1c0e1e_0000_4000_8000_000000000001.slice/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(
            kubernetes_of_cgroup(&systemd),
            (Some(ID.to_string()), Some("5f1c0e1e-0000-4000-8000-000000000001".to_string()))
        );
        let cgroupfs = format!("12:memory:/kubepods/burstable/pod5f1c0e1e-0000-4000-8000-000000000002/{ID}\n");
        assert_eq!(
            kubernetes_of_cgroup(&cgroupfs),
            (Some(ID.to_string()), Some("5f1c0e1e-0000-4000-8000-000000000002".to_string()))
        );
        assert_eq!(
            kubernetes_of_cgroup(&format!("0::/system.slice/docker-{ID}.scope\n")),
            (Some(ID.to_string()), None)
        );
        assert_eq!(kubernetes_of_cgroup("0::/user.slice/user-0.slice/session-1.scope\n"), (None, None));
    }

    #[test]
    fn downward_api_variables_and_command_line() {
        let environ = b"PATH=/bin\0K8S_POD_NAME=trainer-0\0K8S_NAMESPACE=\0";
        assert_eq!(variable(environ, "K8S_POD_NAME").as_deref(), Some("trainer-0"));
        assert_eq!(variable(environ, "K8S_NAMESPACE"), None);
        assert_eq!(command_line(b"python3\0train.py\0--epochs\x003\0"), "python3 train.py --epochs 3");
    }

    #[test]
    fn kubernetes_names_come_from_kubernetes_variables_alone() {
        // What a plain machine's process may have: no Kubernetes in it.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs([("CONTAINER_NAME", "trainer"), ("POD_NAME", "trainer-0"), ("POD_NAMESPACE", "ml")])
            .spawn()
            .expect("sleep runs");
        let identity = of_process(child.id(), "node-a", &[], "sleep", None);
        child.kill().expect("the child is ours");
        child.wait().expect("the child is ours");
        assert_eq!((identity.k8s_pod_name, identity.k8s_namespace, identity.k8s_container_name), (None, None, None));
    }
}
