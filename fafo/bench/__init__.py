"""The benchmark runner (``python -m fafo.bench``): timing, records, metrics, reference store."""

from fafo.bench import naming as _naming  # noqa: F401 - registers the fafo_run_dir resolver
from fafo.bench import job_time as _job_time  # noqa: F401 - registers the fafo_slurm_minutes resolver
