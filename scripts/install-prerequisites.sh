#!/usr/bin/env bash
# Installs what building and testing gpuprof needs on Debian/Ubuntu (run as root):
# clang for the BPF programs, what the vendored libbpf/libelf/zlib build needs, gcc for the
# test fixtures, util-linux for the privilege and namespace tests, tmux for the terminal view's
# test, bpftrace for the benchmark, prometheus for promtool (the collector's /metrics test); and
# the OpenTelemetry Python SDK and protobuf bindings the collector's real-peer test drives.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev pkg-config autoconf autopoint automake libtool flex bison
          gawk make gcc libc6-dev util-linux python3 python3-pip bpftrace tmux prometheus)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "gpuprof: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python_packages=(opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-proto==1.45.2)
if ! python3 -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http, opentelemetry.proto" 2>/dev/null; then
  echo "gpuprof: installing ${python_packages[*]}"
  python3 -m pip install -q --disable-pip-version-check "${python_packages[@]}" 2>&1 | grep -v "running pip as the 'root' user" || true
  python3 -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http, opentelemetry.proto"
fi
if ! command -v cargo >/dev/null; then
  echo "gpuprof: cargo is missing: install the Rust toolchain (https://rustup.rs) and run this again" >&2
  exit 1
fi
# bpftrace (benchmark baseline) reads tracefs from its standard mount point.
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ -d /sys/kernel/tracing ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
