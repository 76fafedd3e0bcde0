#!/usr/bin/env bash
# The first ten minutes on the H100 machine: the wheel installed into a fresh virtual environment
# (the machine's PyTorch visible to it), `gpuprof run` with no flags through the shim, its
# summary and peak flame graph against PyTorch's own figures, the pytest plugin on real tensors,
# and `attach` reporting what a running process held before it came. WHEEL and WHEELHOUSE (pytest's
# wheels) name what to install.
source "$(dirname "$0")/env.sh"
set -x
wheel=${WHEEL:?set WHEEL to the gpuprof wheel}
wheelhouse=${WHEELHOUSE:?set WHEELHOUSE to a folder with pytest and its dependencies}
venv=$(mktemp -d)/venv
chmod 755 "$(dirname "$venv")"
"$py" -m venv "$venv"
# The machine's PyTorch lives in another virtual environment: make it visible to this one.
"$py" -c 'import site; print(site.getsitepackages()[0])' > "$("$venv/bin/python3" -c 'import site; print(site.getsitepackages()[0])')/machine-torch.pth"
"$venv/bin/pip" install -q --no-index --find-links "$wheelhouse" "$wheel" pytest > "$out/pip.log" 2>&1
"$venv/bin/gpuprof" --version > "$out/first_run.txt"

# 1. run with no flags, through the shim: a named recording, the summary and findings, next steps.
work=$(mktemp -d); chmod 777 "$work"; cd "$work" || exit 1
"$venv/bin/gpuprof" run --via shim -- "$venv/bin/python3" "$here/torch_first_run.py" > "$out/torch_figures.json" 2> "$out/run.stderr"
recording=$(ls gpuprof-torch_first_run-*.gpuprof)
echo "recording $recording $(stat -c %s "$recording") bytes" >> "$out/first_run.txt"
"$venv/bin/gpuprof" summary "$recording" >> "$out/first_run.txt" 2>&1
"$venv/bin/gpuprof" summary "$recording" -f json > "$out/summary.json"
"$venv/bin/gpuprof" export "$recording" -f flamegraph -o "$out/peak.svg" 2>> "$out/first_run.txt"
"$venv/bin/gpuprof" export "$recording" -f speedscope -o speedscope.json && echo "speedscope $(stat -c %s speedscope.json) bytes" >> "$out/first_run.txt"

# 2. the pytest plugin, without root.
cp "$here/test_gpu_markers.py" "$work/"
(cd "$work" && setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$work" "$venv/bin/python3" -m pytest --gpuprof -p no:cacheprovider -q test_gpu_markers.py) > "$out/pytest.txt" 2>&1
echo "pytest exit $?" >> "$out/pytest.txt"

# 3. attach to a process that already holds memory.
fifo="$work/go"; mkfifo "$fifo"; chmod 666 "$fifo"
"$venv/bin/python3" "$here/torch_first_run.py" --attach-me < "$fifo" > "$out/attach_figures.json" &
workload=$!
exec 3> "$fifo"
for _ in $(seq 100); do [ -s "$out/attach_figures.json" ] && break; sleep 0.2; done
"$venv/bin/gpuprof" attach -p "$workload" -f table -o "$out/attach.txt" -d 30 2> "$out/attach.stderr" &
agent=$!
for _ in $(seq 100); do grep -q "capturing pid" "$out/attach.stderr" && break; sleep 0.2; done
echo go >&3; exec 3>&-
wait "$workload"; wait "$agent"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> "$out/first_run.txt" 2>&1 || true
