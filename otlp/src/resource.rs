//! Who emitted a batch: the process, the job it is one rank of and the node it runs on, as OTLP
//! resource attributes (`host.name` names the node; the collector correlates per node; an
//! OpenTelemetry Collector in front routes by `gpuprof.job.id`).

use gpuprof_model::otel::resource as attr;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::{attribute_int, attribute_str, kv, kv_int, kv_str};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub host_name: String,
    pub pid: u32,
    pub parent_pid: Option<u32>,
    pub executable: String,
    pub command_line: Option<String>,
    pub container_id: Option<String>,
    pub k8s_pod_uid: Option<String>,
    pub k8s_pod_name: Option<String>,
    pub k8s_namespace: Option<String>,
    pub k8s_node_name: Option<String>,
    pub k8s_container_name: Option<String>,
    /// The Kubernetes Job owning the process's pod (`K8S_JOB_NAME`), where the pod says it.
    pub k8s_job_name: Option<String>,
    /// The distributed job the process is one rank of (`gpuprof_model::job`): its launcher's
    /// id, else the launcher process on the node, else its pod. Every identity the reporter
    /// makes has one; empty only in one read back from a resource without it.
    pub job_id: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub gpu_uuids: Vec<String>,
}

impl ProcessIdentity {
    pub fn resource(&self) -> Resource {
        let mut attributes = vec![
            kv_str(attr::SERVICE_NAME, "gpuprof"),
            kv_str(attr::HOST_NAME, &self.host_name),
            kv_int(attr::PROCESS_PID, i64::from(self.pid)),
            kv_str(attr::PROCESS_EXECUTABLE_NAME, &self.executable),
            kv_str(attr::SERVICE_INSTANCE_ID, format!("{}/{}", self.host_name, self.pid)),
        ];
        if !self.job_id.is_empty() {
            attributes.push(kv_str(attr::JOB_ID, &self.job_id));
        }
        let numbers = [
            (attr::PROCESS_PARENT_PID, self.parent_pid),
            (attr::RANK, self.rank),
            (attr::LOCAL_RANK, self.local_rank),
            (attr::WORLD_SIZE, self.world_size),
        ];
        for (key, value) in numbers {
            if let Some(value) = value {
                attributes.push(kv_int(key, i64::from(value)));
            }
        }
        let optional = [
            (attr::PROCESS_COMMAND_LINE, &self.command_line),
            (attr::CONTAINER_ID, &self.container_id),
            (attr::K8S_POD_UID, &self.k8s_pod_uid),
            (attr::K8S_POD_NAME, &self.k8s_pod_name),
            (attr::K8S_NAMESPACE_NAME, &self.k8s_namespace),
            (attr::K8S_NODE_NAME, &self.k8s_node_name),
            (attr::K8S_CONTAINER_NAME, &self.k8s_container_name),
            (attr::K8S_JOB_NAME, &self.k8s_job_name),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                attributes.push(kv_str(key, value));
            }
        }
        if !self.gpu_uuids.is_empty() {
            let values = self
                .gpu_uuids
                .iter()
                .map(|u| AnyValue { value: Some(any_value::Value::StringValue(u.clone())) })
                .collect();
            attributes.push(kv(attr::GPU_UUIDS, any_value::Value::ArrayValue(ArrayValue { values })));
        }
        Resource { attributes, ..Default::default() }
    }

    /// What a resource says of its process; absent attributes stay empty.
    pub fn of_resource(resource: &Resource) -> ProcessIdentity {
        let a: &[KeyValue] = &resource.attributes;
        let text = |key| attribute_str(a, key).map(str::to_string);
        let number = |key| attribute_int(a, key).and_then(|n| u32::try_from(n).ok());
        ProcessIdentity {
            host_name: text(attr::HOST_NAME).unwrap_or_default(),
            pid: number(attr::PROCESS_PID).unwrap_or(0),
            parent_pid: number(attr::PROCESS_PARENT_PID),
            executable: text(attr::PROCESS_EXECUTABLE_NAME).unwrap_or_default(),
            command_line: text(attr::PROCESS_COMMAND_LINE),
            container_id: text(attr::CONTAINER_ID),
            k8s_pod_uid: text(attr::K8S_POD_UID),
            k8s_pod_name: text(attr::K8S_POD_NAME),
            k8s_namespace: text(attr::K8S_NAMESPACE_NAME),
            k8s_node_name: text(attr::K8S_NODE_NAME),
            k8s_container_name: text(attr::K8S_CONTAINER_NAME),
            k8s_job_name: text(attr::K8S_JOB_NAME),
            job_id: text(attr::JOB_ID).unwrap_or_default(),
            rank: number(attr::RANK),
            local_rank: number(attr::LOCAL_RANK),
            world_size: number(attr::WORLD_SIZE),
            gpu_uuids: match crate::attribute(a, attr::GPU_UUIDS) {
                Some(any_value::Value::ArrayValue(array)) => array
                    .values
                    .iter()
                    .filter_map(|v| match &v.value {
                        Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_survives_the_round_trip() {
        let identity = ProcessIdentity {
            host_name: "gpu-node-7".into(),
            pid: 4242,
            parent_pid: Some(1),
            executable: "python3".into(),
            command_line: Some("python3 train.py --epochs 3".into()),
            container_id: Some("0123abcd".into()),
            k8s_pod_uid: Some("5f1c0e1e-0000-4000-8000-000000000001".into()),
            k8s_pod_name: Some("trainer-0".into()),
            k8s_namespace: Some("ml".into()),
            k8s_node_name: Some("gpu-node-7".into()),
            k8s_container_name: None,
            k8s_job_name: Some("pretrain".into()),
            job_id: "k8s:ml/pretrain".into(),
            rank: Some(11),
            local_rank: Some(3),
            world_size: None,
            gpu_uuids: vec!["GPU-1111".into(), "GPU-2222".into()],
        };
        assert_eq!(ProcessIdentity::of_resource(&identity.resource()), identity);
    }

    #[test]
    fn a_process_resource_names_its_instance_and_its_job() {
        let identity = ProcessIdentity {
            host_name: "gpu-node-7".into(),
            pid: 4242,
            executable: "python3".into(),
            job_id: "torchrun:llama-7b-3".into(),
            rank: Some(11),
            local_rank: Some(3),
            world_size: Some(16),
            ..Default::default()
        };
        let resource = identity.resource();
        let text = |key| attribute_str(&resource.attributes, key);
        let number = |key| crate::attribute_int(&resource.attributes, key);
        assert_eq!(text(attr::SERVICE_INSTANCE_ID), Some("gpu-node-7/4242"));
        assert_eq!(text(attr::JOB_ID), Some("torchrun:llama-7b-3"));
        assert_eq!(
            (number(attr::RANK), number(attr::LOCAL_RANK), number(attr::WORLD_SIZE)),
            (Some(11), Some(3), Some(16))
        );
        assert_eq!(text(attr::K8S_JOB_NAME), None);
        // One read back without a job says none.
        let unnamed = ProcessIdentity { job_id: String::new(), ..identity };
        assert_eq!(attribute_str(&unnamed.resource().attributes, attr::JOB_ID), None);
    }
}
