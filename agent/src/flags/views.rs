//! The values of the views' flags (`report`, `export`, `summary`, `whatif`): the views' own
//! enums, as `-f`/`--layer` take them.

values_of! {
    /// Output formats of `report`.
    ReportFormat => gpuprof_views::report::ReportFormat {
        /// A JSON array of findings (docs/findings.md).
        Json,
        /// A readable list of findings.
        Table,
    }
}

values_of! {
    /// Output formats of `export`.
    ExportFormat => gpuprof_views::export::ExportFormat {
        /// Folded stacks (`frame;frame;frame bytes`), for any flame graph tool.
        Folded,
        /// A flame graph SVG of live bytes by stack.
        Flamegraph,
        /// A pickled snapshot for PyTorch's memory_viz (torch.cuda._memory_viz, pytorch.org/memory_viz).
        MemoryViz,
        /// Live bytes by stack for speedscope (speedscope.app), one profile per process.
        Speedscope,
        /// One self-contained HTML page: timelines per process and device, the stacks behind any
        /// instant, the findings (docs/views.md).
        Html,
        /// Every event as a line of the jsonl contract (docs/events.md).
        Jsonl,
        /// Every event into a compact recording (from jsonl, say).
        Recording,
    }
}

values_of! {
    /// Which memory a stack view counts.
    StackLayer => gpuprof_views::export::StackLayer {
        /// Allocator blocks (tensors) where the process reported them, driver allocations otherwise.
        Auto,
        /// Driver allocations (segments, pinned memory, VMM).
        Driver,
        /// Allocator blocks (tensors).
        Allocator,
    }
}

values_of! {
    /// Output formats of `summary`.
    SummaryFormat => gpuprof_views::export::summary::SummaryFormat {
        /// Aligned columns, 120 wide.
        Table,
        /// One JSON document (the same numbers).
        Json,
    }
}

values_of! {
    /// Output formats of `whatif`.
    WhatifFormat => gpuprof_views::whatif::WhatifFormat {
        /// A column per setting, for a person.
        Table,
        /// One JSON document: the same numbers, and each run's reserved curve.
        Json,
        /// With --scale: one page, peak reserved against the size, a line per setting.
        Html,
    }
}

values_of! {
    /// The findings `--fail-on` fails on.
    FailOn => gpuprof_model::findings::FailOn {
        /// Every finding that asks for action, but an out-of-memory.
        Leak,
        /// An out-of-memory failure.
        Oom,
        /// Any finding that asks for action (never an info one).
        Any,
    }
}
