//! Enrichment: what a decoded event needs from the process it came from, read there — the module
//! that made a driver call (`callers`), the Python stack of a call (`python_stacks`), the class of
//! the autograd node a backward-pass block was made for (`autograd_nodes`), and the parent and
//! namespace pid of a process its records have not named (`process_facts`). Decoding reads
//! nothing but the record; everything read from another process or from /proc happens here, once
//! per event, through `Enricher::enrich`.

pub(crate) mod autograd_nodes;
mod callers;
mod process_facts;
pub(crate) mod python_stacks;

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_model::Framework;

use crate::kernel::{flags, Record};
use autograd_nodes::NodeNames;
use callers::CallerModules;
use process_facts::ProcessFacts;
use python_stacks::Pythons;

/// The enrichment stage of the eBPF source.
#[derive(Default)]
pub(crate) struct Enricher {
    callers: CallerModules,
    nodes: NodeNames,
    facts: ProcessFacts,
    /// Python interpreters of the processes followed: found by the source's discovery, used here.
    pub(crate) pythons: Pythons,
}

impl Enricher {
    /// Fills in what `event` (decoded from `record`) lacks from its process: the caller's module
    /// of a driver call, the autograd node's class of a backward block, the parent and namespace
    /// pid, the Python stack.
    pub(crate) fn enrich(&mut self, record: &Record, event: &mut Event) {
        let pid = record.header.pid;
        self.facts.fill(event);
        match event.layer {
            Layer::Driver => {
                event.caller_module = self.callers.module_of(pid, record.header.caller);
                if event.allocator_segment.is_none() {
                    event.allocator_segment = event.caller_module.as_deref().and_then(Framework::of_caller_module);
                }
            }
            Layer::Allocator => {
                let node =
                    record.totals.filter(|_| record.header.flags & flags::AUTOGRAD != 0).map(|t| t.autograd_node);
                if let Some(name) =
                    node.filter(|&vtable| vtable != 0).and_then(|vtable| self.nodes.name_of(pid, vtable))
                {
                    event.autograd_node = Some(name);
                }
            }
            Layer::Process => {}
        }
        self.pythons.symbolize(record, event);
        if matches!(event.op, Op::Exit | Op::Exec) {
            self.callers.forget(pid);
            self.nodes.forget(pid);
        }
    }
}
