//! Where a manifest keeps its pod templates: a Pod's spec, a workload's `spec.template`, a
//! CronJob's job template, each replica of a Kubeflow training job (`spec.<framework>ReplicaSpecs`:
//! PyTorchJob, TFJob, MPIJob, XGBoostJob…), and the items of a List.

use anyhow::{bail, Result};
use yaml_rust2::Yaml;

use super::key;
use super::pod::{self, Outcome, SidecarSettings};

/// Kinds whose pods are at `spec.template.spec`.
const TEMPLATED: &[&str] = &["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"];

/// "document 2 (Deployment trainer)", for messages.
pub(crate) fn describe(document: &Yaml, number: usize) -> String {
    let kind = document["kind"].as_str().unwrap_or("no kind");
    match document["metadata"]["name"].as_str() {
        Some(name) => format!("document {number} ({kind} {name})"),
        None => format!("document {number} ({kind})"),
    }
}

pub(crate) fn patch(document: &mut Yaml, settings: &SidecarSettings) -> Result<Outcome> {
    if !matches!(document, Yaml::Hash(_)) {
        bail!("it is not a Kubernetes object (a mapping with apiVersion and kind)");
    }
    let Some(kind) = document["kind"].as_str().map(str::to_string) else {
        bail!("it names no kind: every Kubernetes object has apiVersion and kind")
    };
    match kind.as_str() {
        "List" => {
            let Some(Yaml::Array(items)) = get_mut(document, &["items"]) else { return Ok(Outcome::NoPodTemplate) };
            let mut outcomes = Vec::new();
            for (index, item) in items.iter_mut().enumerate() {
                let what = describe(item, index + 1).replacen("document", "item", 1);
                outcomes.push(patch(item, settings).map_err(|e| anyhow::anyhow!("{what}: {e}"))?);
            }
            Ok(combined(&outcomes))
        }
        "Pod" => template(document, &["spec"], settings),
        "CronJob" => template(document, &["spec", "jobTemplate", "spec", "template", "spec"], settings),
        kind if TEMPLATED.contains(&kind) => template(document, &["spec", "template", "spec"], settings),
        kind => {
            let replica_sets: Vec<Yaml> = match &document["spec"] {
                Yaml::Hash(spec) => {
                    spec.keys().filter(|k| k.as_str().is_some_and(|k| k.ends_with("ReplicaSpecs"))).cloned().collect()
                }
                _ => Vec::new(),
            };
            if replica_sets.is_empty() {
                if document["spec"]["template"]["spec"]["containers"].as_vec().is_some() {
                    bail!("{kind} has a pod template gpuprof does not know how to patch safely: patch its spec.template by hand (docs/deploy.md shows the fields)");
                }
                return Ok(Outcome::NoPodTemplate);
            }
            let mut outcomes = Vec::new();
            for set in replica_sets {
                let set = set.as_str().expect("keys kept are strings").to_string();
                let Some(Yaml::Hash(replicas)) = get_mut(document, &["spec", &set]) else {
                    bail!("its spec.{set} is not a mapping")
                };
                for (role, replica) in replicas.iter_mut() {
                    let role = role.as_str().unwrap_or("?").to_string();
                    let outcome = template(replica, &["template", "spec"], settings)
                        .map_err(|e| anyhow::anyhow!("spec.{set}.{role}: {e}"))?;
                    outcomes.push(outcome);
                }
            }
            Ok(combined(&outcomes))
        }
    }
}

fn template(object: &mut Yaml, path: &[&str], settings: &SidecarSettings) -> Result<Outcome> {
    match get_mut(object, path) {
        Some(spec @ Yaml::Hash(_)) => pod::patch(spec, settings),
        _ => bail!("it has no {}", path.join(".")),
    }
}

fn get_mut<'a>(mut value: &'a mut Yaml, path: &[&str]) -> Option<&'a mut Yaml> {
    for step in path {
        let Yaml::Hash(map) = value else { return None };
        value = map.get_mut(&key(step))?;
    }
    Some(value)
}

/// Injected if any template was; else already if any was.
fn combined(outcomes: &[Outcome]) -> Outcome {
    if outcomes.contains(&Outcome::Injected) {
        Outcome::Injected
    } else if outcomes.contains(&Outcome::Already) {
        Outcome::Already
    } else {
        Outcome::NoPodTemplate
    }
}
