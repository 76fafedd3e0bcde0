//! What each process instance's findings already reported, so that a later rule does not say it
//! again: one finding per problem. An orphan's memory and context are its orphan finding's; the
//! stacks a growth finding named are that finding's, at the process's exit too.

use std::collections::{HashMap, HashSet};

use super::{Finding, FindingKind};
use crate::event::Frame;
use crate::track::{ProcessRef, Tracker};

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Reported {
    orphans: HashSet<ProcessRef>,
    /// The stacks each instance's growth finding named.
    grown: HashMap<ProcessRef, HashSet<Vec<Frame>>>,
}

impl Reported {
    /// Notes findings as they fire (`world`: the tracker that knows their process instances).
    pub(crate) fn note(&mut self, found: &[Finding], world: &Tracker) {
        for finding in found {
            // The instance running now (a growth's streak may have begun before its first event).
            let instance = match world.process(finding.pid) {
                Some(process) => process.as_ref(),
                None => ProcessRef { pid: finding.pid, since: world.instance_since(finding.pid, finding.last_ts) },
            };
            match finding.kind {
                FindingKind::OrphanHoldingMemory => {
                    self.orphans.insert(instance);
                }
                FindingKind::Growth => {
                    let stacks = self.grown.entry(instance).or_default();
                    stacks.insert(finding.stack.clone());
                    stacks.extend(finding.stacks.iter().map(|grew| grew.stack.clone()));
                }
                _ => {}
            }
        }
    }

    /// The instance's orphan finding fired.
    pub(crate) fn orphaned(&self, instance: ProcessRef) -> bool {
        self.orphans.contains(&instance)
    }

    /// The instance's growth finding named this stack.
    pub(crate) fn grew(&self, instance: ProcessRef, stack: &[Frame]) -> bool {
        self.grown.get(&instance).is_some_and(|stacks| stacks.contains(stack))
    }

    /// Drops what is kept of processes the tracker no longer knows.
    pub(crate) fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.orphans.retain(|instance| known(*instance));
        self.grown.retain(|instance, _| known(*instance));
    }
}
