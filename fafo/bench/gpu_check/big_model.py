"""The 7B-shaped model the timing stages share (stages 3 and 4), built once, in memory, on the device.

Random float16 weights drawn on the GPU (:mod:`fafo.bench.tools.random_model`); decode steps compiled with the
runner's defaults; one static cache sized before anything is compiled, large enough for every context and step
the stages time, so the graphs compiled in stage 3 serve stage 4 (as a run's warm-up serves its samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fafo.bench.tools.engine_timing import copy_bandwidth
from fafo.bench.tools.random_model import llama_config, random_engine
from fafo.engine.engine import Engine


@dataclass
class CheckState:
    """What the stages hand on: versions and bandwidth (stage 1), the shared model, the rows of the CSVs."""

    versions: dict = field(default_factory=dict)
    bandwidth: float | None = None
    engine: Engine | None = None
    decode_rows: list[dict] = field(default_factory=list)
    curve_rows: list[dict] = field(default_factory=list)
    method_rows: list[dict] = field(default_factory=list)

    def copy_bandwidth(self, device: torch.device) -> float:
        if self.bandwidth is None:
            self.bandwidth = copy_bandwidth(device)
        return self.bandwidth

    def big_engine(self, settings, layers: int | None = None) -> Engine:
        """The 7B-shaped engine, compiled, its cache allocated (built at the first call); ``layers``: the same
        widths with that many layers (a different depth than the engine held replaces it)."""
        depth = {"num_hidden_layers": layers} if layers else {}
        config = llama_config(settings.big_shape, **depth)
        if self.engine is not None and self.engine.model.args.n_layers != config.num_hidden_layers:
            self.release()
        if self.engine is None:
            engine = random_engine(config, settings.device, settings.dtype, name=settings.big_shape)
            engine.enable_compile(settings.compile)
            engine.cache(capacity(settings))
            self.engine = engine
        return self.engine

    def release(self) -> None:
        if self.engine is not None:
            self.engine.release()
        self.engine = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def capacity(settings) -> int:
    """Cache slots for every decode context (+ its new tokens), every curve context (+ its largest step) and every
    method's prompt (+ new tokens and their scratch). Every method counts, whichever ``--methods`` selects: the
    cache's size is part of each compiled graph, so processes that time different methods build the same graphs
    and share inductor's caches (``scripts/gpu_acceptance.sh`` warms them in parallel)."""
    from fafo.bench.gpu_check.methods import most_extra_slots, selected

    methods = selected(None)
    return max(max(settings.decode_contexts) + settings.decode_new,
               max(settings.curve_contexts) + max(settings.curve_steps),
               settings.method_prompt + settings.method_new
               + most_extra_slots(methods, settings.method_new, small=False))


def random_prompt(n: int, vocab: int, period: int = 0, seed: int = 0) -> list[int]:
    """``n`` random token ids; with ``period``, one random run of that length repeated (n-gram methods then
    find matches to draft from)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (period or n,), generator=gen).tolist()
    return (ids * (n // len(ids) + 1))[:n]
