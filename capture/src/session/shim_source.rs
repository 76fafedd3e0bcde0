//! The shim's source of a capture session: what processes running gpuprof's shim send on the
//! socket the agent listens on, decoded by the socket's threads, handed to the session's flow.

use std::sync::mpsc::Receiver;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuprof_model::event::Layer;

use super::ShimStats;
use crate::flow::EventFlow;
use crate::shim_socket::{ShimMessage, ShimProcesses};

pub struct ShimSource {
    received: Receiver<ShimMessage>,
    processes: ShimProcesses,
    /// The kernel reports forks, execs and exits of every process (eBPF runs beside the shim):
    /// the shim's own, and the exits said for a connection that hangs up, are left out.
    kernel_reports_processes: bool,
    /// Events handed to the flow.
    events: u64,
}

impl ShimSource {
    /// `pids_are_ours`: the pids the processes name are this agent's (see `ShimProcesses`).
    pub fn new(received: Receiver<ShimMessage>, pids_are_ours: bool) -> ShimSource {
        ShimSource {
            received,
            processes: ShimProcesses::new(pids_are_ours),
            kernel_reports_processes: false,
            events: 0,
        }
    }

    /// eBPF runs beside the shim: process transitions are the kernel's to report.
    pub(crate) fn beside_the_kernel(&mut self) {
        self.kernel_reports_processes = true;
    }

    /// Hands what arrived (waiting up to `timeout` for the first) to `flow`; `heard_of` learns
    /// each process an event speaks for.
    pub(crate) fn pump(
        &mut self,
        flow: &mut EventFlow,
        timeout: Duration,
        heard_of: &mut dyn FnMut(u32),
    ) -> Result<()> {
        let kernel_reports_processes = self.kernel_reports_processes;
        let events = &mut self.events;
        self.processes.receive(&self.received, timeout, &mut |event| {
            if kernel_reports_processes && event.layer == Layer::Process {
                return Ok(());
            }
            heard_of(event.pid);
            *events += 1;
            flow.observe(event).context("cannot write the output")
        })?;
        for notice in self.processes.take_said() {
            flow.tell(notice);
        }
        Ok(())
    }

    /// Tells process `pid` to record at `level`; false when it is not connected.
    pub(crate) fn set_level(&mut self, pid: u32, level: gpuprof_model::Level) -> bool {
        self.processes.set_level(pid, level)
    }

    /// Every process that connects is told to take `level` first.
    pub fn start_processes_at(&mut self, level: gpuprof_model::Level) {
        self.processes.initial_level = Some(level);
    }

    pub fn processes(&self) -> &ShimProcesses {
        &self.processes
    }

    /// This source's part of the capture's statistics.
    pub(crate) fn stats(&self) -> ShimStats {
        let processes = &self.processes;
        ShimStats { events: self.events, processes_open: processes.open() as u64, totals: processes.totals }
    }
}
