#!/usr/bin/env bash
# The GPU self-check in the shortest wall time: the untimed stages concurrently, then the timed ones alone.
#
# `python -m fafo.bench.gpu_check` runs its stages one after another, and on a GPU most of their time is compiling
# (a 7B-shaped step shape compiles in about a minute). This script runs, at the same time (phase 1, PARALLEL_S
# seconds): the correctness stage once per GQA group (tiny models; its results are token comparisons, not
# timings), the command-line stage (its tiny model's speedups are then not timings either: a smoke test of the
# CLI), and warm-up processes for the timed stages (two for the methods), whose own timings are discarded: they
# fill inductor's caches (FX graph, autotuning, Triton) so that phase 2 loads compiled graphs instead of building
# them. Phase 2 (TIMED_S seconds) then runs preflight, decode, curve and methods in one process with the GPU to
# itself: those are the numbers to report. Phase 3 (HOST_S seconds), alone too, times every method's host work per
# step on the same widths with 4 layers (--method-layers: host time does not grow with depth, and each step shape
# compiles about 8x faster; phase 1 warms those graphs as well). Each process writes its own report under OUT
# (OUT/<name>/gpu_check.md, OUT/<name>.log). On an H100 (16 cores, 80 GB) 200 and 210 s took 436 s in all with the
# install; on an H200, 240 and 210 s took 480 s.
#
# Usage: scripts/gpu_acceptance.sh OUT [PARALLEL_S [TIMED_S [HOST_S]]]  (defaults 200, 220, 60; PYTHON picks python3)
set -uo pipefail

if [ $# -lt 1 ] || [ "${1:0:1}" = "-" ]; then
  echo "usage: $0 OUT [PARALLEL_S [TIMED_S [HOST_S]]]" >&2
  exit 2
fi
out=$1
parallel=${2:-200}
timed=${3:-220}
host=${4:-60}
py=${PYTHON:-python3}
mkdir -p "$out"

# --budget-s scales the stages' default budgets (fafo.bench.gpu_check.settings.BUDGETS, 430 s in all) in
# proportion; this gives the selected stages, whose defaults sum to $2 seconds, $1 seconds together
budget() { echo $(($1 * 430 / $2)); }
check() {  # NAME SECONDS ARGS...: one check process, stopped (and its compile workers) past its time
  local name=$1 seconds=$2
  shift 2
  timeout -k 10 "$seconds" "$py" -m fafo.bench.gpu_check --out "$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "[gpu_acceptance] $name: exit $? after $SECONDS s" >&2
}

# phase 1: four correctness groups, the CLI, and the timed stages' compiles, concurrently (16 cores: 4 compile
# workers each)
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
for g in 4 7 1 3; do
  check "group$g" $((parallel + 30)) --stages correctness --groups "$g" --budget-s "$(budget "$parallel" 150)" &
done
check cli $((parallel + 30)) --stages cli --budget-s "$(budget "$parallel" 55)" &
check warm-decode "$parallel" --stages decode --budget-s 100000 &
check warm-curve "$parallel" --stages curve --budget-s 100000 &
# the methods in two halves (each compile of a 7B step shape takes about a minute); four 7B processes fit 80 GB
check warm-methods "$parallel" --stages methods --budget-s 100000 \
  --methods vanilla fafo_stream prompt_lookup lookahead token_recycling suffix_decoding &
check warm-methods2 "$parallel" --stages methods --budget-s 100000 \
  --methods sam_decoding fafo_quest fafo_snapkv fafo_2forward swift triforce_nodraft quantspec_fp16 longspec &
check warm-host "$parallel" --stages methods --method-layers 4 --budget-s 100000 &
wait

# phase 2: the timed stages, alone on the GPU
unset TORCHINDUCTOR_COMPILE_THREADS
timeout -k 10 $((timed + 60)) "$py" -m fafo.bench.gpu_check --out "$out/timed" \
  --stages preflight decode curve methods --budget-s "$(budget "$timed" 225)" >"$out/timed.log" 2>&1
echo "[gpu_acceptance] timed: exit $? after $SECONDS s" >&2

# phase 3: every method's host time per step, alone on the GPU, on the 4-layer model phase 1 compiled for
timeout -k 10 $((host + 30)) "$py" -m fafo.bench.gpu_check --out "$out/host" --stages methods --method-layers 4 \
  --budget-s "$(budget "$host" 45)" >"$out/host.log" 2>&1
echo "[gpu_acceptance] host: exit $? after $SECONDS s" >&2

for name in group4 group7 group1 group3 cli timed host; do  # each report's summary table
  echo "== $name"
  sed -n '/^## Summary/,/^## 1\./p' "$out/$name/gpu_check.md" 2>/dev/null | grep "^|" | grep -v "| not selected |" \
    || tail -5 "$out/$name.log"
done
