"""The benchmark runner (``python -m fafo.bench``): timing, records, metrics, reference store."""

import hashlib
import re

from omegaconf import OmegaConf


def run_name(override_dirname: str) -> str:
    """A filesystem-safe directory name for a run's overrides ("default" when there are none)."""
    if not override_dirname:
        return "default"
    name = re.sub(r"[^\w.,=+-]+", "_", override_dirname)
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


# used by hydra.run.dir / hydra.sweep.subdir in conf/config.yaml
OmegaConf.register_new_resolver("fafo_run_name", run_name, replace=True)

from fafo.bench import naming as _naming  # noqa: E402,F401 - registers the fafo_model_dir resolver
from fafo.bench import job_time as _job_time  # noqa: E402,F401 - registers the fafo_slurm_minutes resolver
