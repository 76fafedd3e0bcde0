#!/usr/bin/env bash
# Builds gpuprof's OpenTelemetry Collector (deploy/otelcol/builder-config.yaml) with the
# Collector's builder, once: the binary is kept in a cache keyed by the manifest's content, and
# a later run only prints its path. First build on a 2-core machine from nothing: 265 s (the
# builder, ~330 MB of modules, the compile).
#
#   scripts/build-otelcol.sh          prints the binary's path (building it if needed)
#
# GPUPROF_CACHE: where builds are kept (default ~/.cache/gpuprof).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
manifest="$root/deploy/otelcol/builder-config.yaml"
builder_version=$(awk '/^  version:/ { print "v" $2; exit }' "$manifest")
key=$(sha256sum "$manifest" | cut -c1-16)
cache="${GPUPROF_CACHE:-$HOME/.cache/gpuprof}/otelcol-$key"
binary="$cache/gpuprof-otelcol"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
# The Collector's modules need Go 1.24 or later: Debian 12's golang-go (1.19) cannot build them.
go=""
for candidate in "${GO:-}" /usr/local/go/bin/go "$(command -v go || true)"; do
  [ -n "$candidate" ] && [ -x "$candidate" ] || continue
  minor=$("$candidate" env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
  if [ "${minor:-0}" -ge 24 ]; then go=$candidate; break; fi
done
[ -n "$go" ] || { echo "gpuprof: no Go 1.24 or later (GO, /usr/local/go/bin/go, PATH): install it from https://go.dev/dl to build the OpenTelemetry Collector" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
GOBIN="$work/bin" "$go" install "go.opentelemetry.io/collector/cmd/builder@$builder_version" >&2
cp "$manifest" "$work/builder-config.yaml"
(cd "$work" && PATH="$(dirname "$go"):$PATH" "$work/bin/builder" --config builder-config.yaml >&2) \
  || { echo "gpuprof: building the OpenTelemetry Collector failed (see above)" >&2; exit 1; }
mkdir -p "$cache"
mv "$work/_build/gpuprof-otelcol" "$binary.partial"
mv "$binary.partial" "$binary"
echo "gpuprof: built the OpenTelemetry Collector in $(( $(date +%s) - started )) s: $binary" >&2
echo "$binary"
