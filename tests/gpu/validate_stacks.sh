#!/usr/bin/env bash
# GPU validation of Python stacks (run on a machine with an NVIDIA GPU and PyTorch): every
# segment allocation of torch_stacks.py must carry the allocating line as its innermost frame,
# under `gpuprof run` (discovery after exec) and `gpuprof attach` (a running process).
#
#   GPUPROF_BIN=path/to/gpuprof OUT=/tmp/out tests/gpu/validate_stacks.sh
source "$(dirname "$0")/env.sh"
{
  echo "# interpreter: $(readlink -f "$(command -v "$py")") ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
  "$bin" run --output "$out/stacks.jsonl" -- "$py" "$here/torch_stacks.py" > "$out/stacks.facts.json"
  echo "exit $?"
  "$py" "$here/compare_stacks.py" "$out"
  echo "compare exit $?"
  echo "# attach: the innermost frames of a running loop"
  coproc LOOP { exec "$py" "$here/torch_loop.py" 20; }
  read -r _ <&"${LOOP[0]}"
  "$bin" attach "$LOOP_PID" --duration 3 --format table --output "$out/attach.txt"
  kill "$LOOP_PID" 2>/dev/null; wait
  sed -n '/by innermost Python frame/,/^$/p' "$out/attach.txt"
  head -3 "$out/attach.txt"
} > "$out/stacks.log" 2>&1
cat "$out/stacks.log"
