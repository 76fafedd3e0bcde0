#!/usr/bin/env bash
# GPU validation of the findings a person acts on (docs/findings.md): the PyTorch jobs of
# torch_stories.py under `gpuprof run`, each with its table (findings, NVML beside the probed
# calls) and findings file; nvidia-smi's per-process figures while the orphaned workers live.
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_stories.sh [STORY…]
source "$(dirname "$0")/env.sh"
stories=${*:-eval-oom autograd-keeps ipc-consumer worker-pool orphans}
{
  for story in $stories; do
    echo "# $story"
    if [ "$story" = orphans ]; then
      ( sleep 25; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$out/orphans.nvidia-smi.csv" ) &
    fi
    start=$(date +%s.%N)
    "$bin" run --format table --output "$out/$story.table" --findings "$out/$story.findings.json" \
      --growth-window 2 -- "$py" "$here/torch_stories.py" "$story" > "$out/$story.stdout" 2> "$out/$story.stderr"
    echo "exit $? after $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
    cat "$out/$story.stdout"
    grep -E "^gpuprof: (the command|the processes|stopped|[0-9]+ events)" "$out/$story.stderr"
    python3 "$here/summarize_findings.py" "$out/$story.findings.json"
    sed -n '/^GPU memory per process as the driver/,/^$/p' "$out/$story.table"
  done
  wait
  echo "# nvidia-smi while the orphans lived"; cat "$out/orphans.nvidia-smi.csv" 2>/dev/null
} > "$out/stories.log" 2>&1
# One archive of the tables, findings and outputs beside the log.
archive=$(mktemp --suffix .tar.gz)
tar -czf "$archive" -C "$out" --exclude stories.log . && \
  find "$out" -mindepth 1 ! -name stories.log -delete && mv "$archive" "$out/stories.tar.gz"
cat "$out/stories.log"
