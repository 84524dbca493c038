#!/bin/sh
# FAFO table8: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table8.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table8 "$@"
python scripts/make_tables.py results/runs/table8 --table table8
