//! Backward attribution, the agent's part: tells the allocator probe where a process's PyTorch
//! keeps autograd's thread-locals (so each block says which autograd node, if any, was being
//! evaluated, or which forward sequence number its thread was at), and names the nodes the probe
//! reports by vtable. The forward line of a backward block is found from those numbers by
//! `gpuprof_model::forward_stacks::ForwardStacks`.

use std::collections::HashMap;
use std::sync::Arc;

use gpuprof_ebpf::allocator::types::gp_autograd_span;
use gpuprof_ebpf::types::gp_autograd;
use gpuprof_procfs::maps;
use gpuprof_pystack::autograd_layout::{node_class, AutogradLayout, LIBRARY, NODE_SEQUENCE_NR, NODE_THREAD_ID};
use gpuprof_pystack::RemoteMemory;

use crate::kernel::Capture;
use crate::libcuda::LibraryFile;

/// What is known about the libtorch_cpu.so files seen and the processes configured.
#[derive(Default)]
pub(crate) struct AutogradConfig {
    /// By file identity: its layout, or why it has none (said once).
    layouts: HashMap<(u64, u64), Option<AutogradLayout>>,
}

/// What configuring one process came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Configured {
    /// The probe reads autograd's state in this process.
    Yes,
    /// The process has not loaded libtorch_cpu.so (yet).
    NoLibrary,
    /// The library is there but gives no layout (said in the notice), or the process is gone.
    No(Option<String>),
}

impl AutogradConfig {
    /// Configures the probe for a process that has loaded PyTorch.
    pub(crate) fn configure(&mut self, capture: &Capture, pid: u32) -> Configured {
        let Ok(mappings) = maps::read(pid) else { return Configured::No(None) };
        let bases = maps::load_bases(&mappings);
        let Some(&(base, _)) = bases.iter().find(|(_, name)| name == LIBRARY) else { return Configured::NoLibrary };
        let Ok(files) = crate::libcuda::mapped_matching(pid, |path| path.rsplit('/').next() == Some(LIBRARY)) else {
            return Configured::No(None);
        };
        let Some(file) = files.first() else { return Configured::NoLibrary };
        let (layout, first_failure) = self.layout_of(file);
        let Some(layout) = layout else { return Configured::No(first_failure) };
        let Some(module) = layout.module_id(&RemoteMemory { pid }, base) else {
            return Configured::No(Some(format!(
                "cannot read the TLS module id of {} in pid {pid}",
                file.path.display()
            )));
        };
        // The probe reads a node's two fields at once: they must lie close together.
        let node_span = u32::from(NODE_SEQUENCE_NR.max(NODE_THREAD_ID)) + 8;
        if node_span >= gp_autograd_span::GP_AUTOGRAD_NODE_SPAN.0 {
            return Configured::No(Some(format!(
                "an autograd node's fields lie {node_span} bytes apart, more than the probe reads: backward blocks of pid {pid} get no forward line"
            )));
        }
        let config = gp_autograd {
            module,
            sequence_nr: layout.sequence_nr,
            thread_id: layout.thread_id,
            current_node: layout.current_node,
            node_sequence_nr: NODE_SEQUENCE_NR,
            node_thread_id: NODE_THREAD_ID,
        };
        match capture.set_autograd(pid, &config) {
            Ok(()) => Configured::Yes,
            Err(error) => Configured::No(Some(format!("{error:#}"))),
        }
    }

    fn layout_of(&mut self, file: &LibraryFile) -> (Option<AutogradLayout>, Option<String>) {
        if let Some(known) = self.layouts.get(&file.identity) {
            return (*known, None);
        }
        let (layout, failure) = match AutogradLayout::of_file(&file.path) {
            Ok(layout) => (Some(layout), None),
            Err(error) => (None, Some(error.to_string())),
        };
        self.layouts.insert(file.identity, layout);
        (layout, failure)
    }
}

/// Node class names by (pid, vtable), read from the process's RTTI once each.
#[derive(Default)]
pub(crate) struct NodeNames {
    names: HashMap<(u32, u64), Option<Arc<str>>>,
}

impl NodeNames {
    pub(crate) fn name_of(&mut self, pid: u32, vtable: u64) -> Option<Arc<str>> {
        self.names
            .entry((pid, vtable))
            .or_insert_with(|| node_class(&RemoteMemory { pid }, vtable).map(Arc::from))
            .clone()
    }

    /// The process ended or runs another program.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.names.retain(|(p, _), _| *p != pid);
    }
}
