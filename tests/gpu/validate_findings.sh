#!/usr/bin/env bash
# GPU validation of the leak findings (run on a machine with an NVIDIA GPU and PyTorch):
# a CUDA tensor shared with a spawned worker that exits holding it, and a DataLoader whose
# workers touch CUDA. Writes gpuprof's findings next to what PyTorch printed, to $OUT.
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_findings.sh
source "$(dirname "$0")/env.sh"
{
  for workload in torch_ipc torch_dataloader; do
    echo "# $workload"
    "$bin" run --format table --output "$out/$workload.table" --findings "$out/$workload.findings.json" \
      -- "$py" "$here/$workload.py"
    echo "exit $?"
    sed -n '/^Findings/,$p' "$out/$workload.table"
  done
} > "$out/findings.log" 2>&1
cat "$out/findings.log"
