#!/usr/bin/env bash
# A DDP job over NCCL on every GPU of the machine in a "pod" with gpuprof's sidecar (`daemon
# --sidecar`: no eBPF, the ranks preload the shim the sidecar copied into the shared directory),
# exporting to a gpuprof-collector on loopback: each rank's driver calls with the device of their
# context (cuCtxGetDevice), each rank's RANK from the shim's own environment, PyTorch's figures per
# rank (train_ddp.py), NVML per process, the collector's processes per device while the ranks hold
# their memory. COLLECTOR names the gpuprof-collector binary.
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
collector_bin=${COLLECTOR:?set COLLECTOR to the gpuprof-collector binary}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
torchrun=$(dirname "$py")/torchrun
pod=$(mktemp -d)
"$collector_bin" --db "$(mktemp -d)/c.redb" > "$out/collector.log" 2>&1 &
collector=$!
K8S_NODE_NAME=gpu-node K8S_POD_NAME=ddp-0 K8S_NAMESPACE=ml GPUPROF_WORKLOAD_CONTAINER=trainer \
  "$bin" daemon --sidecar "$pod" --level tensors --listen 127.0.0.1:0 --output "$out/sidecar.jsonl" \
  --otlp-endpoint http://127.0.0.1:4317 2> "$out/sidecar.stderr" &
sidecar=$!
for _ in $(seq 100); do [ -S "$pod/shim.sock" ] && break; sleep 0.1; done
(for _ in $(seq 40); do nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader; sleep 0.5; done) > "$out/nvml.csv" 2>&1 &
sampler=$!
(for _ in $(seq 300); do [ "$(grep -o '"rank"' "$out/ranks.jsonl" 2>/dev/null | wc -l)" = "$gpus" ] && break; sleep 0.1; done
 sleep 1.5; curl -s 'http://127.0.0.1:4318/api/v1/processes?node=gpu-node' > "$out/processes.json") &
reader=$!
HOLD=4 LD_PRELOAD="$pod/libgpuprof_shim.so" GPUPROF_SHIM_SOCKET="$pod/shim.sock" GPUPROF_SHIM_LEVEL=tensors \
  "$torchrun" --standalone --nproc-per-node "$gpus" "$here/train_ddp.py" > "$out/ranks.jsonl" 2> "$out/ranks.stderr"
echo "torchrun exit $?" >> "$out/ranks.stderr"
wait $reader
sleep 2
kill -TERM $sidecar; wait $sidecar; echo "sidecar exit $?" >> "$out/sidecar.stderr"
kill $sampler $collector 2>/dev/null
nvidia-smi --query-gpu=index,uuid --format=csv,noheader > "$out/gpus.csv"
# What the sidecar saw per rank: first call's rank, device of each successful driver allocation.
"$py" - "$out/sidecar.jsonl" > "$out/summary.json" <<'PY'
import json, sys, collections
by_pid = collections.defaultdict(lambda: {"rank": None, "driver_alloc_bytes_by_device": collections.Counter(), "allocator_events": 0})
for line in open(sys.argv[1]):
    e = json.loads(line)
    if "pid" not in e:
        continue
    p = by_pid[e["pid"]]
    if e.get("rank") is not None:
        p["rank"] = e["rank"]
    if e.get("layer") == "driver" and e.get("op") == "alloc" and e.get("result", 0) == 0:
        p["driver_alloc_bytes_by_device"][str(e.get("device"))] += e.get("size", 0)
    if e.get("layer") == "allocator":
        p["allocator_events"] += 1
print(json.dumps({pid: p for pid, p in by_pid.items() if p["allocator_events"] or p["driver_alloc_bytes_by_device"]}, indent=1))
PY
