#!/usr/bin/env bash
# Builds gpuprof's OpenTelemetry Collector (deploy/otelcol/builder-config.yaml) with the
# Collector's builder, once: the binary is kept in a cache keyed by the manifest's content, and
# a later run only prints its path. First build on a 2-core machine from nothing: 265 s (the
# builder, ~330 MB of modules, the compile).
#
#   scripts/build-otelcol.sh          prints the binary's path (building it if needed)
#
# GPUPROF_CACHE: where builds are kept (default ~/.cache/gpuprof); GO: the go to use.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/go-tool.sh"
manifest="$root/deploy/otelcol/builder-config.yaml"
builder_version=$(awk '/^  version:/ { print "v" $2; exit }' "$manifest")
key=$(sha256sum "$manifest" | cut -c1-16)
binary="$cache_root/otelcol-$key/gpuprof-otelcol"
cached "$binary"
pick_go "the OpenTelemetry Collector"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
GOBIN="$work/bin" "$go" install "go.opentelemetry.io/collector/cmd/builder@$builder_version" >&2
cp "$manifest" "$work/builder-config.yaml"
(cd "$work" && PATH="$(dirname "$go"):$PATH" "$work/bin/builder" --config builder-config.yaml >&2) \
  || { echo "gpuprof: building the OpenTelemetry Collector failed (see above)" >&2; exit 1; }
keep "$work/_build/gpuprof-otelcol" "$binary"
echo "gpuprof: built the OpenTelemetry Collector in $(( $(date +%s) - started )) s: $binary" >&2
echo "$binary"
