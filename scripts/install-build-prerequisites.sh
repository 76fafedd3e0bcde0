#!/usr/bin/env bash
# Installs what building gpuprof and running its demo need on Debian/Ubuntu (run as root), and
# nothing else: clang for the BPF programs, what the vendored libbpf/libelf/zlib build needs, gcc
# for the demo's libcuda stand-in, and python3 for the demo job. The Rust toolchain must be
# there already (https://rustup.rs). The test tools come on top: scripts/install-prerequisites.sh,
# which names its own Debian packages as arguments, installed here in the same step.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev pkg-config autoconf autopoint automake libtool flex bison gawk make gcc
          libc6-dev python3 "$@")
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
if ! command -v cargo >/dev/null; then
  echo "gpuprof: cargo is missing: install the Rust toolchain (https://rustup.rs) and run this again" >&2
  exit 1
fi
