"""The benchmark runner (``python -m fafo.bench``): timing, records, metrics, reference store.

The config resolvers are registered only where OmegaConf is installed: the modules that compose no config
(``fafo.bench.gpu_check``'s engine stages, ``fafo.bench.tools.cost_curve``, ``fafo.bench.timing``) import without it.
"""

from importlib.util import find_spec

if find_spec("omegaconf") is not None:
    from fafo.bench import naming as _naming  # noqa: F401 - registers the fafo_run_dir resolver
    from fafo.bench.tools import job_time as _job_time  # noqa: F401 - registers the fafo_slurm_minutes resolver
