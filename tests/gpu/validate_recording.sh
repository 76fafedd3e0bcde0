#!/usr/bin/env bash
# GPU validation of recordings: a 10-minute training run recorded by `gpuprof run --output
# run.gpuprof` (the benchmark's loop, keeping an activation every 200 steps); its size, events,
# losses; every export's time and peak memory; PyTorch's own memory_viz reading the exported
# snapshot; and a short recording of the same loop, kept for the fleet simulation.
#
#   GPUPROF_BIN=… OUT=… tests/gpu/validate_recording.sh start    (returns at once; the run goes on)
#   GPUPROF_BIN=… OUT=… tests/gpu/validate_recording.sh finish   (waits for it, then the exports)
source "$(dirname "$0")/env.sh"
seconds=${RUN_SECONDS:-600}
train=${TRAIN:-"$py $here/train_fleet.py"}
work=${WORK:-/tmp/gpuval}
mkdir -p "$work"

# Runs a command, and says its wall time and peak resident memory (a Python parent waits for
# it with wait4; no GNU time there).
measured() {
  local name=$1; shift
  python3 - "$name" "$@" <<'PY'
import os, sys, time
name, argv = sys.argv[1], sys.argv[2:]
start = time.monotonic()
pid = os.fork()
if pid == 0:
    os.execvp(argv[0], argv)
_, status, usage = os.wait4(pid, 0)
print(f"{name}: exit {os.waitstatus_to_exitcode(status)}, {time.monotonic() - start:.1f} s, peak {usage.ru_maxrss / 1024:.0f} MiB", flush=True)
PY
}

case "${1:?start or finish}" in
start)
  rm -f "$work"/run10.*
  # shellcheck disable=SC2086 # $train is a command line
  setsid nohup "$bin" run --output "$work/run10.gpuprof" -- $train --seconds "$seconds" --stats "$work/run10.stats.json" --keep-every 200 \
    > "$work/run10.stderr" 2>&1 < /dev/null &
  echo "recording started: $seconds s"
  ;;
finish)
  {
    # A short recording of the same loop for the fleet simulation, while the long one runs.
    # shellcheck disable=SC2086 # $train is a command line
    "$bin" run --output "$work/fleet_template.gpuprof" -- $train --seconds 8 --stats "$work/template.stats.json" > "$work/template.stderr" 2>&1
    tail -1 "$work/template.stderr"
    while pgrep -f "run10.gpuprof" > /dev/null; do sleep 1; done
    tail -2 "$work/run10.stderr"
    cat "$work/run10.stats.json"; echo
    ls -l "$work/run10.gpuprof"
    cd "$work" || exit 1
    measured report "$bin" report --input run10.gpuprof --format json --output run10.findings.json
    measured folded "$bin" export --input run10.gpuprof --format folded --output run10.folded
    measured flamegraph "$bin" export --input run10.gpuprof --format flamegraph --output run10.svg
    measured memory-viz "$bin" export --input run10.gpuprof --format memory-viz --output run10.pickle
    measured jsonl "$bin" export --input run10.gpuprof --format jsonl --output /dev/null
    ls -l run10.pickle run10.svg run10.folded
    measured torch-memory-viz-stats "$py" -m torch.cuda._memory_viz stats run10.pickle
    "$py" -m torch.cuda._memory_viz stats run10.pickle | head -20
    measured torch-memory-viz-trace-plot "$py" -m torch.cuda._memory_viz trace_plot run10.pickle -o run10.trace.html
    measured torch-memory-viz-segment-plot "$py" -m torch.cuda._memory_viz segment_plot run10.pickle -o run10.segments.html
    ls -l run10.trace.html run10.segments.html
    python3 -c "import json; f=json.load(open('run10.findings.json')); print([(x['kind'], x['pid'], x['bytes']) for x in f])"
  } > "$work/recording.log" 2>&1
  cat "$work/recording.log"
  cp "$work/fleet_template.gpuprof" "$work/run10.svg" "$out/"
  tar czf "$out/recording.tgz" -C "$work" recording.log run10.stderr run10.stats.json run10.findings.json run10.folded template.stderr
  ;;
esac
