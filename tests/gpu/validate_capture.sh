#!/usr/bin/env bash
# GPU validation of driver-level capture (run on a machine with an NVIDIA GPU and PyTorch):
# gpuprof run on PyTorch with the default caching allocator, with expandable segments, and with a
# CUDA tensor shared to a spawned worker; gpuprof attach to a running PyTorch process. Writes the
# event files, gpuprof's stderr and a comparison with torch.cuda.memory_stats() to $OUT.
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_capture.sh
source "$(dirname "$0")/env.sh"
log="$out/capture.log"
{
  echo "# machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; uname -r
  "$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  echo "# default allocator"
  "$bin" run --output "$out/default.jsonl" -- "$py" "$here/torch_segments.py" > "$out/default.stats.json"
  echo "exit $?"
  echo "# expandable segments"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    "$bin" run --output "$out/expandable.jsonl" -- "$py" "$here/torch_segments.py" > "$out/expandable.stats.json"
  echo "exit $?"
  echo "# torch.multiprocessing IPC"
  "$bin" run --output "$out/ipc.jsonl" -- "$py" "$here/torch_ipc.py" > "$out/ipc.stats.json"
  echo "exit $?"
  echo "# attach to a running PyTorch process"
  coproc LOOP { exec "$py" "$here/torch_loop.py" 20; }
  read -r ready <&"${LOOP[0]}"; echo "workload says: $ready"
  "$bin" attach "$LOOP_PID" --duration 3 --format table --output "$out/attach.txt"
  echo "exit $?"
  kill "$LOOP_PID" 2>/dev/null; wait
  echo "# overhead on the real driver: cuMemAlloc_v2 + cuMemFree_v2 of 1 MiB, plain vs under attach"
  loop=${GPUPROF_LOOP_BIN:-$(dirname "$bin")/ipc_fork}
  for _ in 1 2 3; do
    echo "plain: $(echo go | "$loop" loop 3000 | tail -1)"
    coproc ALLOC { exec "$loop" loop 3000; }
    read -r ready <&"${ALLOC[0]}"
    "$bin" attach "$ALLOC_PID" --output /dev/null 2> "$out/overhead.stderr" &
    agent=$!
    until grep -q "capturing pid" "$out/overhead.stderr"; do sleep 0.05; done
    echo go >&"${ALLOC[1]}"
    read -r result <&"${ALLOC[0]}"
    echo "attached: $result ($(grep -o 'probes attached in [0-9]* ms' "$out/overhead.stderr"))"
    wait "$agent"; tail -1 "$out/overhead.stderr"
  done
  echo "# comparison"
  "$py" "$here/compare_capture.py" "$out"
  echo "# attach table (head)"; head -5 "$out/attach.txt"; tail -4 "$out/attach.txt"
} > "$log" 2>&1
cat "$log"
