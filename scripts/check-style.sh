#!/usr/bin/env bash
# The style gates CI enforces before the tests, one for each language in the tree: rustfmt
# (rustfmt.toml) and clippy with every warning an error for the Rust, and no import circle among
# the files of any crate (scripts/check-import-circles.py); clang-format (.clang-format) for all C
# (the BPF programs, the stand-ins, the CPython offset deriver); ruff (ruff.toml) for the Python,
# and for the shell, shellcheck (.shellcheckrc). Each names what to run to fix it.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff=${RUFF:-/usr/local/lib/gpuprof-test-tools/venv/bin/ruff}
[[ -x $ruff ]] || ruff=ruff
for tool in "cargo fmt" "cargo clippy" clang-format shellcheck "$ruff"; do
  $tool --version >/dev/null 2>&1 || { echo "gpuprof: $tool is missing: run scripts/install-prerequisites.sh" >&2; exit 1; }
done
cargo fmt --all --check >/dev/null 2>&1 || {
  echo "gpuprof: Rust sources differ from rustfmt: run \`cargo fmt --all\` (what differs: cargo fmt --all --check)" >&2
  exit 1
}
# Every C file but the kernel's generated vmlinux.h.
mapfile -t c_sources < <(find ebpf/bpf pystack testkit/fixtures tests/gpu -name '*.[ch]' ! -name vmlinux.h | sort)
clang-format --dry-run --Werror "${c_sources[@]}" 2>/dev/null || {
  echo "gpuprof: C differs from .clang-format: run \`clang-format -i ${c_sources[*]}\`" >&2
  exit 1
}
"$ruff" format --check --quiet . || { echo "gpuprof: Python differs from ruff's format: run \`$ruff format .\`" >&2; exit 1; }
"$ruff" check --quiet . || { echo "gpuprof: ruff's lint failed above: fix it (\`$ruff check --fix .\` fixes some)" >&2; exit 1; }
mapfile -t shell_scripts < <(find scripts tests/gpu -name '*.sh' | sort)
shellcheck .ci/run "${shell_scripts[@]}" || { echo "gpuprof: shellcheck failed above: fix what it names" >&2; exit 1; }
python3 scripts/check-import-circles.py
cargo clippy --workspace --all-targets --quiet -- -D warnings
