"""What a paper table's cell is, for ``scripts/make_tables.py`` and ``scripts/plot.py``: the axes of the published
tables and where each one's value lives in a run's resolved ``config.yaml``, each table's title, the preset's rule
for the one run shown beside a published cell (``paper.match``; the paper's own key, ``paper.cell``, is read by
:mod:`fafo.bench.tools.paper_table`), and when a run's number does not measure what the paper's does
(:func:`not_comparable`)."""

from __future__ import annotations


from fafo.bench.naming import CONF
from fafo.bench.tools.report import Run, dotted, load_yaml
from fafo.bench.tools.tables import norm_value

# ------------------------------------------------------------------ axes: where a run's ablation value lives


def _budget(cfg):
    sink, local = dotted(cfg, "method.compress.sink"), dotted(cfg, "method.compress.local")
    return None if sink is None or local is None else sink + local


def _guesses(cfg):
    if dotted(cfg, "guesses") is not None:
        return dotted(cfg, "guesses")
    return dotted(cfg, "method.n") if dotted(cfg, "method.n") is not None else dotted(cfg, "method.guess_set")


def _gen_len(cfg):
    return dotted(cfg, "bench.max_new_tokens") or dotted(cfg, "task.max_new_tokens")


AXES = {  # axis name (results/paper/*.csv `axis`) -> its value in a run's resolved config.yaml
    "k": lambda c: dotted(c, "method.k"),
    "n": lambda c: dotted(c, "method.n"),
    "budget": _budget,  # Init+Local tokens
    "guesses": _guesses,
    "input_tokens": lambda c: dotted(c, "task.input_tokens"),
    "prefix_tokens": lambda c: dotted(c, "task.prefix_tokens"),
    "context": lambda c: dotted(c, "task.prefix_tokens") or dotted(c, "task.input_tokens"),
    "temperature": lambda c: dotted(c, "sampling.temperature"),
    "gen_len": _gen_len,
    "gamma1": lambda c: dotted(c, "method.gamma1"),
    "gamma2": lambda c: dotted(c, "method.gamma2"),
    "category": lambda c: dotted(c, "_category"),  # set by split_by_category (Spec-Bench subtasks)
}
AXIS_LABELS = {"k": "k (tokens per guess stream)", "n": "n (guess streams)", "budget": "Init+Local tokens",
               "guesses": "number of n-gram guesses", "input_tokens": "input length (tokens)",
               "prefix_tokens": "prefix length (tokens)", "context": "context length (tokens)",
               "temperature": "temperature", "gen_len": "output length (tokens)", "gamma1": "gamma1",
               "gamma2": "gamma2", "category": "Spec-Bench subtask"}
TABLE_AXES = {"figure1": ["guesses"]}  # tables without a CSV (no published numbers)
CONF_EXPERIMENT = CONF / "experiment"
TITLES = {  # tables without a preset; a preset's title is its `paper.title` (titles())
    "triforce_table2": "TriForce Table 2: A100 on-chip, Llama2-7B-128K, PG-19 122K, by temperature",
    "triforce_table7": "TriForce Table 7: speedup by output length",
    "triforce_table8": "TriForce Table 8: gamma1 / gamma2 ablation",
}


def titles() -> dict[str, str]:
    """Every table's title: the preset's ``paper.title`` (conf/experiment/<table>.yaml), else :data:`TITLES`."""
    out = dict(TITLES)
    for path in sorted(CONF_EXPERIMENT.glob("*.yaml")):
        title = dotted(load_yaml(path), "paper.title")
        if title:
            out[path.stem] = str(title)
    return out


# ------------------------------------------------------------------ the run beside a published cell
def preset(name: str) -> dict:
    """A table's preset (conf/experiment/<name>.yaml) as a dict ({} for tables without one)."""
    path = CONF_EXPERIMENT / f"{name}.yaml"
    return load_yaml(path) if path.exists() else {}


def mismatches(run: Run, rule: dict) -> list[str]:
    """``key=value`` of each ``paper.match`` key whose value in the run's config differs from the paper's."""
    return [f"{key}={dotted(run.config, key)}" for key, want in (rule or {}).items()
            if norm_value(dotted(run.config, key)) != norm_value(want)]


def not_comparable(summary: dict) -> str | None:
    """Why a run's tau does not measure what the paper's does (None: it does)."""
    covers = (summary.get("flag_counts") or {}).get("retrieval_covers_prompt")
    if covers:
        return (f"TriForce's retrieval budget holds the whole prompt in {covers} of {summary.get('n_turns', '?')} "
                "(sample, turn)s: its middle level reads the entire prompt cache, so tau is not the paper's "
                "(prompts longer than the budget)")
    return None
