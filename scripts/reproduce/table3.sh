#!/bin/sh
# FAFO table3: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table3.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table3 "$@"
python scripts/make_tables.py results/runs/table3 --table table3
