//! Who a process is, for the OTLP resource: the node, its command line, the job it is one rank
//! of, and where it runs in Kubernetes — the pod and container from its cgroup path, the pod's
//! name, namespace and Job from the downward-API variables in its environment (Kubernetes'
//! own `K8S_*` only: a generic `POD_NAME` or `CONTAINER_NAME` on a plain machine says nothing of
//! Kubernetes) — and the node's GPUs.

use std::fs;

use gpuprof_model::job::{self, Job, K8S_JOB_NAME_VARIABLE, K8S_NAMESPACE_VARIABLE};
use gpuprof_model::{Event, Layer};

use crate::resource::ProcessIdentity;

/// Kubernetes' downward-API names of the pod and the container, as docs/deploy.md asks a
/// workload to set them (`gpuprof inject` gives its sidecar the pod's, `fleet/src/inject`).
const K8S_POD_NAME: &str = "K8S_POD_NAME";
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

/// What /proc says of a live process (fields stay empty for one that is gone, and its job is
/// then one of its own).
pub(crate) fn of_process(
    pid: u32,
    node: &str,
    gpus: &[String],
    comm: &str,
    parent_pid: Option<u32>,
) -> ProcessIdentity {
    of_process_in(pid, node, gpus, comm, parent_pid, None)
}

/// `of_process`, `unnamed_job` the job of a process whose environment names none (its pod's),
/// before the launcher process it was started under.
fn of_process_in(
    pid: u32,
    node: &str,
    gpus: &[String],
    comm: &str,
    parent_pid: Option<u32>,
    unnamed_job: Option<String>,
) -> ProcessIdentity {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok().map(|raw| command_line(&raw)).filter(|c| !c.is_empty());
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let (container_id, pod_uid) = kubernetes_of_cgroup(&cgroup);
    let environ = gpuprof_procfs::process::start_environment(pid).unwrap_or_default();
    let env = |name| text(environ.value(name));
    // The capture reads the same at the process's first call and puts it on that event
    // (`learn_job`); read here too, the records before that call name the job already.
    let started_as = Job::from_environment(|name| environ.value(name));
    let job_id = started_as.id.or(unnamed_job).unwrap_or_else(|| match gpuprof_procfs::process::process_group(pid) {
        Some(group) => job::launcher_group_id(node, group),
        None => job::process_id(node, pid),
    });
    ProcessIdentity {
        host_name: node.to_string(),
        pid,
        parent_pid,
        executable: comm.to_string(),
        command_line: cmdline,
        container_id,
        k8s_pod_uid: pod_uid,
        k8s_pod_name: env(K8S_POD_NAME),
        k8s_namespace: env(K8S_NAMESPACE_VARIABLE),
        k8s_node_name: std::env::var("K8S_NODE_NAME").ok().filter(|n| !n.is_empty()),
        k8s_container_name: env(K8S_CONTAINER_NAME),
        k8s_job_name: env(K8S_JOB_NAME_VARIABLE),
        job_id,
        rank: started_as.rank,
        local_rank: started_as.local_rank,
        world_size: started_as.world_size,
        gpu_uuids: gpus.to_vec(),
    }
}

/// Whether `event` says anything of its process's job (a first call may; the rest do not).
pub(crate) fn says_job(event: &Event) -> bool {
    event.job.is_some() || event.rank.is_some() || event.local_rank.is_some() || event.world_size.is_some()
}

/// What a process's first call says of its job (the capture read its start environment there,
/// or its shim said it) replaces what its identity was made with: a pod's process the node
/// cannot read learns its rank only so.
pub(crate) fn learn_job(identity: &mut ProcessIdentity, event: &Event) {
    if event.layer == Layer::Process {
        return;
    }
    if let Some(id) = &event.job {
        identity.job_id = id.to_string();
    }
    let learn = |field: &mut Option<u32>, value: Option<u32>| {
        if value.is_some() {
            *field = value;
        }
    };
    learn(&mut identity.rank, event.rank);
    learn(&mut identity.local_rank, event.local_rank);
    learn(&mut identity.world_size, event.world_size);
}

/// The pod a sidecar runs in, from its own downward-API environment: its processes' /proc is
/// another pid namespace's (or none at all), so the pod speaks for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub node: Option<String>,
    /// The Kubernetes Job owning the pod (`K8S_JOB_NAME`).
    pub job_name: Option<String>,
    /// The profiled container, when the pod profiles one.
    pub container: Option<String>,
    /// The processes are in the sidecar's pid namespace (an eBPF sidecar, the pod's namespace
    /// shared): their /proc is read, and the pod fills in what it does not say.
    pub processes_visible: bool,
}

impl PodIdentity {
    /// From K8S_POD_NAME, K8S_NAMESPACE, K8S_POD_UID (else this container's cgroup),
    /// K8S_NODE_NAME, K8S_JOB_NAME and GPUPROF_WORKLOAD_CONTAINER (one name; several leave it
    /// unsaid): the variables `gpuprof inject` gives the sidecar, Kubernetes' own.
    pub fn from_environment() -> PodIdentity {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let uid = var("K8S_POD_UID")
            .or_else(|| kubernetes_of_cgroup(&fs::read_to_string("/proc/self/cgroup").unwrap_or_default()).1);
        PodIdentity {
            name: var(K8S_POD_NAME),
            namespace: var(K8S_NAMESPACE_VARIABLE),
            uid,
            node: var("K8S_NODE_NAME"),
            job_name: job::kubernetes_owner(var),
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
        let mut identity = of_process_in(pid, node, gpus, comm, parent_pid, self.job_id());
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
        fill(&mut identity.k8s_job_name, &self.job_name);
        identity
    }

    /// The id of the Kubernetes Job owning the pod, where the pod says it and its namespace.
    fn job_id(&self) -> Option<String> {
        Some(job::kubernetes_job_id(self.namespace.as_deref()?, self.job_name.as_deref()?))
    }

    /// A process of the pod: its pid and name as its shim said them; its job the pod's Job,
    /// else the pod (what its first call says replaces it: `learn_job`).
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
            k8s_job_name: self.job_name.clone(),
            job_id: self.job_id().unwrap_or_else(|| job::pod_id(node, self.namespace.as_deref(), self.name.as_deref())),
            rank: None,
            local_rank: None,
            world_size: None,
            gpu_uuids: gpus.to_vec(),
        }
    }
}

/// NUL-separated arguments joined by spaces.
fn command_line(raw: &[u8]) -> String {
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>().join(" ")
}

/// A variable's value as text, when it is UTF-8 and not empty.
fn text(value: Option<&[u8]>) -> Option<String> {
    std::str::from_utf8(value?).ok().filter(|v| !v.is_empty()).map(str::to_string)
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
    use std::os::unix::process::CommandExt;

    use gpuprof_model::{Op, Source};

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
    fn command_line_is_the_arguments_joined() {
        assert_eq!(command_line(b"python3\0train.py\0--epochs\x003\0"), "python3 train.py --epochs 3");
    }

    /// A process started with only `environment` (and a PATH), in a process group of its own.
    fn started_with(environment: &[(&str, &str)]) -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(environment.iter().copied())
            .process_group(0)
            .spawn()
            .expect("sleep runs")
    }

    fn identity_of(environment: &[(&str, &str)]) -> (u32, ProcessIdentity) {
        let mut child = started_with(environment);
        let identity = of_process(child.id(), "node-a", &[], "sleep", None);
        child.kill().expect("the child is ours");
        child.wait().expect("the child is ours");
        (child.id(), identity)
    }

    #[test]
    fn kubernetes_names_come_from_kubernetes_variables_alone() {
        // What a plain machine's process may have: no Kubernetes in it.
        let (pid, identity) =
            identity_of(&[("CONTAINER_NAME", "trainer"), ("POD_NAME", "trainer-0"), ("POD_NAMESPACE", "ml")]);
        assert_eq!(
            (identity.k8s_pod_name, identity.k8s_namespace, identity.k8s_container_name, identity.k8s_job_name),
            (None, None, None, None)
        );
        // No job named: the launcher process it was started under (its own group here).
        assert_eq!(identity.job_id, format!("node-a/pgid-{pid}"));

        let (_, identity) = identity_of(&[
            ("K8S_POD_NAME", "trainer-0"),
            ("K8S_NAMESPACE", "ml"),
            ("K8S_CONTAINER_NAME", "main"),
            ("K8S_JOB_NAME", "pretrain"),
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
        ]);
        let named = |v: &str| Some(v.to_string());
        assert_eq!(
            (identity.k8s_pod_name, identity.k8s_namespace, identity.k8s_container_name, identity.k8s_job_name),
            (named("trainer-0"), named("ml"), named("main"), named("pretrain"))
        );
        assert_eq!(
            (identity.job_id.as_str(), identity.rank, identity.local_rank, identity.world_size),
            ("k8s:ml/pretrain", Some(1), Some(1), Some(2))
        );
    }

    #[test]
    fn this_process_is_its_launchers_job_unless_its_environment_names_one() {
        let me = std::process::id();
        // procfs's own test holds its reading of the group to getpgrp's.
        let group = gpuprof_procfs::process::process_group(me).expect("this process is readable");
        let environment: Vec<(String, String)> = std::env::vars().collect();
        let named =
            Job::from_environment(|name| environment.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_bytes()));
        let expected = named.id.unwrap_or_else(|| format!("node-a/pgid-{group}"));
        assert_eq!(of_process(me, "node-a", &[], "test", None).job_id, expected);
    }

    #[test]
    fn a_process_gone_before_it_was_read_is_a_job_of_its_own() {
        let mut child = started_with(&[]);
        child.kill().expect("the child is ours");
        child.wait().expect("the child is ours");
        let identity = of_process(child.id(), "node-a", &[], "sleep", None);
        assert_eq!(identity.job_id, format!("node-a/pid-{}", child.id()));
    }

    fn pod(job_name: Option<&str>) -> PodIdentity {
        PodIdentity {
            name: Some("trainer-0".into()),
            namespace: Some("ml".into()),
            uid: None,
            node: Some("node-a".into()),
            job_name: job_name.map(str::to_string),
            container: Some("main".into()),
            processes_visible: false,
        }
    }

    #[test]
    fn a_pods_unseen_process_is_its_jobs_else_its_pods_until_its_first_call_says() {
        let identity = pod(Some("pretrain")).process(7, "node-a", &[], "python3", None);
        assert_eq!((identity.job_id.as_str(), identity.k8s_job_name.as_deref()), ("k8s:ml/pretrain", Some("pretrain")));
        assert_eq!(pod(None).process(7, "node-a", &[], "python3", None).job_id, "k8s:ml/trainer-0");
        let nameless = PodIdentity { name: None, ..pod(None) };
        assert_eq!(nameless.process(7, "node-a", &[], "python3", None).job_id, "node-a/pod");

        let mut identity = pod(None).process(7, "node-a", &[], "python3", None);
        let mut exit = Event::new(1, 7, 7, Source::Shim, Layer::Process, Op::Exit, "exit".into());
        exit.job = Some("torchrun:r7".into());
        learn_job(&mut identity, &exit);
        assert_eq!(identity.job_id, "k8s:ml/trainer-0");
        let mut first = Event::new(2, 7, 7, Source::Shim, Layer::Driver, Op::Alloc, "cuMemAlloc_v2".into());
        first.rank = Some(1);
        first.world_size = Some(2);
        learn_job(&mut identity, &first);
        assert_eq!(
            (identity.job_id.as_str(), identity.rank, identity.local_rank, identity.world_size),
            ("k8s:ml/trainer-0", Some(1), None, Some(2))
        );
        first.job = Some("torchrun:r7".into());
        learn_job(&mut identity, &first);
        assert_eq!(identity.job_id, "torchrun:r7");
    }
}
