#!/usr/bin/env bash
# The cost of being watched, on a GPU machine:
#  1. the machine, and the first instructions of every function gpuprof probes (libc10's
#     allocator report, libcuda's entry points): where a uprobe costs one trap or two;
#  2. the paired overhead harness (bench/overhead.py) for each WORKLOAD=CAPTURES given, inside
#     one training process per capture family, with each BPF program's run time.
#
#   GPUPROF_BIN=… [COLLECTOR=…/gpuprof-collector] [SKIP_DISASSEMBLY=1] OUT=/tmp/out \
#     tests/gpu/validate_overhead.sh [--windows N] [--window SECS] [--switches N] [--switch-window SECS] \
#       reports=ebpf,floor,shim encoder=ebpf,shim …
source "$(dirname "$0")/env.sh"
windows=3 window=4 switches=10 switch_window=2
specs=()
while (($#)); do
  case $1 in
    --windows) windows=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --switches) switches=$2; shift 2 ;;
    --switch-window) switch_window=$2; shift 2 ;;
    *) specs+=("$1"); shift ;;
  esac
done
root=$(cd "$here/../.." && pwd)
{
  echo "== machine"
  uname -r
  echo "cpus $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)," \
    "tsc flags: $(grep -m1 -o 'constant_tsc\|nonstop_tsc' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  if [[ -z ${SKIP_DISASSEMBLY:-} ]]; then
  echo "== first instructions of the probed functions"
  libc10=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))')
  libcuda=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
  libcuda=${libcuda:-/usr/local/nvidia/lib64/libcuda.so.1}
  first() { # FILE SYMBOL: the symbol's first four instructions
    local address
    address=$(nm -D --defined-only "$1" 2>/dev/null | awk -v s="$2" '$3 == s {print $1; exit}')
    [[ -n $address ]] || { echo "$2: not exported"; return; }
    objdump -d --start-address="0x$address" --stop-address=$((0x$address + 24)) "$1" \
      | awk -v s="$2" '/^ +[0-9a-f]+:/ {sub(/^ +/, ""); printf "%s | %s\n", s, $0; if (++n == 4) exit}'
  }
  first "$libc10" _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE
  for symbol in cuMemAlloc_v2 cuMemFree_v2 cuMemCreate cuMemRelease cuMemMap cuMemUnmap cuMemAddressReserve \
                cuMemAddressFree cuIpcGetMemHandle cuIpcOpenMemHandle_v2 cuCtxSetCurrent cuCtxPushCurrent_v2 \
                cuCtxPopCurrent_v2 cuDevicePrimaryCtxRetain cuMemGetInfo_v2 cuMemAllocAsync cuMemFreeAsync; do
    first "$libcuda" "$symbol"
  done
  fi
  echo "== paired overhead (windows $windows x ${window}s started, $switches x ${switch_window}s switched)"
  for spec in "${specs[@]}"; do
    workload=${spec%%=*} captures=${spec#*=}
    echo "-- $workload: $captures"
    PYTHONUNBUFFERED=1 "$py" "$root/bench/overhead.py" --gpuprof "$bin" --workload "$workload" --capture "$captures" \
      ${COLLECTOR:+--collector "$COLLECTOR"} \
      --windows "$windows" --window "$window" --switches "$switches" --switch-window "$switch_window" \
      --json "$out/overhead-$workload.json"
  done
} 2>&1 | tee "$out/overhead.log"
