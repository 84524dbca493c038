"""The main job's table against a busy machine: each method's own vanilla throughput is a column, a reference
that ran faster or slower than the others by more than the A/A band is flagged, and the plot's colours say only
what the speedup's interval says (win / loss / inconclusive), with each value right of its error bar."""

import json

import pandas as pd
from omegaconf import OmegaConf

from fafo.bench.tools import report
from fafo.bench.tools import compare_table as compare
from fafo.bench.records import read_rows
from tests.report_runs import write_run


def md_rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def test_each_method_shows_its_own_reference_throughput(tmp_path):
    names = {"vanilla": 21, "lookahead": 22}
    for name, seed in names.items():
        write_run(tmp_path, name, "m", name, seed=seed)
    summaries = {n: json.loads((tmp_path / n / "summary.json").read_text()) for n in names}
    aligned, _ = compare.on_common_samples(tmp_path, summaries)
    for name in names:
        rows = [r for r in read_rows(tmp_path / name / "samples.csv") if r["status"] == "ok"]
        expected = sum(float(r["ref_new_tokens"]) for r in rows) / sum(float(r["ref_total_s"]) for r in rows)
        assert abs(aligned[name]["ref_tokens_per_s"] - expected) < 1e-9 * expected
    head, *lines = md_rows(compare.markdown(compare.comparison_table(aligned)))
    assert head[head.index("tokens/s") + 1] == "vanilla tok/s"
    for line, name in zip(lines, names):
        flag = "!" if aligned[name]["ref_outside_aa"] else ""
        assert line[head.index("vanilla tok/s")] == f"{aligned[name]['ref_tokens_per_s']:.1f}{flag}"


def summary(method, ref, aa=None, speedup=1.0, interval=None):
    return {"method": method, "n_samples": 3, "n_failed": 0, "speedup": speedup, "speedup_range": interval,
            "ref_tokens_per_s": ref, "aa_speedup": 1.0 if aa else None, "aa_speedup_range": aa, "dtype": "float32",
            "model": "m", "task": "t", "tau": 1.0}


def test_references_that_disagree_beyond_the_aa_band_are_flagged():
    busy = {"vanilla": summary("vanilla", 10.0, speedup=1.0, interval=[0.95, 1.05]),
            "fafo": summary("fafo", 10.4, aa=[0.9, 1.1]),
            "lookahead": summary("lookahead", 5.0, aa=[0.97, 1.02], speedup=1.5, interval=[1.2, 1.8])}
    assert report.aa_band(busy.values()) == (0.9, 1.1)  # the widest A/A interval of the job
    checked = report.reference_check(busy)
    assert [checked[n]["ref_outside_aa"] for n in busy] == [False, False, True]  # 5.0 / 10.0 = 0.5 < 0.9
    head, *lines = md_rows(compare.markdown(compare.comparison_table(checked)))
    flags = {line[0]: line[head.index("vanilla tok/s")] for line in lines}
    assert flags == {"vanilla (A/A noise floor)": "10.0", "fafo": "10.4", "lookahead": "5.0!"}
    text = compare.caption(OmegaConf.create({"bench": {}, "compare": {}}), checked)
    assert "! references disagree: vanilla ran at 5.0-10.4 tokens/s" in text and "for lookahead" in text
    calm = report.reference_check({k: {**s, "ref_tokens_per_s": 10.0} for k, s in busy.items()})
    assert not any(s["ref_outside_aa"] for s in calm.values())
    assert "references disagree" not in compare.caption(OmegaConf.create({"bench": {}, "compare": {}}), calm)


def test_bar_colours_follow_the_interval_and_labels_clear_the_error_bars(tmp_path):
    assert compare.verdict(1.5, [1.2, 1.8]) == "win" and compare.verdict(0.6, [0.5, 0.7]) == "loss"
    assert compare.verdict(1.51, [0.8, 2.3]) == "inconclusive" and compare.verdict(0.9, None) == "inconclusive"
    rows = [summary("vanilla", 10.0, interval=[0.95, 1.05]), summary("win", 10.0, speedup=1.5, interval=[1.2, 1.8]),
            summary("loss", 10.0, speedup=0.6, interval=[0.5, 0.7]),
            summary("unsure", 10.0, speedup=1.51, interval=[0.8, 2.3])]
    table = compare.comparison_table({r["method"]: r for r in rows})
    captured = {}
    import matplotlib.figure

    savefig = matplotlib.figure.Figure.savefig
    matplotlib.figure.Figure.savefig = lambda fig, *a, **k: captured.setdefault("fig", fig)
    try:
        compare.plot(table, tmp_path / "compare.png", "caption")
    finally:
        matplotlib.figure.Figure.savefig = savefig
    ax = captured["fig"].axes[0]
    bars = [p for p in ax.patches if p.get_height() < 1 and p.get_width() > 0.1]
    colours = {round(b.get_y() + b.get_height() / 2): matplotlib.colors.to_hex(b.get_facecolor()) for b in bars}
    assert [colours[i] for i in range(3)] == [compare.VERDICT_COLORS[v] for v in ("win", "loss", "inconclusive")]
    labels = {round(t.get_position()[1]): t for t in ax.texts}
    for i, hi in enumerate((1.8, 0.7, 2.3)):  # each value starts at its error bar's right end
        assert labels[i].get_position()[0] >= hi and labels[i].get_text().strip() == f"{table['speedup'][i + 1]:.2f}"
    assert pd.Series(compare.COLUMNS).isin(table.columns).all()
