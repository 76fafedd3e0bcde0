#!/usr/bin/env bash
# The style gates CI enforces before the tests: rustfmt (rustfmt.toml), clippy with every warning an
# error, clang-format (.clang-format) for the BPF C, and no import circle among the files of any
# crate (scripts/check-import-circles.py). Each names what to run to fix it.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in "cargo fmt" "cargo clippy" clang-format; do
  $tool --version >/dev/null 2>&1 || { echo "gpuprof: $tool is missing: run scripts/install-prerequisites.sh" >&2; exit 1; }
done
cargo fmt --all --check >/dev/null 2>&1 || {
  echo "gpuprof: Rust sources differ from rustfmt: run \`cargo fmt --all\` (what differs: cargo fmt --all --check)" >&2
  exit 1
}
bpf_sources=(ebpf/bpf/*.c ebpf/bpf/*.h)
clang-format --dry-run --Werror "${bpf_sources[@]}" 2>/dev/null || {
  echo "gpuprof: BPF C differs from .clang-format: run \`clang-format -i ${bpf_sources[*]}\`" >&2
  exit 1
}
python3 scripts/check-import-circles.py
cargo clippy --workspace --all-targets --quiet -- -D warnings
