# shellcheck shell=bash disable=SC2034 # what is set here is read by the scripts that source it
# Sourced by the validate_*.sh scripts: where gpuprof, the results and python are.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
bin=${GPUPROF_BIN:?set GPUPROF_BIN to the gpuprof binary}
out=${OUT:?set OUT to a directory for the results}
py=${PYTHON:-python3}
mkdir -p "$out"
