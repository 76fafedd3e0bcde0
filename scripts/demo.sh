#!/usr/bin/env bash
# The main job on the bundled example: installs what building gpuprof needs (and nothing of the
# test tools), builds it, and captures a Python job with a forked and a spawned worker sharing a
# CUDA buffer over IPC, into target/demo/demo.gpuprof. On a machine without a GPU the job runs
# against the libcuda stand-in of the test suite (same exported names and ABI as the real
# driver); pass --real to use the machine's own libcuda.so.1 instead. What it prints is in
# README.md, checked against a real run by agent/tests/readme.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-build-prerequisites.sh
cargo build --release --quiet -p gpuprof
mkdir -p target/demo
if [ "${1:-}" != "--real" ]; then
  cc -shared -fPIC -O1 -fno-ipa-icf -fvisibility=hidden -o target/demo/libcuda.so.1 \
    testkit/fixtures/libcuda_standin.c -lpthread
  export LD_LIBRARY_PATH="$PWD/target/demo${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PYTHONPATH=testkit/fixtures/workloads target/release/gpuprof run -o target/demo/demo.gpuprof -- \
  python3 testkit/fixtures/workloads/process_tree.py
echo "demo: gpuprof is target/release/gpuprof (or \`pip install gpuprof\`: README.md)"
