//! Which distributed job a process is one rank of. People think in jobs — a training run is many
//! ranks on many nodes — so each process carries its job's id, its rank, local rank and the
//! job's world size, as the launcher that started it said them in its environment. A live
//! capture reads them at the process's first call (`start_environment`) and puts them on that
//! event (`Event::job`, `rank`, `local_rank`, `world_size`); the OTLP resource names them.
//!
//! An id is qualified by the launcher that named it (`torchrun:…`, `slurm:…`, `mpi:…`,
//! `k8s:…`), so two launchers' ids cannot collide. A process whose environment names no job
//! still belongs to one: `launcher_group_id`, `pod_id` and `process_id` name it from what the
//! node knows.

use crate::rank::{self, RANK_VARIABLE};

/// What a user sets when nothing else names the job: taken as given, before any launcher's.
pub const JOB_ID_VARIABLE: &str = "GPUPROF_JOB_ID";
/// The downward-API variables a chart or injector sets from the pod's owner labels and
/// metadata: the Kubernetes Job (or JobSet, PyTorchJob) owning the pod, and its namespace.
pub const K8S_JOB_NAME_VARIABLE: &str = "K8S_JOB_NAME";
pub const K8S_NAMESPACE_VARIABLE: &str = "K8S_NAMESPACE";
/// The pod's JobSet and training operator's job (PyTorchJob…), which `gpuprof inject` gives a
/// sidecar from the pod's labels: the job its ranks are one of, before a child batch Job's name.
pub const K8S_JOBSET_NAME_VARIABLE: &str = "GPUPROF_K8S_JOBSET_NAME";
pub const K8S_TRAINING_JOB_NAME_VARIABLE: &str = "GPUPROF_K8S_TRAINING_JOB_NAME";

/// The pod's owner as a sidecar's downward-API variables name it (`value_of` a variable, empty
/// as absent): its JobSet, else its training operator's job, else its batch Job.
pub fn kubernetes_owner(value_of: impl Fn(&str) -> Option<String>) -> Option<String> {
    [K8S_JOBSET_NAME_VARIABLE, K8S_TRAINING_JOB_NAME_VARIABLE, K8S_JOB_NAME_VARIABLE]
        .iter()
        .find_map(|name| value_of(name).filter(|v| !v.is_empty()))
}
/// torch elastic's rendezvous id (torchrun's `--rdzv-id`).
const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
/// torchrun's default `--rdzv-id`: every run that did not choose one has it, on every node, so
/// it names no job.
const TORCHELASTIC_NO_RUN_ID: &str = "none";
const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
const SLURM_STEP_ID: &str = "SLURM_STEP_ID";
/// Open MPI's job: its PMIx namespace (Open MPI 5), else ORTE's job id (before 5). MPICH's
/// Hydra is left out of the id: no documentation we could find names a job-id variable it sets
/// (its ranks below are taken).
const OMPI_NAMESPACES: [&str; 2] = ["PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"];

/// The variables torchrun, torch.distributed, DeepSpeed and Accelerate set, taken first.
const LOCAL_RANK_VARIABLE: &str = "LOCAL_RANK";
const WORLD_SIZE_VARIABLE: &str = "WORLD_SIZE";

/// One launcher's own rank, local rank and world size variables.
struct Launcher {
    rank: &'static str,
    local_rank: &'static str,
    world_size: &'static str,
}

/// Launchers whose ranks are taken where `RANK` is not set, in this order: Open MPI, MPICH's
/// Hydra (and Intel MPI, which is one), Slurm's `srun`.
const LAUNCHERS: [Launcher; 3] = [
    Launcher {
        rank: "OMPI_COMM_WORLD_RANK",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        world_size: "OMPI_COMM_WORLD_SIZE",
    },
    Launcher { rank: "PMI_RANK", local_rank: "MPI_LOCALRANKID", world_size: "PMI_SIZE" },
    Launcher { rank: "SLURM_PROCID", local_rank: "SLURM_LOCALID", world_size: "SLURM_NTASKS" },
];

/// The job a process is one rank of, as its start environment says it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Job {
    /// The job's id, qualified by its launcher: `GPUPROF_JOB_ID` as given, else
    /// `k8s:<namespace>/<job name>`, `torchrun:<run id>`, `slurm:<job>[.<step>]` or
    /// `mpi:<namespace>`; `None` when the environment names no job.
    pub id: Option<String>,
    /// `RANK`, else the launcher's own rank (only where its world holds more than one process).
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, else the launcher's own (as `rank`): the rank among the job's processes on
    /// this node.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE`, else the launcher's own: how many processes the job has.
    pub world_size: Option<u32>,
}

impl Job {
    /// What an environment says, `value_of` a variable's value as the process was given it.
    pub fn from_environment<'a>(value_of: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        let number = |name: &str| value_of(name).and_then(rank::parse);
        // The launcher whose world the process is one of. One whose world is one process gives
        // every process rank 0 (a Slurm step of one task, an allocation's own shell): no rank
        // of a job, only its world size where no launcher has more.
        let launcher = LAUNCHERS.iter().find(|launcher| number(launcher.world_size).is_some_and(|size| size > 1));
        let of_launcher = |name: fn(&Launcher) -> &'static str| launcher.and_then(|launcher| number(name(launcher)));
        Job {
            id: id_of(&|name| {
                value_of(name).map(|v| String::from_utf8_lossy(v).into_owned()).filter(|v| !v.is_empty())
            }),
            rank: number(RANK_VARIABLE).or_else(|| of_launcher(|l| l.rank)),
            local_rank: number(LOCAL_RANK_VARIABLE).or_else(|| of_launcher(|l| l.local_rank)),
            world_size: number(WORLD_SIZE_VARIABLE)
                .or_else(|| of_launcher(|l| l.world_size))
                .or_else(|| LAUNCHERS.iter().find_map(|launcher| number(launcher.world_size))),
        }
    }
}

/// The launcher-qualified id the environment names, `text` a variable's non-empty value.
fn id_of(text: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(id) = text(JOB_ID_VARIABLE) {
        return Some(id);
    }
    if let (Some(namespace), Some(name)) = (text(K8S_NAMESPACE_VARIABLE), text(K8S_JOB_NAME_VARIABLE)) {
        return Some(kubernetes_job_id(&namespace, &name));
    }
    if let Some(run) = text(TORCHELASTIC_RUN_ID).filter(|run| run != TORCHELASTIC_NO_RUN_ID) {
        return Some(format!("torchrun:{run}"));
    }
    if let Some(job) = text(SLURM_JOB_ID) {
        return Some(match text(SLURM_STEP_ID) {
            Some(step) => format!("slurm:{job}.{step}"),
            None => format!("slurm:{job}"),
        });
    }
    if text(LAUNCHERS[0].world_size).is_some() {
        if let Some(namespace) = OMPI_NAMESPACES.iter().find_map(|name| text(name)) {
            return Some(format!("mpi:{namespace}"));
        }
    }
    None
}

/// The id of Kubernetes Job `name` in `namespace` (a pod's `K8S_JOB_NAME`, where the process's
/// own environment does not say it).
pub fn kubernetes_job_id(namespace: &str, name: &str) -> String {
    format!("k8s:{namespace}/{name}")
}

/// The job of a process whose environment names none: the launcher process on node `host` it
/// was started under, by the process group it is in (`group`: a shell's job, torchrun's ranks
/// and their DataLoader workers all stay in their launcher's group).
pub fn launcher_group_id(host: &str, group: u32) -> String {
    format!("{host}/pgid-{group}")
}

/// The job of a process whose environment names none and whose group the node could not read
/// (it was gone before the node looked): a job of its own.
pub fn process_id(host: &str, pid: u32) -> String {
    format!("{host}/pid-{pid}")
}

/// The job of a pod's process that the node cannot see (a sidecar's workload) and whose
/// environment names none: its pod, where the pod knows its name and namespace, else the pod
/// on node `host`.
pub fn pod_id(host: &str, namespace: Option<&str>, pod: Option<&str>) -> String {
    match (namespace, pod) {
        (Some(namespace), Some(pod)) => format!("k8s:{namespace}/{pod}"),
        _ => format!("{host}/pod"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_owner_is_its_jobset_then_its_training_job_then_its_batch_job() {
        let owner = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            kubernetes_owner(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let all = [
            (K8S_JOB_NAME_VARIABLE, "pretrain-workers-0"),
            (K8S_TRAINING_JOB_NAME_VARIABLE, ""),
            (K8S_JOBSET_NAME_VARIABLE, "pretrain"),
        ];
        assert_eq!(owner(&all).as_deref(), Some("pretrain"));
        assert_eq!(
            owner(&[(K8S_TRAINING_JOB_NAME_VARIABLE, "llama-ft"), (K8S_JOB_NAME_VARIABLE, "x")]).as_deref(),
            Some("llama-ft")
        );
        // A label the pod lacks comes as an empty value.
        assert_eq!(owner(&[(K8S_JOBSET_NAME_VARIABLE, ""), (K8S_JOB_NAME_VARIABLE, "eval")]).as_deref(), Some("eval"));
        assert_eq!(owner(&[(K8S_JOBSET_NAME_VARIABLE, "")]), None);
    }

    /// The job `environ` (as /proc/PID/environ holds it: `NAME=value` entries, each ended by a
    /// NUL) names.
    fn job_in(environ: &[u8]) -> Job {
        Job::from_environment(|name| {
            environ.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
        })
    }

    fn job(id: Option<&str>, rank: Option<u32>, local_rank: Option<u32>, world_size: Option<u32>) -> Job {
        Job { id: id.map(str::to_string), rank, local_rank, world_size }
    }

    #[test]
    fn torchrun_names_its_run_and_every_rank() {
        assert_eq!(
            job_in(b"PATH=/bin\0TORCHELASTIC_RUN_ID=llama-7b-3\0RANK=11\0LOCAL_RANK=3\0WORLD_SIZE=16\0GROUP_RANK=1\0"),
            job(Some("torchrun:llama-7b-3"), Some(11), Some(3), Some(16))
        );
        // The default rendezvous id is every run's: no job; the ranks still are the ranks.
        assert_eq!(
            job_in(b"TORCHELASTIC_RUN_ID=none\0RANK=1\0LOCAL_RANK=1\0WORLD_SIZE=2\0"),
            job(None, Some(1), Some(1), Some(2))
        );
        assert_eq!(job_in(b"TORCHELASTIC_RUN_ID=\0RANK=0\0").id, None);
    }

    #[test]
    fn slurm_names_the_job_and_its_step_and_ranks_only_a_step_of_several_tasks() {
        assert_eq!(
            job_in(b"SLURM_JOB_ID=81234\0SLURM_STEP_ID=2\0SLURM_PROCID=5\0SLURM_LOCALID=1\0SLURM_NTASKS=8\0"),
            job(Some("slurm:81234.2"), Some(5), Some(1), Some(8))
        );
        // A step of one task: every process is task 0.
        assert_eq!(
            job_in(b"SLURM_JOB_ID=81234\0SLURM_PROCID=0\0SLURM_LOCALID=0\0SLURM_NTASKS=1\0"),
            job(Some("slurm:81234"), None, None, Some(1))
        );
    }

    #[test]
    fn open_mpi_names_its_namespace_and_ranks() {
        let environ = b"OMPI_COMM_WORLD_SIZE=4\0OMPI_COMM_WORLD_RANK=2\0OMPI_COMM_WORLD_LOCAL_RANK=0\0\
PMIX_NAMESPACE=prterun-node1-4711@1\0OMPI_MCA_orte_ess_jobid=123\0";
        assert_eq!(job_in(environ), job(Some("mpi:prterun-node1-4711@1"), Some(2), Some(0), Some(4)));
        assert_eq!(
            job_in(b"OMPI_COMM_WORLD_SIZE=4\0OMPI_COMM_WORLD_RANK=3\0OMPI_MCA_orte_ess_jobid=123\0").id,
            Some("mpi:123".into())
        );
        // A PMIx namespace without Open MPI's world (another PMIx launcher) names no MPI job.
        assert_eq!(job_in(b"PMIX_NAMESPACE=ns\0").id, None);
    }

    #[test]
    fn hydra_ranks_are_taken_without_a_job() {
        assert_eq!(job_in(b"PMI_RANK=3\0PMI_SIZE=4\0MPI_LOCALRANKID=1\0"), job(None, Some(3), Some(1), Some(4)));
    }

    #[test]
    fn kubernetes_names_the_job_in_its_namespace() {
        assert_eq!(job_in(b"K8S_NAMESPACE=ml\0K8S_JOB_NAME=pretrain\0RANK=0\0").id, Some("k8s:ml/pretrain".into()));
        // A job name without its namespace, or an empty label, is no Kubernetes job.
        assert_eq!(job_in(b"K8S_JOB_NAME=pretrain\0").id, None);
        assert_eq!(job_in(b"K8S_NAMESPACE=ml\0K8S_JOB_NAME=\0").id, None);
    }

    #[test]
    fn the_first_launcher_that_names_the_job_wins() {
        let launchers = b"TORCHELASTIC_RUN_ID=r1\0SLURM_JOB_ID=7\0OMPI_COMM_WORLD_SIZE=2\0PMIX_NAMESPACE=ns\0";
        let kubernetes = b"K8S_NAMESPACE=ml\0K8S_JOB_NAME=pretrain\0";
        let everything = [&b"GPUPROF_JOB_ID=nightly-42\0"[..], launchers, kubernetes].concat();
        assert_eq!(job_in(&everything).id, Some("nightly-42".into()));
        assert_eq!(job_in(&[&launchers[..], kubernetes].concat()).id, Some("k8s:ml/pretrain".into()));
        assert_eq!(job_in(launchers).id, Some("torchrun:r1".into()));
        assert_eq!(job_in(b"TORCHELASTIC_RUN_ID=none\0SLURM_JOB_ID=7\0").id, Some("slurm:7".into()));
        assert_eq!(job_in(b"OMPI_COMM_WORLD_SIZE=2\0PMIX_NAMESPACE=ns\0SLURM_JOB_ID=\0").id, Some("mpi:ns".into()));
        assert_eq!(job_in(b"GPUPROF_JOB_ID=\0SLURM_JOB_ID=7\0").id, Some("slurm:7".into()));
    }

    #[test]
    fn rank_is_taken_first_then_each_launcher_in_turn() {
        // torchrun under srun: torchrun's ranks, not Slurm's (its tasks are the agents).
        assert_eq!(
            job_in(b"SLURM_PROCID=1\0SLURM_LOCALID=0\0SLURM_NTASKS=2\0RANK=9\0LOCAL_RANK=1\0WORLD_SIZE=16\0"),
            job(None, Some(9), Some(1), Some(16))
        );
        assert_eq!(
            job_in(b"SLURM_PROCID=1\0SLURM_NTASKS=2\0OMPI_COMM_WORLD_RANK=3\0OMPI_COMM_WORLD_SIZE=4\0"),
            job(None, Some(3), None, Some(4))
        );
        // Open MPI's world of one inside a Slurm step of two: the step's rank and world.
        assert_eq!(
            job_in(b"OMPI_COMM_WORLD_RANK=0\0OMPI_COMM_WORLD_SIZE=1\0SLURM_PROCID=1\0SLURM_NTASKS=2\0"),
            job(None, Some(1), None, Some(2))
        );
    }

    #[test]
    fn garbage_and_local_ranks_alone_are_no_rank() {
        assert_eq!(job_in(b"LOCAL_RANK=3\0GROUP_RANK=1\0"), job(None, None, Some(3), None));
        assert_eq!(job_in(b"RANK=x\0LOCAL_RANK=-1\0WORLD_SIZE=4294967296\0"), Job::default());
        assert_eq!(job_in(b"SLURM_PROCID=2\0SLURM_NTASKS=many\0"), Job::default());
        assert_eq!(job_in(b"RANK= 3\0PMI_RANK=1\0PMI_SIZE=2\0"), job(None, Some(1), None, Some(2)));
        assert_eq!(job_in(b""), Job::default());
    }

    #[test]
    fn a_process_without_a_named_job_is_its_launchers_or_its_pods() {
        assert_eq!(launcher_group_id("gpu-node-7", 4690), "gpu-node-7/pgid-4690");
        assert_eq!(process_id("gpu-node-7", 4711), "gpu-node-7/pid-4711");
        assert_eq!(kubernetes_job_id("ml", "pretrain"), "k8s:ml/pretrain");
        assert_eq!(pod_id("gpu-node-7", Some("ml"), Some("trainer-0")), "k8s:ml/trainer-0");
        assert_eq!(pod_id("gpu-node-7", None, Some("trainer-0")), "gpu-node-7/pod");
        assert_eq!(pod_id("gpu-node-7", None, None), "gpu-node-7/pod");
    }
}
