"""Tooling around runs, apart from what a run needs: the SLURM launcher with its preemption guard and job time
limits, the cost curve and the projection priced on it, the engine's timing probes (random models, fumble
attention, host work per step), the paper tables' cell rules and a comparison's table and plot, the Spec-Bench
export, ``diff`` and ``fetch_list``. The GPU self-check is :mod:`fafo.bench.gpu_check`."""
