#!/bin/sh
# FAFO table10: run the sweep (resumable), then the table and the plot. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table10.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table10 "$@"
python scripts/make_tables.py results/runs/table10 --table table10
python scripts/plot.py results/runs/table10 --table table10
