#!/bin/sh
# FAFO figure1: run the sweep (resumable), then the plot (no published numbers). Extra arguments go to the sweep, e.g.
#   scripts/reproduce/figure1.sh hydra/launcher=slurm hydra.launcher.partition=gpu
set -e
cd "$(dirname "$0")/../.."
python -m fafo.bench -m experiment=figure1 "$@"
python scripts/plot.py results/runs/figure1 --table figure1
