"""Stage 5: one comparison through the real command line, end to end, on the device.

``python -m fafo.bench model=tiny_llama task=builtin compare.methods=[vanilla,fafo_stream,prompt_lookup,lookahead]``
in a subprocess with W&B off and the device's defaults (compiled with CUDA graphs on CUDA): configs composed by
Hydra, the model built and loaded, each method raced against its interleaved vanilla reference, the table
written. Passes when the command succeeds and no method diverges from vanilla. It needs hydra-core and omegaconf
(on a node without them: the wheel folder of ``scripts/gpu_wheels.sh``); the other stages do not.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

from fafo.bench.gpu_check.report import markdown_table

METHODS = ("vanilla", "fafo_stream", "prompt_lookup", "lookahead")
SHOWN = ("method", "n_samples", "n_failed", "exact_match_rate", "n_mismatch_tie", "n_mismatch_divergence", "tau",
         "speedup")


def command(settings, output_dir: str) -> list[str]:
    return [sys.executable, "-m", "fafo.bench", "model=tiny_llama", "task=builtin",
            f"compare.methods=[{','.join(METHODS)}]", f"bench.max_samples={settings.cli_samples}",
            f"bench.max_new_tokens={settings.cli_new}", f"bench.device={settings.device}",
            f"bench.output_dir={output_dir}", "bench.progress=false", "bench.bootstrap=200", "wandb.mode=disabled"]


def cli_stage(budget, result, settings, out: Path) -> None:
    missing = [m for m in ("hydra", "omegaconf") if find_spec(m) is None]
    if missing:
        result.failed_checks.append(f"{' and '.join(missing)} not importable: the command line needs them "
                                    "(on a node without network: the wheel folder of scripts/gpu_wheels.sh)")
        return
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    with tempfile.TemporaryDirectory(prefix="fafo-gpu-check-cli-") as tmp:
        cmd = command(settings, tmp)
        result.sections.append("```\n" + " ".join(cmd[1:]) + "\n```")
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                                  timeout=max(5.0, budget.left()))
        except subprocess.TimeoutExpired as exc:  # out of time: named, not failed
            log = [x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (exc.stdout, exc.stderr)]
            (out / "cli.log").write_text(log[0] + "\n--- stderr ---\n" + log[1])
            result.skipped.append(f"the comparison (stopped after {exc.timeout:.0f} s; its output: cli.log)")
            result.summary = "out of time"
            return
        (out / "cli.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        tables = sorted(Path(tmp).rglob("compare.csv"))
        if proc.returncode != 0 or not tables:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            result.failed_checks.append(f"python -m fafo.bench exited {proc.returncode}" +
                                        ("" if tables else ", no compare.csv"))
            result.errors.append(f"command line run (exit {proc.returncode}), last lines:\n{tail}")
            return
        shutil.copy(tables[0], out / "cli_compare.csv")
        shutil.copy(tables[0].with_suffix(".md"), out / "cli_compare.md")
        rows = list(csv.DictReader(open(tables[0])))
    found = {r["method"].split(" ")[0] for r in rows}
    diverged = [r["method"] for r in rows if float(r.get("n_mismatch_divergence") or 0) > 0
                or int(float(r.get("n_failed") or 0)) > 0]
    if diverged:
        result.failed_checks.append(f"diverged or failed samples: {', '.join(diverged)}")
    result.summary = (f"exit 0, {len(rows)} rows ({', '.join(sorted(found))}), "
                      + (f"divergence or failures in {', '.join(diverged)}" if diverged else
                         "no divergence, no failed sample"))
    result.sections.append(markdown_table(SHOWN, rows))
