#!/usr/bin/env bash
# A DDP job of four ranks (gloo, all on the first GPU) started as two "nodes" of two ranks each
# (two torchrun agents, one run id, a static rendezvous), each node's ranks preloading the shim of its own
# daemon (`--capture shim`, node-a and node-b), both daemons sending to one gpuprof-collector.
# Rank 3 keeps a 32 MiB tensor every step. While every rank holds its memory: the collector's
# job view (per-rank allocated against each rank's torch.cuda.memory_allocated()), NVML per
# process; after: the collector's rank_divergence findings. COLLECTOR and SHIM name the
# gpuprof-collector binary and libgpuprof_shim.so.
source "$(dirname "$0")/env.sh"
collector_bin=${COLLECTOR:?set COLLECTOR to the gpuprof-collector binary}
shim=${SHIM:?set SHIM to libgpuprof_shim.so}
torchrun=$(dirname "$py")/torchrun
work=$(mktemp -d)
"$collector_bin" --db "$work/c.redb" > "$out/collector.log" 2>&1 &
collector=$!
daemons=()
for node in node-a node-b; do
  "$bin" daemon --capture shim --shim-socket "$work/$node.sock" --node-name "$node" --level tensors \
    --listen 127.0.0.1:0 --output /dev/null --otlp-endpoint http://127.0.0.1:4317 --otlp-profile-interval 1 \
    2> "$out/$node.stderr" &
  daemons+=($!)
done
for node in node-a node-b; do for _ in $(seq 100); do [ -S "$work/$node.sock" ] && break; sleep 0.1; done; done
: > "$out/ranks.jsonl"
job=gpujob-$$
ranks=()
for n in 0 1; do
  node=$([ $n = 0 ] && echo node-a || echo node-b)
  RANKS_OUT="$out/ranks.jsonl" KEEP_RANK=3 HOLD=14 \
    LD_PRELOAD="$shim" GPUPROF_SHIM_SOCKET="$work/$node.sock" GPUPROF_SHIM_LEVEL=tensors \
    "$torchrun" --nnodes 2 --node-rank $n --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29611 \
    --rdzv-id "$job" "$here/train_job.py" > "$out/torchrun-$node.log" 2>&1 &
  ranks+=($!)
done
for _ in $(seq 600); do [ "$(wc -l < "$out/ranks.jsonl")" = 4 ] && break; sleep 0.1; done
sleep 7
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$out/nvml.csv"
curl -s 127.0.0.1:4318/api/v1/jobs > "$out/jobs.json"
curl -s "127.0.0.1:4318/api/v1/jobs/torchrun%3A$job" > "$out/job.json"
curl -s '127.0.0.1:4318/api/v1/findings?kind=rank_divergence' > "$out/divergence.json"
curl -s 127.0.0.1:4318/metrics | grep '^gpuprof_job_' > "$out/job_metrics.txt"
wait "${ranks[@]}"
sleep 2
for d in "${daemons[@]}"; do kill -TERM "$d"; wait "$d"; done
kill "$collector" 2>/dev/null
"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
ranks = {r["rank"]: r for r in map(json.loads, open(f"{out}/ranks.jsonl"))}
nvml = dict(line.split(", ") for line in open(f"{out}/nvml.csv").read().split("\n") if line)
job = json.load(open(f"{out}/job.json"))
print("job", job.get("id"), "world", job.get("world_size"), "ranks", job.get("ranks_seen"), "nodes", job.get("nodes"))
for r in job.get("ranks", []):
    mine = ranks[r["rank"]]
    print(f"rank {r['rank']} {r['node']} pid {r['pid']}: collector allocated {r['allocated_bytes']} reserved {r['reserved_bytes']}"
          f" | torch allocated {mine['allocated']} reserved {mine['reserved']} pid {mine['pid']}"
          f" | NVML {nvml.get(str(mine['pid']))} MiB | equal {r['allocated_bytes'] == mine['allocated'] and r['pid'] == mine['pid']}")
found = json.load(open(f"{out}/divergence.json"))
print("rank_divergence findings:", len(found))
for f in found:
    keeper = next((fr for fr in f["stack"] if fr["function"] == "keep_for_later"), None)
    print(" ", f["job"], "rank", f["rank"], f["node"], f["pid"], f["bytes"], keeper, "keep line", ranks[3]["keep_line"])
    print("  ", f["detail"])
PY
