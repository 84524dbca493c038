"""``hydra/launcher=slurm`` (conf/hydra/launcher/slurm.yaml): fafo.bench.tools.slurm's launcher, where Hydra looks for it.

Hydra imports every module of the ``hydra_plugins`` namespace at start-up, so this one stays small and never fails:
without the optional extra (hydra-submitit-launcher) the launcher only stops the sweep with one error line.
"""

from __future__ import annotations

import sys

from hydra.plugins.launcher import Launcher

try:
    from fafo.bench.tools.slurm import SlurmLauncher as _SlurmLauncher
except ImportError as exc:
    _MISSING = str(exc)

    class SlurmLauncher(Launcher):  # type: ignore[no-redef]
        """Stand-in without hydra-submitit-launcher: stops with one error line, before anything is submitted."""

        def __init__(self, **params) -> None:
            print(f"error: {_MISSING}", file=sys.stderr, flush=True)
            sys.exit(2)

        def setup(self, **kwargs) -> None:  # pragma: no cover - never reached
            pass

        def launch(self, job_overrides, initial_job_idx):  # pragma: no cover - never reached
            raise NotImplementedError
else:

    class SlurmLauncher(_SlurmLauncher):  # type: ignore[no-redef]
        __doc__ = _SlurmLauncher.__doc__
