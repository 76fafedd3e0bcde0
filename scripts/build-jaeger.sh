#!/usr/bin/env bash
# Builds Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, module version below), the trace
# store and query API the fleet's traces go to, once: kept in a cache, a later run only prints
# its path. `go install …@version` cannot build it (its go.mod replaces a module), so it is built
# from the module's own directory. Without the UI's assets it serves a placeholder page; its
# query API (what Grafana's Jaeger data source reads) is whole.
#
#   scripts/build-jaeger.sh          prints the binary's path (building it if needed)
#
# GPUPROF_CACHE: where builds are kept (default ~/.cache/gpuprof); GO: the go to use.
set -euo pipefail
version=v1.76.0
source "$(dirname "$0")/go-tool.sh"
binary="$cache_root/jaeger-$version/jaeger"
cached "$binary"
pick_go "Jaeger"
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
started=$(date +%s)
source_dir=$(cd "$work" && GOFLAGS=-mod=mod "$go" mod download -json "github.com/jaegertracing/jaeger@$version" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$source_dir" ] || { echo "gpuprof: cannot download github.com/jaegertracing/jaeger@$version" >&2; exit 1; }
cp -r "$source_dir" "$work/jaeger"
chmod -R u+w "$work/jaeger"
(cd "$work/jaeger" && "$go" build -o "$work/jaeger-bin" ./cmd/jaeger >&2) \
  || { echo "gpuprof: building Jaeger $version failed (see above)" >&2; exit 1; }
keep "$work/jaeger-bin" "$binary"
echo "gpuprof: built Jaeger $version in $(( $(date +%s) - started )) s: $binary" >&2
echo "$binary"
