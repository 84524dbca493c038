"""The check's command line and its stage loop (see :mod:`fafo.bench.gpu_check`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from fafo.bench.gpu_check.settings import GROUPS, STAGES, settings_for
from fafo.bench.gpu_check.stages import StageResult, run_stage

GRAPH_LIMIT = 256  # graphs of one compiled forward: the curve's step sizes and every method's shapes


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fafo.bench.gpu_check",
                                description="Self-check of a GPU node: correctness of the compiled steps, decode "
                                            "speed against the roofline and transformers, the cost curve, the CLI.")
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.md and the CSVs (created)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda, cuda:N or cpu (toy sizes; default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="fewer cases and curve points (the test suite's CPU run)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="total seconds, shared by the stages in proportion to their default budgets (430 s)")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="run only these stages")
    p.add_argument("--groups", type=int, nargs="+", choices=GROUPS, default=None, help="GQA groups of stage 2")
    p.add_argument("--methods", nargs="+", default=None, help="methods of stages 2 and 4 (conf/method names)")
    p.add_argument("--method-layers", type=int, default=None,
                   help="time stage 4 on the big model's widths with this many layers (default: all): host time per "
                        "step is the same, compiles are faster")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor on CUDA, aot_eager on "
                                                   "CPU; inductor on CPU compiles sdpa steps, as the CPU runner)")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device is visible to torch {torch.__version__} "
                f"(CUDA build: {torch.version.cuda or 'none'}); use --device cpu for the toy-size run")
    if args.budget_s is not None and args.budget_s <= 0:
        p.error("--budget-s must be > 0")
    if args.method_layers is not None and args.method_layers < 1:
        p.error("--method-layers must be >= 1")
    from fafo.bench.gpu_check.methods import METHODS

    unknown = [m for m in args.methods or [] if m not in METHODS]
    if unknown:
        p.error(f"--methods: {', '.join(unknown)} not a draftless method of the check; use any of {', '.join(METHODS)}")
    return args


def stage_functions():
    """Imported late: stage modules import the engine and the decoders."""
    from fafo.bench.gpu_check.cli import cli_stage
    from fafo.bench.gpu_check.correctness import correctness_stage
    from fafo.bench.gpu_check.curve import curve_stage, methods_stage
    from fafo.bench.gpu_check.decode import decode_stage
    from fafo.bench.gpu_check.preflight import preflight_stage

    return {"preflight": lambda b, r, s, st, out: preflight_stage(b, r, s, st),
            "correctness": lambda b, r, s, st, out: correctness_stage(b, r, s, out),
            "decode": decode_stage,
            "curve": curve_stage, "methods": methods_stage,
            "cli": lambda b, r, s, st, out: cli_stage(b, r, s, out)}


def run_check(args: argparse.Namespace, argv: list[str]) -> list[StageResult]:
    from fafo.bench.gpu_check.big_model import CheckState
    from fafo.bench.gpu_check.report import STAGE_TITLES, write_report

    import torch._dynamo.config as dynamo_config

    # the methods of a model share one compiled engine and its graphs (compiled steps fail past the limit)
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, GRAPH_LIMIT)
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" of every tiny model
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    start = time.perf_counter()
    settings = settings_for(args.device, args.quick, args.budget_s, args.backend, args.groups, args.methods,
                            args.method_layers)
    args.out.mkdir(parents=True, exist_ok=True)
    functions, state = stage_functions(), CheckState()
    results, deadline = [], start
    for name in STAGES:
        result = StageResult(name, STAGE_TITLES[name], settings.budgets[name])
        results.append(result)
        if name not in args.stages:
            result.status, result.summary = "not selected", "--stages names others"
            continue
        deadline += settings.budgets[name]
        if name == "cli":  # the command line runs in a child process: the 7B model's memory is freed for it first
            state.release()
        print(f"[gpu_check] {name}: budget {deadline - time.perf_counter():.0f} s", file=sys.stderr, flush=True)
        run_stage(result, functions[name], deadline, settings, state, args.out)
        print(f"[gpu_check] {name}: {result.status} in {result.seconds:.0f} s: {result.summary}", file=sys.stderr,
              flush=True)
        write_report(args.out / "gpu_check.md", results, settings, argv, time.perf_counter() - start)
    state.release()
    short = write_report(args.out / "gpu_check.md", results, settings, argv, time.perf_counter() - start)
    print(f"\nreport: {args.out / 'gpu_check.md'}\n\n{short}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """0 when no stage failed (stages cut short for time are named in the report), else 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    results = run_check(parse_args(argv), argv)
    return int(any(r.status == "failed" for r in results))
