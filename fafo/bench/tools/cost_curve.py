"""The cost curve: forward latency against tokens per forward and context, and the break-even tau it implies.

``scripts/bench_engine.py --curve`` times one engine forward for a grid of step sizes (tokens per forward,
1..512) and context lengths on the current device and writes a CSV (``context, step_tokens, median_ms, ...``).
From it, for a method whose decode step runs forwards of ``t_1, t_2, ...`` tokens:

    break-even tau = sum_i latency(t_i, context) / latency(1, context)

is the tau (tokens per step) at which the step pays for itself: the method is faster than vanilla exactly when
its measured tau exceeds it, and its predicted speedup is ``tau / break_even_tau`` (attention over the context and
the per-step host work aside).

The 1-token point is vanilla's step, which takes its own kernel path (its token's KV is written first and one
decoding kernel reads the whole cache); a step of several rows reads the prefix and the step's own keys in separate
calls merged by their log-sum-exps, an extra cost per layer that a line from the 1-token point would spread over
the rows. So a step of q >= 2 tokens is priced on the points of 2 tokens or more only, and between 1 and the
smallest of those it takes that point's cost: an upper bound, since a step's cost does not fall as rows are added
(a curve with a 2-token point prices every step on measured multi-row points).

On a GPU a forward of tens of tokens costs little more than a 1-token one (memory bound), and FAFO's 481-token
forward 1.8 of them on an H100 at 7B and 2.5 on an H200 (compute bound: ``results/device/h100.csv``,
``h200.csv``), so its break-even tau there is about 1.8 and 2.5; on a CPU every token costs and the break-even tau
approaches the step size.

Under load (``bench.batch_size`` B, :mod:`fafo.batch`) a step runs each forward for B rows at once, so the curve
that prices it is the one measured at B rows (``--curve --batch 1 4 16 64``: a ``batch`` column; a CSV without it
is all batch 1): break-even tau at B = ``sum_i latency(t_i, context, B) / latency(1, context, B)``, and
:meth:`CostCurve.projected_by_batch` gives ``tau / break-even tau`` for every batch size on file (per-row tau
assumed the batch-1 run's: drafts are per request). On a GPU the B-row forward of many tokens leaves the
memory-bound regime as B grows, which is where speculation stops paying.

A device CSV (``results/device/<gpu>.csv``, written by ``python -m fafo.bench.gpu_check``) holds the curve's rows
(``row=curve``) and one row per method (``row=method``: its compiled step time inside forwards and its host time
per step, :func:`write_device_csv`); a CSV without a ``row`` column (``scripts/bench_engine.py``) is all curve.
"""

from __future__ import annotations

import csv
import io
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from fafo.errors import ConfigError
from fafo.files import Source, read_text

PROJECT = Path(__file__).resolve().parents[3]  # the checkout: relative curve paths are also looked for here
COLUMNS = ("context", "step_tokens", "median_ms")  # and optionally "batch" (rows per forward; absent: 1)
# results/device/<gpu>.csv: curve rows fill batch..roofline_fraction, method rows method..max_rows; both the rest
DEVICE_COLUMNS = ["row", "batch", "context", "step_tokens", "median_ms", "min_ms", "repeats", "first_call_s",
                  "bytes_read", "gb_per_s", "roofline_fraction", "method", "layers", "forward_tokens", "prompt_tokens",
                  "new_tokens", "steps", "tau", "step_ms", "host_ms", "wall_ms", "forwards_per_step", "max_rows",
                  "device_name", "dtype", "compile", "torch", "cuda"]
METHOD_FIELDS = ("step_ms", "host_ms", "wall_ms", "tau", "steps", "forwards_per_step", "prompt_tokens")


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation on sorted ``xs``; linear extrapolation from the last two points beyond."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x > xs[-1]:  # beyond the grid: never below the largest measured point (noise can make the slope negative)
        return max(y, ys[-1])
    return max(y, 0.0)


@dataclass
class CostCurve:
    """Median forward latency (ms) on a grid: ``table[context][step_tokens]``, per batch size in ``batches``.

    Attributes:
        table: {context: {step_tokens: median ms}} at batch 1 (one row per forward).
        batches: {rows per forward: such a table}, batch 1's included (the ``batch`` column; absent: all 1).
        device: where it was measured (from the CSV).
        methods: a device CSV's method rows, {method: {step_ms, host_ms, wall_ms, tau, steps, forwards_per_step,
            prompt_tokens} as floats, plus forward_tokens as written}: per decode step, the time inside its
            compiled forwards and the host time around them.
    """

    table: dict[int, dict[int, float]]
    device: str = ""
    methods: dict[str, dict] = field(default_factory=dict)
    batches: dict[int, dict[int, dict[int, float]]] = field(default_factory=dict)

    def __post_init__(self):
        if self.table and 1 not in self.batches:
            self.batches = {1: self.table, **self.batches}

    @classmethod
    def load(cls, path: str | Path) -> "CostCurve":
        """Read a CSV written by ``scripts/bench_engine.py`` (one row per context and step size)."""
        path = Path(path)
        if not path.is_absolute() and not path.exists() and (PROJECT / path).exists():
            path = PROJECT / path  # results/device/<gpu>.csv of this checkout, from any working directory
        src = Source("bench.cost_curve", str(path), "write one with `python scripts/bench_engine.py --curve --out "
                     "<file>` or set bench.cost_curve=null")
        text = read_text(path, src)
        if not text.endswith(("\n", "\r")):  # scripts/bench_engine.py ends every row with a line end
            raise src.error(path, "is truncated (its last line has no line end: an interrupted write?)")
        rows = list(csv.DictReader(io.StringIO(text)))
        missing = [c for c in COLUMNS if not rows or c not in rows[0]]
        if missing:
            raise src.error(path, f"is not a cost curve CSV (no {', '.join(missing)} column)")
        batches: dict[int, dict[int, dict[int, float]]] = {}
        methods: dict[str, dict] = {}
        device = ""
        for i, row in enumerate(rows, start=2):
            if row.get("row") == "method":
                try:
                    methods[row["method"]] = {k: float(row[k]) for k in METHOD_FIELDS if row.get(k) not in (None, "")}
                except ValueError:
                    raise src.error(path, f"line {i}: method {row.get('method')!r} has a value that is not a "
                                          "number") from None
                methods[row["method"]]["forward_tokens"] = row.get("forward_tokens", "")
                continue
            try:
                batch = int(row.get("batch") or 1)
                batches.setdefault(batch, {}).setdefault(int(row["context"]), {})[int(row["step_tokens"])] = \
                    float(row["median_ms"])
            except (TypeError, ValueError):
                raise src.error(path, f"line {i} is not a number row (context, step_tokens, median_ms, batch: "
                                      f"{row.get('context')!r}, {row.get('step_tokens')!r}, {row.get('median_ms')!r}, "
                                      f"{row.get('batch')!r})") from None
            device = row.get("device_name") or row.get("device", "")
        if 1 not in batches or not all(1 in steps for t in batches.values() for steps in t.values()):
            raise ConfigError(f"bench.cost_curve={str(path)!r} needs a 1-token row for every context and batch size, "
                              "batch 1 among them; "
                              "rerun scripts/bench_engine.py with --steps including 1")
        return cls(batches.get(1, {}), device, methods, batches)

    def host_ms(self, method: str) -> float | None:
        """Host ms per decode step the device CSV records for ``method`` (a config name, ``fafo_stream``, or a
        run label, ``fafo-stream``); None where it has no such row."""
        row = self.methods.get(method) or self.methods.get(method.replace("-", "_"))
        return row.get("host_ms") if row else None

    def latency(self, tokens: int, context: int, batch: int = 1) -> float:
        """Interpolated ms of one forward of ``tokens`` tokens (per row, ``batch`` rows) after ``context`` cached
        ones; a batch size not on file is a ConfigError (curves are not extrapolated across batch sizes)."""
        if batch not in self.batches:
            raise ConfigError(f"the cost curve of {self.device or 'this device'} has no batch {batch} rows (it has "
                              f"{', '.join(map(str, sorted(self.batches)))}); measure it with scripts/bench_engine.py "
                              f"--curve --batch {batch}")
        table = self.batches[batch]
        contexts = sorted(table)
        at = []
        for c in contexts:
            steps, x = sorted(table[c]), float(tokens)
            if tokens >= 2 and steps[-1] >= 2:  # a step of several rows is priced on the multi-row points only
                steps = [s for s in steps if s >= 2]
                x = max(x, steps[0])  # below the smallest of them: its cost (rows never make a step cheaper)
            at.append(_interp([float(s) for s in steps], [table[c][s] for s in steps], x))
        return _interp([float(c) for c in contexts], at, float(context))

    def smallest_multi_row(self) -> int | None:
        """The smallest step of several rows measured at every context of batch 1 (None: the curve has none);
        steps between 1 and it are priced at its cost (:meth:`latency`)."""
        firsts = [min((s for s in steps if s >= 2), default=None) for steps in self.table.values()]
        return None if not firsts or None in firsts else max(firsts)

    def break_even_tau(self, forward_tokens: tuple[int, ...] | list[int], context: int, batch: int = 1) -> float:
        """The tau at which a step of forwards of ``forward_tokens`` tokens each (per row, ``batch`` rows) costs as
        much per token as vanilla at the same batch: ``sum(latency(t)) / latency(1)``."""
        return sum(self.latency(t, context, batch) for t in forward_tokens) / self.latency(1, context, batch)

    def predicted_speedup(self, tau: float, forward_tokens, context: int, batch: int = 1) -> float:
        """Speedup over vanilla implied by the curve for a method with this tau (host work excluded)."""
        return tau / self.break_even_tau(forward_tokens, context, batch)

    def projected_by_batch(self, tau: float, forward_tokens, context: int) -> dict[int, float]:
        """``{batch: tau / break-even tau at that batch}`` for every batch size on file (module docstring)."""
        return {b: self.predicted_speedup(tau, forward_tokens, context, b) for b in sorted(self.batches)}


def write_device_csv(path: str | Path, curve_rows: list[dict], method_rows: list[dict], common: dict) -> Path:
    """Write a device CSV: ``curve_rows`` (context, step_tokens, median_ms, ...) then ``method_rows`` (method,
    step_ms, host_ms, ...), each with ``common`` (device_name, dtype, compile, torch, cuda) and its ``row`` kind.
    Written whole and renamed into place: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=DEVICE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for kind, rows in (("curve", curve_rows), ("method", method_rows)):
            for row in rows:
                writer.writerow({**common, **row, "row": kind})
    tmp.replace(path)
    return path
