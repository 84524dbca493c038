#!/bin/sh
# FAFO table7: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table7.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table7 "$@"
python scripts/make_tables.py results/runs/table7 --table table7
