#!/bin/sh
# FAFO table12: run the sweep (resumable), then the table and the plot. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table12.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table12 "$@"
python scripts/make_tables.py results/runs/table12 --table table12
python scripts/plot.py results/runs/table12 --table table12
