#!/bin/sh
# FAFO table4: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table4.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table4 "$@"
python scripts/make_tables.py results/runs/table4 --table table4
