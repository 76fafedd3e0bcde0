#!/usr/bin/env bash
# GPU validation of the eBPF sidecar (`gpuprof inject --capture ebpf`), without Kubernetes: the
# sidecar (`gpuprof daemon --sidecar DIR --capture ebpf`) and the PyTorch workload in a pid
# namespace of their own, as a pod with shareProcessNamespace, while a PyTorch process of the host
# allocates too. The sidecar's events (by the pids the workload knows itself by) against
# PyTorch's counters; nothing of the host's process.
#
#   GPUPROF_BIN=… OUT=/tmp/out tests/gpu/validate_sidecar_ebpf.sh
source "$(dirname "$0")/env.sh"
{
  pod=$(mktemp -d)
  libcuda=/usr/local/nvidia/lib64/libcuda.so.1
  # Outside the pod: a process of the host using the same driver meanwhile.
  "$py" -c "
import time, torch
x = [torch.empty(1 << 20, device='cuda') for _ in range(50)]
time.sleep(25)
print('host process allocated', len(x), flush=True)" > "$out/host.txt" &
  host=$!
  for run in late libcuda; do
    extra=""
    [ "$run" = libcuda ] && extra="--libcuda $libcuda"
    unshare --pid --fork --mount-proc sh -c "
      K8S_POD_NAME=train-0 K8S_NAMESPACE=ml '$bin' daemon --sidecar '$pod' --capture ebpf $extra --listen 127.0.0.1:0 --output '$out/ebpf-$run.jsonl' 2> '$out/ebpf-$run.err' &
      sidecar=\$!
      for i in \$(seq 200); do grep -q 'sidecar of pod' '$out/ebpf-$run.err' && break; sleep 0.1; done
      '$py' '$here/torch_allocator.py' > '$out/ebpf-$run.facts.json'
      kill -TERM \$sidecar; wait \$sidecar"
    echo "== $run: exit $?"
    cat "$out/ebpf-$run.err"
    "$py" "$here/compare_allocator.py" "$out/ebpf-$run.jsonl" "$out/ebpf-$run.facts.json"
    "$py" - "$out/ebpf-$run.jsonl" "$out/ebpf-$run.facts.json" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
facts = json.load(open(sys.argv[2]))
pids = sorted({e["pid"] for e in events})
driver = sum(1 for e in events if e["layer"] == "driver")
print(f"pids recorded {pids} (the workload's own: {facts['pid']}); driver events {driver}; events {len(events)}")
PY
  done
  wait $host; cat "$out/host.txt"
} > "$out/sidecar-ebpf.log" 2>&1
cat "$out/sidecar-ebpf.log"
