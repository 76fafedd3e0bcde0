#!/usr/bin/env bash
# GPU validation of the sidecar arrangement (docs/deploy.md, "Sidecar"), the commands the
# manifests of `gpuprof inject` run, without Kubernetes: gpuprof and the shim side by side as in
# the image; the sidecar (`gpuprof daemon --sidecar DIR`, uid 65532, the pod's identity in its
# environment) and the PyTorch workload (nobody, LD_PRELOAD=DIR/libgpuprof_shim.so,
# GPUPROF_SHIM_SOCKET=DIR/shim.sock) share only DIR, the pod's emptyDir. The sidecar's events
# against PyTorch's counters: torch_allocator.py's counts and curves, then the benchmark loop's
# 600 steps.
#
#   GPUPROF_BIN=… SHIM=path/to/libgpuprof_shim.so OUT=/tmp/out tests/gpu/validate_sidecar.sh
source "$(dirname "$0")/env.sh"
shim=${SHIM:?set SHIM to libgpuprof_shim.so}
{
  image=$(mktemp -d) && cp "$bin" "$image/gpuprof" && cp "$shim" "$image/libgpuprof_shim.so" && chmod -R a+rX "$image"
  pod=$(mktemp -d) && chmod 0777 "$pod"
  # What the sidecar writes (its user cannot write to $out).
  written=$(mktemp -d) && chmod 0777 "$written"
  setpriv --reuid=65532 --regid=65532 --clear-groups env K8S_NODE_NAME="$(hostname)" K8S_POD_NAME=train-0 K8S_NAMESPACE=ml \
    K8S_POD_UID=0b6a4c9e-52f1-4c3a-9d0e-6f1e2a3b4c5d GPUPROF_WORKLOAD_CONTAINER=trainer \
    "$image/gpuprof" daemon --sidecar "$pod" --level tensors --listen 127.0.0.1:9464 --output "$written/sidecar.jsonl" 2> "$out/sidecar.err" &
  sidecar=$!
  "$py" - <<'PY'
import time, urllib.request
for _ in range(100):
    try:
        if urllib.request.urlopen("http://127.0.0.1:9464/readyz").status == 200:
            print("sidecar ready"); break
    except OSError:
        time.sleep(0.1)
PY
  ls -la "$pod"
  workload() {
    setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp LD_PRELOAD="$pod/libgpuprof_shim.so" \
      GPUPROF_SHIM_SOCKET="$pod/shim.sock" "$py" "$@"
  }
  workload "$here/torch_allocator.py" > "$out/sidecar.facts.json"; echo "torch_allocator exit $?"
  workload "$here/torch_report_loop.py" --steps 600 > "$out/sidecar-loop.facts.json"; echo "loop exit $?"
  sleep 1
  kill -TERM $sidecar; wait $sidecar; echo "sidecar exit $?"
  cp "$written/sidecar.jsonl" "$out/sidecar.jsonl"
  cat "$out/sidecar.err"
  "$py" "$here/compare_allocator.py" "$out/sidecar.jsonl" "$out/sidecar.facts.json"
  "$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
facts = json.load(open(f"{out}/sidecar-loop.facts.json"))
allocs = frees = 0
last = {}
for line in open(f"{out}/sidecar.jsonl"):
    e = json.loads(line)
    if e["pid"] != facts["pid"] or e["layer"] != "allocator":
        continue
    allocs += e["op"] == "alloc"
    frees += e["op"] == "free"
print(f"loop pid {facts['pid']}: allocator allocs {allocs}, PyTorch allocation.all.allocated {facts['allocations']}:",
      "ok" if allocs == facts["allocations"] else "MISMATCH")
PY
} > "$out/sidecar.log" 2>&1
cat "$out/sidecar.log"
