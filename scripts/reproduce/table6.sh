#!/bin/sh
# FAFO table6: run the sweep (resumable), then the table. Extra arguments go to the sweep, e.g.
#   scripts/reproduce/table6.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=table6 "$@"
python scripts/make_tables.py results/runs/table6 --table table6
