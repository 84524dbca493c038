"""Tooling around runs, apart from what a run needs: reading finished runs into tables (``report``, the paper
tables' cell rules, a comparison's table and plot, ``diff``), what leaves the machine (W&B logging, the Spec-Bench
export), sweeps and clusters (the sweep's end-of-sweep report, the SLURM launcher with its preemption guard and job
time limits, ``fetch_list``), the cost curve and the projection priced on it, and the engine's timing probes (random
models, fumble attention, host work per step). The GPU self-check is :mod:`fafo.bench.gpu_check`."""
