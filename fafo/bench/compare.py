"""Side-by-side comparison: every method of a list on one model and task, in one process, one run directory.

``python -m fafo.bench experiment=demo`` (the README's main job) or any run with ``compare.methods=[...]``:

* each method's configuration is composed exactly as ``python -m fafo.bench method=<name> <your overrides>
  <compare.overrides.<name>>`` would compose it, and every one is validated before the model is loaded;
* the model is loaded once and shared, so every method races on the same weights and kernels;
* each method runs as an ordinary run (its vanilla reference timed interleaved, sample by sample) into
  ``<run dir>/<method>/`` with its own ``samples.csv``, ``outputs.jsonl`` and ``summary.json`` (so a rerun resumes
  and ``scripts/make_tables.py <run dir>`` reads it like any sweep);
* ``compare.warm_each=false`` runs ``bench.warmup`` generations for the first method only (they warm the shared
  engine; later methods start on it warm);
* one progress bar covers the whole job; at the end one table (``compare.csv``, ``compare.md``) is printed and a
  plot of speedup and tau per method (``compare.png``) is written beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fafo.errors import ConfigError

COLUMNS = ["method", "tau", "tokens_per_s", "speedup", "speedup_ci95", "exact_match_rate", "peak_mem_mb", "new_tokens",
           "n_failed"]


def method_configs(cfg: DictConfig, overrides: list[str]) -> dict[str, DictConfig]:
    """``{method: composed config}`` for every method of ``cfg.compare.methods``.

    ``overrides`` are the command line's; its ``method``/``compare`` overrides are replaced per method."""
    from hydra import compose

    methods = list(cfg.compare.get("methods") or [])
    if not methods:
        raise ConfigError("compare.methods is empty; list conf/method names, e.g. compare.methods=[vanilla,lookahead]")
    per_method = cfg.compare.get("overrides") or {}
    keep = [o for o in overrides if not o.lstrip("+~").startswith(("method", "compare"))]
    available = {p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "method").glob("*.yaml")}
    configs = {}
    for i, name in enumerate(methods):
        if name not in available:
            raise ConfigError(f"compare.methods: {name!r} is not a method config; use one of "
                              f"{', '.join(sorted(available))}")
        composed = compose(config_name="config", overrides=keep + [f"method={name}"] + list(per_method.get(name, [])))
        with_cfg = OmegaConf.to_container(composed, resolve=False)
        with_cfg.pop("compare", None)
        if i and not cfg.compare.get("warm_each", True):  # the first method warms the shared engine
            with_cfg["bench"]["warmup"] = 0
        configs[name] = OmegaConf.create(with_cfg)
    return configs


def run_compare(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict:
    """Run every method of ``cfg.compare.methods`` (see the module docstring); returns {method: summary}."""
    from fafo.bench.runner import Runner

    configs = method_configs(cfg, overrides)
    runners = {name: Runner(c, run_dir / name) for name, c in configs.items()}  # every check before loading
    total = sum(len(r.samples) for r in runners.values())
    bar = tqdm(total=total, desc=f"compare {len(runners)} methods", file=sys.stderr,
               disable=not cfg.bench.progress)
    summaries, engine = {}, None
    for name, runner in runners.items():
        bar.set_description(f"{name} ({len(summaries) + 1}/{len(runners)})")
        summaries[name] = runner.run(engine=engine, progress=bar, report=False)
        engine = runner.engine
    bar.close()
    table = comparison_table(summaries)
    write_outputs(table, run_dir, caption(cfg, summaries))
    return summaries


def comparison_table(summaries: dict[str, dict]):
    """One row per method: tau, tokens/s, speedup, exact-match rate, peak memory (pandas DataFrame)."""
    import pandas as pd

    rows = [{"method": s.get("method", name), **{k: s.get(k) for k in COLUMNS[1:]}} for name, s in summaries.items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def caption(cfg: DictConfig, summaries: dict[str, dict]) -> str:
    """What the numbers came from: model, task, budget, dtype, machine, threads and load (start-end)."""
    s = next(iter(summaries.values()))
    params = f"{s['n_params'] / 1e6:.1f}M params, " if s.get("n_params") else ""
    loads = [x.get(k) for x in summaries.values() for k in ("load_start", "load_end") if x.get(k) is not None]
    load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    text = (f"{s['model']} ({params}{s['dtype']}), task {s['task']}, {s['n_samples']} samples, "
            f"{cfg.bench.get('max_new_tokens') or 'task-default'} new tokens per turn, greedy; "
            f"{s.get('device_name', s.get('device'))}, {s.get('threads', '?')} threads{load}; "
            "speedup = summed vanilla time / summed method time, vanilla timed beside each method.")
    note = cfg.compare.get("note")
    return text + (f" {note}" if note else "")


def write_outputs(table, run_dir: Path, text: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(run_dir / "compare.csv", index=False)
    md = markdown(table)
    (run_dir / "compare.md").write_text(f"{md}\n\n{text}\n")
    plot(table, run_dir / "compare.png", text)
    print(f"\n== fafo-bench comparison ({run_dir}) ==\n{md}\n{text}\n"
          f"written: compare.csv, compare.md, compare.png", flush=True)


def markdown(table) -> str:
    fmt = {"tau": "{:.2f}", "tokens_per_s": "{:.1f}", "speedup": "{:.2f}x", "exact_match_rate": "{:.0%}",
           "peak_mem_mb": "{:.0f}", "new_tokens": "{:.0f}", "n_failed": "{:.0f}",
           "speedup_ci95": lambda v: f"{v[0]:.2f}-{v[1]:.2f}"}
    head = ["method", "tau", "tokens/s", "speedup", "95% CI", "exact match", "peak MB", "new tokens", "failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.to_dict("records"):
        cells = [str(row["method"])] + [cell(row[c], fmt[c]) for c in COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cell(value, fmt) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return fmt(value) if callable(fmt) else fmt.format(value)


def plot(table, path: Path, text: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(table) + 1.8), sharey=True)
    y = range(len(table))
    for ax, col, label, ref in ((axes[0], "speedup", "wall-clock speedup vs vanilla (x)", 1.0),
                                (axes[1], "tau", "tau (tokens per target forward)", 1.0)):
        values = table[col].astype(float).fillna(0.0)
        ax.barh(list(y), values, color=["#4c72b0" if v >= ref else "#c44e52" for v in values])
        ax.axvline(ref, color="black", lw=0.8, ls="--")
        ax.set_xlabel(label)
        for i, v in zip(y, values):
            ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    axes[0].set_yticks(list(y), list(table["method"]))
    axes[0].invert_yaxis()
    fig.suptitle(text, fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
