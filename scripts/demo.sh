#!/usr/bin/env bash
# The main job on the bundled example: installs what building gpuprof needs (and nothing of the
# test tools), builds it, and captures testkit/fixtures/workloads/demo_job.py — a small
# training-shaped job with four real problems in it (a tensor kept every step, a DataLoader
# worker making a CUDA context, an IPC buffer freed while its consumer still has it open, an
# out-of-memory that is fragmentation) — into target/demo/demo.gpuprof and its HTML report; then
# asks `gpuprof whatif` whether expandable segments would have avoided the out-of-memory. On a
# machine without a GPU the job runs on the stand-ins of the test suite (libcuda, libc10,
# libc10_cuda, libtorch_cpu: the exported names and ABI of the real libraries, a caching allocator
# in miniature on a 2 GiB device); `--real` uses the machine's driver and PyTorch. GPUPROF_BIN
# names a gpuprof binary to use instead of building one. What it prints is in README.md, checked
# against a real run by agent/tests/readme.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
real=()
[ "${1:-}" = --real ] && real=(--real)
if [ -z "${GPUPROF_BIN:-}" ]; then
  bash scripts/install-build-prerequisites.sh
  cargo build --release --quiet -p gpuprof
  GPUPROF_BIN=target/release/gpuprof
fi
demo=target/demo
mkdir -p "$demo"
rm -f "$demo/demo.gpuprof" "$demo/demo.html"
if [ ${#real[@]} -eq 0 ]; then
  fixtures=testkit/fixtures
  flags=(-O1 -fno-ipa-icf -fPIC -shared -fcf-protection=full -fno-omit-frame-pointer)
  # The libraries find libc10 beside them, as PyTorch's do ($ORIGIN is the loader's, not the shell's).
  # shellcheck disable=SC2016
  beside=('-Wl,-rpath,$ORIGIN')
  cc "${flags[@]}" -fvisibility=hidden -o "$demo/libcuda.so.1" "$fixtures/libcuda_standin.c" -lpthread
  cc "${flags[@]}" -fvisibility=hidden -o "$demo/libc10.so" "$fixtures/libc10_standin.c"
  cc "${flags[@]}" -o "$demo/libc10_cuda.so" "$fixtures/libc10_cuda_standin.c" -L"$demo" -lc10 -ldl -lpthread \
    "${beside[@]}"
  cc "${flags[@]}" -fvisibility=hidden -o "$demo/libtorch_cpu.so" "$fixtures/libtorch_cpu_standin.c" -L"$demo" \
    -lc10 -lpthread "${beside[@]}"
  export LD_LIBRARY_PATH="$PWD/$demo${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export GPUPROF_LIBC10=$PWD/$demo/libc10.so GPUPROF_LIBC10_CUDA=$PWD/$demo/libc10_cuda.so \
    GPUPROF_LIBTORCH_CPU=$PWD/$demo/libtorch_cpu.so
fi
PYTHONPATH=testkit/fixtures/workloads "$GPUPROF_BIN" run -o "$demo/demo.gpuprof" --html "$demo/demo.html" -- \
  "${PYTHON:-python3}" testkit/fixtures/workloads/demo_job.py "${real[@]}"
echo
echo "\$ gpuprof whatif $demo/demo.gpuprof -s expandable_segments:True"
"$GPUPROF_BIN" whatif "$demo/demo.gpuprof" -s expandable_segments:True -f table
echo "demo: open $demo/demo.html in a browser; gpuprof is $GPUPROF_BIN (or the wheel: README.md)"
