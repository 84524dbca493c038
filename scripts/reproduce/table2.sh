#!/bin/sh
# FAFO table2: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table2.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table2 "$@"
python scripts/make_tables.py results/runs/table2 --table table2
