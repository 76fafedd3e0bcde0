#!/usr/bin/env bash
# DDP over NCCL on every GPU of the machine under `gpuprof run` (eBPF), exporting to a
# gpuprof-collector on loopback: each rank's events with its device, PyTorch's per-device figures
# from each rank (train_ddp.py), NVML per process while they run, the collector's processes (per
# device) while the ranks hold their memory and its findings after. NVLink multicast stays off
# (the machine's rule). COLLECTOR names the gpuprof-collector binary.
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
collector_bin=${COLLECTOR:?set COLLECTOR to the gpuprof-collector binary}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
torchrun=$(dirname "$py")/torchrun
"$collector_bin" --db "$(mktemp -d)/c.redb" > "$out/collector.log" 2>&1 &
collector=$!
(for _ in $(seq 40); do nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader; sleep 0.5; done) > "$out/nvml.csv" 2>&1 &
sampler=$!
# Each rank prints its figures, then holds HOLD seconds: read the collector then.
(for _ in $(seq 300); do [ "$(grep -o '"rank"' "$out/ranks.jsonl" 2>/dev/null | wc -l)" = "$gpus" ] && break; sleep 0.1; done
 sleep 1.5; curl -s 'http://127.0.0.1:4318/api/v1/processes?node=ddp-node' > "$out/processes.json") &
reader=$!
HOLD=4 "$bin" run -f jsonl -o "$out/ddp.jsonl" --findings "$out/ddp.findings.json" \
  --otlp-endpoint http://127.0.0.1:4317 --node-name ddp-node -- \
  "$torchrun" --standalone --nproc-per-node "$gpus" "$here/train_ddp.py" > "$out/ranks.jsonl" 2> "$out/run.stderr"
echo "gpuprof exit $?" >> "$out/run.stderr"
wait $reader
curl -s 'http://127.0.0.1:4318/api/v1/findings?node=ddp-node' > "$out/collector_findings.json"
kill $sampler $collector 2>/dev/null
nvidia-smi --query-gpu=index,uuid --format=csv,noheader > "$out/gpus.csv"
