#!/usr/bin/env bash
# Fuzzes every parser of input gpuprof does not control (fuzz/fuzz_targets, docs/reliability.md):
# builds the targets with cargo-fuzz on the nightly toolchain, then runs each in turn for a bounded
# time, one process each, starting from its seeds (fuzz/corpus-seeds/<target>, copied into the
# working corpus fuzz/corpus/<target>). Any crash, timeout or memory blow-up fails the run, naming
# the target and the input that did it (kept under fuzz/artifacts/<target>/; reproduce it with
# `cargo +nightly fuzz run <target> <input>`).
#
#   bash scripts/fuzz.sh                  # every target, 15 s each (CI)
#   bash scripts/fuzz.sh --each 240 --logs /tmp/fuzz-long   # the long run, a log per target
#   bash scripts/fuzz.sh --each 60 recording jsonl           # only these targets
set -euo pipefail
cd "$(dirname "$0")/.."

each=15
logs=""
targets=()
while (($#)); do
  case $1 in
    --each) each=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "gpuprof: fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ $each =~ ^[0-9]+$ && $each -gt 0 ]] || { echo "gpuprof: fuzz.sh: --each $each: give a whole number of seconds" >&2; exit 2; }

cargo +nightly --version >/dev/null 2>&1 || {
  echo "gpuprof: the nightly Rust toolchain is missing (cargo-fuzz needs it): rustup toolchain install nightly" >&2
  exit 1
}
cargo +nightly fuzz --version >/dev/null 2>&1 || {
  echo "gpuprof: cargo-fuzz is missing: run scripts/install-prerequisites.sh" >&2
  exit 1
}
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

# No sanitizer: the parsers are safe Rust, where a bug shows as a panic (overflows included: the
# targets are built with debug assertions); AddressSanitizer would only lengthen the build and
# slow every run. The C they call (zstd) is not instrumented either way.
sanitizer=(--sanitizer none)
started=$SECONDS
cargo +nightly fuzz build "${sanitizer[@]}"
echo "gpuprof: fuzz targets built in $((SECONDS - started)) s"

log_dir=${logs:-$(mktemp -d)}
mkdir -p "$log_dir"
failed=()
for target in "${targets[@]}"; do
  corpus=fuzz/corpus/$target
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  cp -n fuzz/corpus-seeds/"$target"/* "$corpus"/ 2>/dev/null || true
  log=$log_dir/$target.log
  # One process; a case slower than 10 s or using more than 2 GiB is a failure like a crash.
  if cargo +nightly fuzz run "${sanitizer[@]}" "$target" "$corpus" -- -max_total_time="$each" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 >"$log" 2>&1; then
    outcome=ok
  else
    outcome=FAILED
    input=$(grep -o 'Test unit written to .*' "$log" | tail -n 1 | sed 's/Test unit written to //' || true)
    failed+=("$target: ${input:-no input written} (log: $log)")
  fi
  # libFuzzer's final statistics (printed after a crash too) and its last coverage line.
  runs=$(grep -oE 'number_of_executed_units: [0-9]+' "$log" | awk '{print $2}' || true)
  rate=$(grep -oE 'average_exec_per_sec: +[0-9]+' "$log" | awk '{print $2}' || true)
  coverage=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 || true)
  echo "gpuprof: fuzz $target: $outcome: ${runs:-?} runs (${rate:-?}/s), ${coverage:-no coverage line}"
  # The event file targets lay each input down as a file of their process's own (fuzz/src/lib.rs).
  rm -f /dev/shm/gpuprof-fuzz-*.events "${TMPDIR:-/tmp}"/gpuprof-fuzz-*.events
done
if ((${#failed[@]})); then
  printf 'gpuprof: fuzz target failed: %s\n' "${failed[@]}" >&2
  echo "gpuprof: reproduce with: cargo +nightly fuzz run TARGET INPUT; keep the input under fuzz/corpus-seeds/TARGET once fixed" >&2
  exit 1
fi
echo "gpuprof: every fuzz target ran $each s without a failure (logs in $log_dir)"
