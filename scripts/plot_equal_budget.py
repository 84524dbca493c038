"""Equal-budget plot and table: tau and speedup against tokens per forward, one line per method.

    python -m fafo.bench -m experiment=equal_budget bench.cost_curve=results/bench/curve.csv
    python scripts/plot_equal_budget.py results/runs/equal_budget --out results/runs/equal_budget/equal_budget.png

Reads every ``summary.json`` under the roots (``tokens_per_forward``, ``tau``, ``speedup`` and, when the runs had
``bench.cost_curve``, ``break_even_tau``), prints a Markdown table sorted by method and budget, and draws two
panels: tau (with each point's break-even tau, dashed: above it the method beats vanilla on the curve's device)
and measured speedup.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def collect(roots: list[str]) -> list[dict]:
    rows = []
    for root in roots:
        for path in sorted(Path(root).glob("**/summary.json")):
            s = json.loads(path.read_text())
            if s.get("tokens_per_forward"):
                rows.append({k: s.get(k) for k in ("method", "model", "task", "tokens_per_forward", "tau",
                                                   "break_even_tau", "speedup")})
    return sorted(rows, key=lambda r: (r["method"], r["tokens_per_forward"]))


def table(rows: list[dict]) -> str:
    def f(x, spec):
        return "—" if x is None else format(x, spec)

    lines = ["| method | tokens/forward | tau | break-even tau | speedup |", "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['tokens_per_forward']} | {f(r['tau'], '.2f')} | {f(r['break_even_tau'], '.2f')} "
              f"| {f(r['speedup'], '.2f')} |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tau, ax_speed) = plt.subplots(1, 2, figsize=(10, 4))
    for method in sorted({r["method"] for r in rows}):
        pts = [r for r in rows if r["method"] == method]
        x = [r["tokens_per_forward"] for r in pts]
        line, = ax_tau.plot(x, [r["tau"] for r in pts], marker="o", label=method)
        if any(r["break_even_tau"] is not None for r in pts):
            ax_tau.plot(x, [r["break_even_tau"] for r in pts], ls="--", color=line.get_color())
        ax_speed.plot(x, [r["speedup"] for r in pts], marker="o", label=method)
    for ax, name in ((ax_tau, "tau (dashed: break-even tau)"), (ax_speed, "speedup vs vanilla")):
        ax.set_xscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel(name)
    ax_speed.axhline(1.0, color="grey", lw=0.8)
    ax_tau.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="+")
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: <first root>/equal_budget.png)")
    args = p.parse_args(argv)
    rows = collect(args.roots)
    print(table(rows))
    if rows:
        out = args.out or Path(args.roots[0]) / "equal_budget.png"
        plot(rows, out)
        print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
