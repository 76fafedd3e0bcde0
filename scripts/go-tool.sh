# shellcheck shell=bash
# Sourced by the scripts that build a Go program once into gpuprof's cache
# (build-otelcol.sh, build-jaeger.sh): `cached NAME` prints a built binary's path and exits when
# it is there; `pick_go WHAT` sets $go to a Go 1.24 or later (the Collector's and Jaeger's modules
# need it; Debian 12's golang-go is 1.19).
# shellcheck disable=SC2034 # read by the scripts that source this
cache_root="${GPUPROF_CACHE:-$HOME/.cache/gpuprof}"

# cached DIR: the binary DIR/BIN when built already (then the script has nothing to do).
cached() {
  if [ -x "$1" ]; then
    echo "$1"
    exit 0
  fi
}

pick_go() {
  # shellcheck disable=SC2034 # read by the scripts that source this
  go=""
  local candidate minor
  for candidate in "${GO:-}" /usr/local/go/bin/go "$(command -v go || true)"; do
    if [ -z "$candidate" ] || [ ! -x "$candidate" ]; then continue; fi
    minor=$("$candidate" env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
    # shellcheck disable=SC2034 # read by the scripts that source this
    if [ "${minor:-0}" -ge 24 ]; then go=$candidate; return 0; fi
  done
  echo "gpuprof: no Go 1.24 or later (GO, /usr/local/go/bin/go, PATH): install it from https://go.dev/dl to build $1" >&2
  exit 1
}

# keep BUILT BINARY: moves a fresh build into the cache whole (a reader never sees half of it).
keep() {
  mkdir -p "$(dirname "$2")"
  mv "$1" "$2.partial"
  mv "$2.partial" "$2"
}
