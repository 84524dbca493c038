"""What FAFO's "Find Out" pool costs per decoding step on the host: Alg. 2's caching of every stream's new state
under each suffix of its dropped tokens (n x k bucket updates a step) and Alg. 3's retrieval (FAFO paper,
Algorithms 2-3 and App. E).

The pool is Python on the CPU whatever the device, so its time is host time on a GPU too. This runs a FAFO preset
(default FAFO-Stream, n = 40, k = 6) on the narrow 32-layer model of ``scripts/bench_engine.py host`` and times every
``CandidatePool.add_streams`` and ``retrieve`` call, in the generation replayed from recorded forwards
(:mod:`fafo.bench.tools.replayed_forwards`: no forward between the calls evicts the CPU's caches, as on a GPU host)
and, for comparison, in the live one. One row per generation and mode (``steps``: the decoding steps, ``pool_steps``:
the steps that added to the pool); the medians are printed::

    python scripts/bench_pool.py --out results/bench/pool.csv
    python scripts/bench_pool.py --method fafo_quest --generations 9
    python scripts/bench_pool.py --override method.n=20 method.pool_from_prompt=true
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fafo.bench.timing import load_average  # noqa: E402
from fafo.bench.tools import host_work  # noqa: E402
from fafo.bench.tools.replayed_forwards import ReplayedForwards  # noqa: E402
from fafo.pool import CandidatePool  # noqa: E402

COLUMNS = ["method", "overrides", "layers", "new_tokens", "mode", "generation", "steps", "pool_steps",
           "add_us_per_step", "retrieve_us_per_step", "pool_us_per_step", "threads", "load", "torch"]


class PoolClock:
    """Wraps ``CandidatePool.add_streams`` and ``retrieve`` with a timer while entered (not a seeding from the
    prompt, ``add_text``: that is the prefill's work)."""

    NAMES = ("add_streams", "retrieve")

    def __enter__(self) -> "PoolClock":
        self.seconds = dict.fromkeys(self.NAMES, 0.0)
        self.steps, self._seeding = 0, False
        self._orig = {name: getattr(CandidatePool, name) for name in (*self.NAMES, "add_text")}
        for name in self.NAMES:
            setattr(CandidatePool, name, self._timed(name, self._orig[name]))
        CandidatePool.add_text = self._untimed(self._orig["add_text"])
        return self

    def _untimed(self, fn):
        def call(pool, *args, **kwargs):
            self._seeding = True
            try:
                return fn(pool, *args, **kwargs)
            finally:
                self._seeding = False
        return call

    def _timed(self, name, fn):
        def call(pool, *args, **kwargs):
            if self._seeding:
                return fn(pool, *args, **kwargs)
            t = time.perf_counter()
            out = fn(pool, *args, **kwargs)
            self.seconds[name] += time.perf_counter() - t
            self.steps += name == "add_streams"  # once per step
            return out
        return call

    def __exit__(self, *exc) -> None:
        for name, fn in self._orig.items():
            setattr(CandidatePool, name, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="fafo_stream", help="a FAFO preset (conf/method)")
    ap.add_argument("--override", nargs="*", default=[], help="the preset's settings, e.g. method.n=20 method.k=4")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--generations", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="CSV, one row per generation and mode")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from fafo.engine.engine import Engine
    from fafo.fafo import FAFODecoder

    method = host_work.build_method(args.method, [*host_work.budget_overrides(args.method), *args.override])
    if not isinstance(method, FAFODecoder):
        ap.error(f"--method {args.method} has no candidate pool: give a FAFO preset (fafo_stream, fafo_quest, ...)")
    engine = Engine.from_pretrained(str(host_work.host_model(args.layers)))
    ids = engine.tokenizer(host_work.PROMPT * (args.prompt_tokens // 10)).input_ids[: args.prompt_tokens]
    snapshot, probe, rows = method.snapshot(), ReplayedForwards(), []
    method.generate(engine, ids, args.new_tokens, engine.eos_ids)  # warm-up
    for g in range(args.generations):
        for mode, context in (("live", probe.recording), ("replayed", probe.replaying)):
            method.restore(snapshot)
            with context(), PoolClock() as clock:
                gen = method.generate(engine, ids, args.new_tokens, engine.eos_ids)
            add, ret = (clock.seconds[name] * 1e6 / clock.steps for name in PoolClock.NAMES)
            rows.append(dict(method=args.method, overrides=" ".join(args.override), layers=args.layers,
                             new_tokens=args.new_tokens, mode=mode, generation=g, steps=len(gen.accept_lengths),
                             pool_steps=clock.steps, add_us_per_step=round(add, 1),
                             retrieve_us_per_step=round(ret, 1), pool_us_per_step=round(add + ret, 1),
                             threads=torch.get_num_threads(), load=load_average(), torch=torch.__version__))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.out}")
    for mode in ("live", "replayed"):
        own = [r for r in rows if r["mode"] == mode]
        print(f"{args.method} {mode}: pool {statistics.median(r['pool_us_per_step'] for r in own):.1f} us per step "
              f"(add {statistics.median(r['add_us_per_step'] for r in own):.1f}, retrieve "
              f"{statistics.median(r['retrieve_us_per_step'] for r in own):.1f}), {own[0]['pool_steps']} steps, "
              f"median of {len(own)} generations, load {load_average()}")


if __name__ == "__main__":
    main()
