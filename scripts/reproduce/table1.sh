#!/bin/sh
# FAFO table1: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table1.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table1 "$@"
python scripts/make_tables.py results/runs/table1 --table table1
