#!/bin/sh
# Reproduce one FAFO paper table or figure: run its sweep (resumable), then its table and, for the ablations, its
# plot, with the project's environment (.venv) whether or not it is activated. Extra arguments go to the sweep, e.g.
#   scripts/reproduce.sh table2
#   scripts/reproduce.sh table11 hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
usage="usage: scripts/reproduce.sh table1..table13|figure1 [sweep overrides...]"
[ $# -ge 1 ] || { echo "error: no table given; $usage" >&2; exit 2; }
item=$1; shift
case $item in
  table[1-8]) steps="table" ;;                 # published numbers, no ablation axis
  table9|table1[0-3]) steps="table plot" ;;    # ablations: by input/prefix length, k, n, Init+Local budget
  figure1) steps="plot" ;;                     # no published numbers: the curve only
  *) echo "error: unknown table '$item'; $usage" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
# $PYTHON if set, else the project's environment (make creates .venv), else the python on PATH
if [ -n "$PYTHON" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python; fi
"$py" -m fafo.bench -m experiment="$item" "$@"
for step in $steps; do
  case $step in
    table) "$py" scripts/make_tables.py "results/runs/$item" --table "$item" ;;
    plot) "$py" scripts/plot.py "results/runs/$item" --table "$item" ;;
  esac
done
