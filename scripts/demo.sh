#!/usr/bin/env bash
# The main job on the bundled example: installs the prerequisites, builds gpuprof, and captures a
# Python job with a forked and a spawned worker sharing a CUDA buffer over IPC. On a machine
# without a GPU the job runs against the libcuda stand-in of the test suite (same exported names
# and ABI as the real driver); pass --real to use the machine's own libcuda.so.1 instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-prerequisites.sh
cargo build --release --quiet -p gpuprof
if [ "${1:-}" != "--real" ]; then
  mkdir -p target/demo
  cc -shared -fPIC -O1 -fno-ipa-icf -fvisibility=hidden -o target/demo/libcuda.so.1 \
    testkit/fixtures/libcuda_standin.c -lpthread
  export LD_LIBRARY_PATH="$PWD/target/demo${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PYTHONPATH=testkit/fixtures/workloads exec target/release/gpuprof run --format table -- \
  python3 testkit/fixtures/workloads/process_tree.py
