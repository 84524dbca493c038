"""Engine timings shared by ``scripts/bench_engine.py`` and the GPU self-check (:mod:`fafo.bench.gpu_check`).

* the memory roofline of a decode forward: the bytes it must read (every weight matrix once, one row of the
  embedding table, the KV of its context) over a bandwidth measured by a device-to-device copy on the same device
  (the gpt-fast accounting: a decode step is memory bound, so its floor is bytes / bandwidth);
* one engine forward of ``Q`` tokens after ``context`` cached ones, shaped as a decode step (``Q = 1``: vanilla's
  step, its KV written after the prefix; ``Q > 1``: a verification of ``Q`` chained tokens), warmed before timing;
* vanilla greedy decode per token, ours and transformers' ``generate``, prefill excluded alike;
* a method's decode step split into time inside its forwards (device time, synchronised) and the host time around
  them (wall time minus time inside forwards): what a faster device cannot shrink;
* the share of an eager step spent inside the model's ``attend``.

Every timing synchronises the device and uses ``time.perf_counter``; compilation and CUDA-graph recording happen
in warm-up calls that are not timed.
"""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass

import torch

import fafo.engine.cache as cache_module
from fafo.bench.timing import SyncClock, sync
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine


def warm_calls(engine: Engine) -> int:
    """Calls before timing: the first compiles; under CUDA graphs the second records and the third replays."""
    if engine.compiled is None:
        return 1
    return 3 if engine.compiled.options.cudagraphs else 2


def timed(fn, repeats: int, warmup: int, device: torch.device) -> tuple[float, float, float]:
    """(first call ms, median ms, min ms): the first call (compilation) apart, ``warmup - 1`` more untimed
    calls, then ``repeats`` timed ones."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(max(0, warmup - 1)):
        fn()
    sync(device)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times), min(times)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu"


def device_slug(device: torch.device) -> str:
    """A file name for the device: :func:`gpu_slug` of the GPU's name, ``cpu`` on a CPU."""
    return gpu_slug(device_name(device)) if device.type == "cuda" else "cpu"


def gpu_slug(name: str) -> str:
    """The GPU's model in lower case (``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA L40S`` -> ``l40s``), else
    the whole name as a file name (``NVIDIA GeForce RTX 4090`` -> ``nvidia-geforce-rtx-4090``)."""
    model = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return (model.group(1) if model else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")).lower()


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second a device-to-device copy moves (each copy reads and writes ``nbytes``: 2x counted), the
    median of ``repeats`` copies after one untimed. 1 GiB on CUDA (far beyond any cache), 64 MiB on a CPU."""
    nbytes = nbytes or (1 << 30 if device.type == "cuda" else 1 << 26)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    _, median_ms, _ = timed(lambda: dst.copy_(src), repeats, 1, device)
    return 2 * src.numel() * 4 / (median_ms / 1e3)


def kv_bytes_per_token(engine: Engine) -> int:
    a = engine.model.args
    return 2 * a.n_layers * a.n_kv_heads * a.head_dim * engine.model.lm_head.weight.element_size()


def weight_bytes_read(engine: Engine) -> int:
    """Weight bytes one forward reads: every parameter once, but of an untied embedding table only its rows."""
    model = engine.model
    total = engine.weights_nbytes
    if not model.args.tie_embeddings:
        table = model.model.embed_tokens.weight
        total -= table.numel() * table.element_size() - table.shape[1] * table.element_size()
    return total


def bytes_per_forward(engine: Engine, context: int) -> int:
    """Bytes a decode forward over ``context`` cached tokens must read from memory: weights + the context's KV."""
    return weight_bytes_read(engine) + context * kv_bytes_per_token(engine)


def forward_step(engine: Engine, cache, n_tokens: int, context: int, seed: int = 0):
    """A callable running one decode-shaped forward of ``n_tokens`` after ``context`` cached tokens, from host
    values as decoders pass them (uploaded in the forward's one packed copy): ``n_tokens = 1`` is vanilla's step
    (its KV written at slot ``context``, the last logits); more tokens verify a chain (their KV written after the
    prefix, logits of every row)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, engine.model.args.vocab_size, (n_tokens,), generator=gen).tolist()
    positions = list(range(context, context + n_tokens))
    logits, plan = ("last" if n_tokens == 1 else "all"), causal_plan(context)
    return lambda: engine.forward(cache, tokens, positions, positions, plan, logits=logits)


def forward_rows_step(engine: Engine, cache, n_tokens: int, context: int, batch: int, seed: int = 0):
    """:func:`forward_step` for ``batch`` rows at once (:func:`fafo.engine.batching.forward_rows`, as a batched
    decode runs it): every row ``n_tokens`` new tokens after ``context`` cached ones, on ``cache``'s first rows."""
    from fafo.engine.batching import StepInputs, forward_rows

    gen = torch.Generator().manual_seed(seed)
    positions = list(range(context, context + n_tokens))
    rows = [StepInputs(torch.randint(3, engine.model.args.vocab_size, (n_tokens,), generator=gen).tolist(),
                       positions, positions, causal_plan(context), "last" if n_tokens == 1 else "all")
            for _ in range(batch)]
    return lambda: forward_rows(engine, cache, rows)[0]


def fill_cache(cache) -> None:
    """Random KV in every slot: a timing stand-in for a prefill (values never matter to a timing)."""
    for buf in cache.keys + cache.values:
        buf.normal_()


def ours_ms_per_token(engine: Engine, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """Vanilla greedy decode on the engine: ms per token after the first (the prefill ends at the clock's mark)."""
    from baselines.vanilla import VanillaDecoder

    clock = SyncClock(engine.device)
    clock.start()
    gen = VanillaDecoder().generate(engine, prompt, new_tokens, clock=clock)
    clock.stop()
    return clock.decode_s * 1e3 / (len(gen.tokens) - 1), gen.tokens


class _FirstCall:
    """A transformers logits processor noting when it is first called (the prefill's logits are ready)."""

    at = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def hf_ms_per_token(hf, prompt: list[int], new_tokens: int, cache: str = "static") -> tuple[float, list[int]]:
    """transformers greedy ``generate`` (``cache_implementation="static"``, which transformers compiles itself on
    CUDA with its ``CompileConfig``; or ``dynamic``): ms per token after the first, as :func:`ours_ms_per_token`."""
    import transformers

    first = _FirstCall()  # called once per new token: its first call ends the prefill
    ids = torch.tensor([prompt], device=hf.device)
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          logits_processor=transformers.LogitsProcessorList([first]), **kw)
    tokens = out[0, len(prompt):].tolist()  # reads the device: the generation has finished
    return (time.perf_counter() - first.at) * 1e3 / (new_tokens - 1), tokens


class AttentionTimer:
    """Wraps the cache's ``attend`` and sums the wall time spent in it (eager steps on a CPU, where ops run in
    order: the share of a step spent in attention)."""

    def __init__(self):
        self.seconds, self._orig = 0.0, cache_module.attend

    def __enter__(self):
        def timed_attend(*a, **kw):
            t0 = time.perf_counter()
            out = self._orig(*a, **kw)
            self.seconds += time.perf_counter() - t0
            return out

        cache_module.attend = timed_attend
        return self

    def __exit__(self, *exc):
        cache_module.attend = self._orig


@dataclass
class StepTimes:
    """One generation's decode steps: ``step_ms`` inside forwards (device time), ``host_ms`` around them."""

    steps: int
    tau: float
    step_ms: float
    host_ms: float
    wall_ms: float
    forwards_per_step: float
    max_rows: int


class ForwardTimer:
    """Wraps an engine's ``forward`` (instance attribute): synchronised time and rows of each decode forward
    (prefill excluded), while the context is open."""

    def __init__(self, engine: Engine):
        self.engine, self.seconds, self.calls, self.max_rows = engine, 0.0, 0, 0

    def __enter__(self) -> "ForwardTimer":
        orig, device = Engine.forward.__get__(self.engine), self.engine.device

        def forward(cache, tokens, *args, **kwargs):
            sync(device)
            t0 = time.perf_counter()
            out = orig(cache, tokens, *args, **kwargs)
            sync(device)
            if kwargs.get("kind") != "prefill":
                self.seconds += time.perf_counter() - t0
                self.calls += 1
                padded = kwargs.get("pad_to") if self.engine.static_shapes else None
                self.max_rows = max(self.max_rows, padded or n_rows(tokens))
            return out

        self.engine.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.forward


def n_rows(tokens) -> int:
    """Tokens in a forward's input (an int, a list, a ``[Q]`` or ``[B, Q]`` tensor or array, or nested list)."""
    if hasattr(tokens, "shape"):  # torch tensor or numpy array
        return int(tokens.shape[-1]) if len(tokens.shape) else 1
    if isinstance(tokens, int):
        return 1
    return len(tokens[0]) if len(tokens) and isinstance(tokens[0], (list, tuple)) else len(tokens)


def step_times(decoder, engine: Engine, prompt: list[int], new_tokens: int) -> StepTimes:
    """Generate once with ``decoder`` (warmed beforehand by the caller) and split its decode time per step."""
    clock = SyncClock(engine.device)
    with ForwardTimer(engine) as timer:
        clock.start()
        gen = decoder.generate(engine, prompt, new_tokens, clock=clock)
        clock.stop()
    steps = max(1, len(gen.accept_lengths))
    inside = timer.seconds
    return StepTimes(steps=steps, tau=gen.tau, step_ms=inside * 1e3 / steps,
                     host_ms=max(0.0, clock.decode_s - inside) * 1e3 / steps, wall_ms=clock.decode_s * 1e3 / steps,
                     forwards_per_step=timer.calls / steps, max_rows=timer.max_rows)
