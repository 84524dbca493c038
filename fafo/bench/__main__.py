"""``python -m fafo.bench``: the Hydra app (config groups model, method, task, sampling, bench, experiment).

Examples::

    python -m fafo.bench                                   # tiny random model, built-in prompts, CPU
    python -m fafo.bench model=llama3_8b_instruct task=mt_bench method=vanilla
    python -m fafo.bench -m model=tiny_llama,tiny_qwen2 bench.max_new_tokens=16,32
    python -m fafo.bench experiment=demo                   # every method side by side on the embedded real model
    python -m fafo.bench -m experiment=table2 bench.plan=true  # check a sweep against the real models first
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fafo.bench.naming import CONF
from fafo.errors import ConfigError


def main() -> None:
    """``python -m fafo.bench`` / ``fafo-bench``: the command line checked for misspelt group options and settings
    (one ``error:`` line, exit status 2, before Hydra or a model), then the Hydra app."""
    from fafo.bench.cli_check import check_command_line

    try:
        sys.argv[1:] = check_command_line(sys.argv[1:])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    app()


# an absolute path: Hydra reads a relative one against the calling module, which the ``fafo-bench`` console script
# names as a package (``fafo.bench``), where no ``conf`` package is
@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def app(cfg: DictConfig) -> dict | None:
    """One run. In a sweep a failed job returns ``{"error": line}`` (and leaves ``error.txt``) instead of stopping
    the sweep; :class:`fafo.bench.tools.sweep.SweepReport` lists the failures and exits non-zero at the end."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    sweep = HydraConfig.get().mode.name == "MULTIRUN"
    compare = cfg.get("compare") and cfg.compare.get("methods")  # several methods side by side, one process
    if cfg.bench.get("plan"):  # no weights: every job checked against its model's config and tokenizer
        from fafo.bench.compare import method_configs

        try:  # each compared method is its own job
            configs = method_configs(cfg, list(HydraConfig.get().overrides.task)) if compare else {"": cfg}
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        plans = [plan_job(c, run_dir / name if name else run_dir) for name, c in configs.items()]
        failed = [p for p in plans if not p.fits]
        if not sweep and failed:
            sys.exit(1)
        return {"plan": "\n".join(p.line() for p in plans), "error": failed[0].problems[0] if failed else None}
    from fafo.bench.tools.sweep import interrupted_note, resume_note

    try:
        if compare:
            from fafo.bench.compare import run_compare
            from fafo.bench.tools.wandb_log import check_wandb, shared_run

            say(resume_note(run_dir))
            check_wandb(cfg)  # before the comparison's W&B run starts
            with shared_run(cfg, run_dir, wandb_name(cfg, run_dir)) as wandb_run:  # one W&B run for all methods
                summary = run_compare(cfg, run_dir, list(HydraConfig.get().overrides.task))
                wandb_run.log_comparison(run_dir)
        else:
            from fafo.bench.runner import Runner
            from fafo.bench.spec import resolve

            spec = resolve(cfg, run_dir)
            say(resume_note(run_dir, sum(len(s.turns) for s in spec.samples) * spec.bench.repeats))
            summary = Runner().run(spec)
    except KeyboardInterrupt:  # Ctrl-C stops a sweep too; one line instead of the trace of wherever it landed
        print(interrupted_note(run_dir), file=sys.stderr, flush=True)
        sys.exit(130)
    except ConfigError as exc:
        line = f"error: {exc}"
        print(line, file=sys.stderr)
        if not sweep:
            sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - a sweep goes on with its other jobs; a single run shows the trace
        if not sweep:
            raise
        traceback.print_exc()
        line = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    else:
        (run_dir / "error.txt").unlink(missing_ok=True)  # a failure of an earlier attempt is history now
        return summary
    run_dir.mkdir(parents=True, exist_ok=True)  # the failure stays on disk beside the run
    (run_dir / "error.txt").write_text(line + "\n")
    return {"error": line}


def wandb_name(cfg: DictConfig, run_dir: Path) -> str:
    """A comparison's W&B run name: its directory under bench.output_dir."""
    try:
        return Path(run_dir).resolve().relative_to(Path(str(cfg.bench.output_dir)).resolve()).as_posix()
    except ValueError:
        return Path(run_dir).name


def say(line: str | None) -> None:
    if line:
        print(line, file=sys.stderr, flush=True)


def config_names(cfg: DictConfig) -> dict[str, str]:
    """The model, method and task names a config gives, for a job that failed before its run was resolved; a
    method's ``fafo-{compress}`` filled with its compressor's label, as a resolved run names it."""
    names = {k: str(cfg[k].get("name")) for k in ("model", "method", "task")}
    compress = cfg.method.get("compress")
    if hasattr(compress, "keys") and "_target_" in compress:
        from hydra.utils import get_object

        try:
            names["method"] = names["method"].format(compress=get_object(str(compress._target_)).label)
        except Exception:  # noqa: BLE001 - the name as given; the job's own problem line says what is wrong
            pass
    return names


def plan_job(cfg: DictConfig, run_dir: Path, most: int = 20):
    """``bench.plan=true`` for one job: its plan (a setting or data problem is its one problem line) printed (the
    first ``most`` problems) and written to ``plan.json``."""
    import json

    from fafo.bench.plan import JobPlan, assess, job_label
    from fafo.bench.spec import resolve

    try:
        plan = assess(resolve(cfg, run_dir, weights=False))
    except ConfigError as exc:
        plan = JobPlan(job=job_label(config_names(cfg)), problems=[str(exc)])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    lines = [plan.line(), *(f"  warning: {w}" for w in plan.warnings),
             *(f"  problem: {p}" for p in plan.problems[:most])]
    if len(plan.problems) > most:
        lines.append(f"  ... {len(plan.problems) - most} more problems in {run_dir / 'plan.json'}")
    print("\n".join(lines), flush=True)
    return plan


if __name__ == "__main__":
    main()
