#!/bin/sh
# FAFO table5: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table5.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table5 "$@"
python scripts/make_tables.py results/runs/table5 --table table5
