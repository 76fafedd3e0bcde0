#!/usr/bin/env bash
# DDP over NCCL on every GPU of the machine under `gpuprof run` (eBPF): each rank's events with
# its device, PyTorch's per-device figures from each rank (train_ddp.py), NVML per process while
# they run. NVLink multicast stays off (the machine's rule).
source "$(dirname "$0")/env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
torchrun=$(dirname "$py")/torchrun
(for _ in $(seq 40); do nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader; sleep 0.5; done) > "$out/nvml.csv" 2>&1 &
sampler=$!
"$bin" run -f jsonl -o "$out/ddp.jsonl" --findings "$out/ddp.findings.json" -- \
  "$torchrun" --standalone --nproc-per-node "$gpus" "$here/train_ddp.py" > "$out/ranks.jsonl" 2> "$out/run.stderr"
echo "gpuprof exit $?" >> "$out/run.stderr"
kill $sampler 2>/dev/null
nvidia-smi --query-gpu=index,uuid --format=csv,noheader > "$out/gpus.csv"
