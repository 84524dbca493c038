#!/bin/sh
# FAFO table13: run the sweep (resumable), then the table and the plot. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table13.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table13 "$@"
python scripts/make_tables.py results/runs/table13 --table table13
python scripts/plot.py results/runs/table13 --table table13
