"""Timing and memory measurement: device sync + perf_counter, peak memory per generation, and a run's instruments
(:class:`Meter`: one timed generation, the warm-up), the machine's state and the environment numbers came from."""

from __future__ import annotations

import os
import platform
import random
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from fafo.bench.mismatch import MismatchJudge
from fafo.bench.records import compact
from fafo.bench.reference import ReferenceStore
from fafo.engine.compiled import cudagraph_skips


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class SyncClock:
    """The runner's clock: ``start()``, decoders call ``mark("prefill")``, ``stop()``; every read syncs the device.

    Attributes after stop: ``prefill_s`` (prompt processing and first token), ``decode_s`` (the rest), ``total_s``.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: dict[str, float] = {}

    def start(self) -> None:
        sync(self.device)
        self.marks = {}
        self.t0 = time.perf_counter()

    def mark(self, phase: str) -> None:
        sync(self.device)
        self.marks[phase] = time.perf_counter()

    def stop(self) -> None:
        sync(self.device)
        self.t1 = time.perf_counter()
        t_prefill = self.marks.get("prefill", self.t0)
        self.prefill_s = t_prefill - self.t0
        self.decode_s = self.t1 - t_prefill
        self.total_s = self.t1 - self.t0


class PeakMemory:
    """Peak memory of one generation in MB: the bytes of every tensor the process holds at the generation's peak
    (weights, the static cache, the decoder's state and drafts; on CUDA also the transient activations, the
    intermediates of its compiled steps included). The runner releases each method's state when its run ends
    (:meth:`fafo.bench.runner.Runner.run`), so nothing of an earlier method is counted.

    CUDA: ``max_memory_allocated`` since ``reset`` (``allocated_bytes.all.peak``: every pool of the caching
    allocator, CUDA-graph private pools included; ``torch/cuda/memory.py``), taken together with the same peak
    over the decoder's own warm-up generations (:meth:`warm`), the larger of the two. Why: in
    ``torch/_inductor/cudagraph_trees.py`` every compiled step of every decoder shares one private pool per device
    (``CUDAGraphTreeManager.__init__``: ``cuda_graphs_thread_pool``); a step's intermediates are allocated in it
    when it warms up (``CUDAWarmupNode.run``, under ``_use_cuda_memory_pool_manager``) and when it is recorded
    (``CUDAGraphNode._record``, ``torch.cuda.graph(..., pool=...)``), and a replay (``CUDAGraphNode.run_graph``:
    ``graph.replay()``) allocates nothing. So a timed generation's own peak misses what its replays reuse, and the
    pool's free part is shared by every decoder that recorded into it (adding it to both the method's and vanilla's
    peaks gives vanilla the method's intermediates and understates the overhead). The warm-up generations, in
    which each of the decoder's steps allocated its intermediates for real, hold exactly its own.
    Within a run the method and its reference alternate, so what one keeps allocated between its generations (a
    draft model, the caches its compiled steps reuse: :meth:`Decoder.held_bytes`) sits on the device while the
    other decodes; it is subtracted from the other's peaks, so that vanilla's peak is vanilla's alone.
    Likewise the shared static cache: allocated once for the run, it has the slots of the larger need of the two
    (the method's scratch: a verification tree, candidate rows), rounded up to whole blocks. Each decoder is
    charged the slots it needs (its samples' longest prompt + new tokens + its own scratch); the rest (``spare``:
    :meth:`Meter.spare_cache_bytes`) comes off its peak, on CUDA and on CPU, so that the method's scratch shows in
    its overhead and not in vanilla's peak, and neither carries the engine's rounding.

    CPU (no allocator statistics): weights + the static cache's slots the decoder needs + the buffers the method
    reports in ``Generation.extras["buffer_bytes"]``; transient activations are not seen there.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.warm_bytes: dict = {}  # a decoder's key (the runner's (id(decoder), eager)) -> its warm-up peak

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def warm(self, key, others: int = 0) -> None:
        """After one warm-up generation (begun by :meth:`reset`) of the decoder ``key`` names: keep its peak
        (less ``others``: the bytes the other decoder of the run holds meanwhile, :meth:`Decoder.held_bytes`)."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - others
            self.warm_bytes[key] = max(self.warm_bytes.get(key, 0), peak)

    def peak_mb(self, engine, extras: dict, key=None, others: int = 0, spare: int = 0) -> float:
        """The peak of the generation since :meth:`reset`, by the decoder ``key`` names (its warm-up peak kept),
        less ``others`` on CUDA: what the run's other decoder keeps allocated between its own generations (a
        draft model, a cache reused by compiled steps), which is not this decoder's memory; less ``spare``
        (CUDA and CPU): the shared cache's slots beyond this decoder's need."""
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) - others - spare
            return max(peak, self.warm_bytes.get(key, 0)) / 2**20
        held = engine.weights_nbytes + engine.cache_nbytes - spare
        return (held + int(extras.get("buffer_bytes", 0))) / 2**20


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict:
    """Where numbers came from: device name, library versions, git sha."""
    import transformers

    from fafo import __version__

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "fafo_bench": __version__, "git_sha": sha,
            "python": platform.python_version()}


def load_average() -> float | None:
    """The 1-minute load average (``/proc/loadavg``, or ``os.getloadavg``), None where the OS has none."""
    try:
        return float(open("/proc/loadavg").read().split()[0])
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (OSError, AttributeError):
            return None


def others_on_gpu_mb(device: torch.device) -> float:
    """MB of the device's memory held by other processes (total - free - what this process reserved)."""
    if device.type != "cuda":
        return 0.0
    free, total = torch.cuda.mem_get_info(device)
    return max(0.0, (total - free - torch.cuda.memory_reserved(device)) / 2**20)


def machine_state(device: torch.device) -> dict:
    """What else the machine is doing as a run starts, recorded with it: threads, load average, CPU and GPU names,
    CPU cores, the GPU memory other processes hold."""
    cuda = device.type == "cuda"
    return {"threads": torch.get_num_threads(), "load_start": load_average(), "cpu_name": cpu_name(),
            "cpu_count": os.cpu_count() or 1, "gpu_name": torch.cuda.get_device_name(device) if cuda else None,
            "gpu_others_mb": others_on_gpu_mb(device) if cuda else None}


def busy_warning(state: dict, busy_load: float, busy_gpu_mb: float = 1024.0) -> str | None:
    """A one-line warning when the machine is busy as a run starts (timings would be inflated), else None.

    Busy = the 1-minute load average per CPU core above ``busy_load`` (``bench.busy_load``), or other processes
    holding more than ``busy_gpu_mb`` MB on the GPU.
    """
    why = []
    load, cores = state.get("load_start"), state.get("cpu_count") or 1
    if load is not None and load / cores > busy_load:
        why.append(f"load average {load:.2f} on {cores} CPU cores (> bench.busy_load={busy_load} per core)")
    if (state.get("gpu_others_mb") or 0) > busy_gpu_mb:
        why.append(f"other processes hold {state['gpu_others_mb']:.0f} MB on the GPU")
    if not why:
        return None
    return ("warning: the machine is busy: " + "; ".join(why) + ". Timings may be inflated; speedups stay "
            "side by side (interleaved reference), but prefer an idle machine for published numbers")


class Meter:
    """A run's measuring instruments on its engine: the synchronising clock, peak memory, the vanilla reference
    store, the float32 tie judge, and what a timed generation runs on."""

    def __init__(self, spec, engine):
        self.spec, self.engine = spec, engine
        self.clock, self.memory, self.env = SyncClock(spec.device), PeakMemory(spec.device), environment(spec.device)
        self.eos = () if spec.bench.ignore_eos else engine.eos_ids
        b = spec.bench
        self.references = ReferenceStore(b.reference_dir, b.reuse_reference, b.reuse_max_spread,
                                         b.busy_load)  # always written; read for reuse when asked
        self.judge = MismatchJudge(engine, spec.ckpt, spec.context, b.tie_margin, b.tie_check)
        self.n_params = sum(p.numel() for p in engine.model.parameters())  # tied embeddings counted once

    def generate(self, decoder, prompt: list[int], max_new: int, seed_index: int, eager: bool = False):
        """One timed generation: (Generation, times, its forward log grouped by :func:`compact`, peak MB)."""
        seed = (self.spec.bench.seed * 1_000_003 + seed_index) % 2**32  # per sample: reruns and resumes agree
        for seeder in (random.seed, np.random.seed, torch.manual_seed):  # methods with their own randomness
            seeder(seed)
        generator = self.spec.sampling.generator(seed_index, self.spec.device)
        self.memory.reset()
        self.engine.ledger.log = log = []
        try:
            with self.eager(eager):
                self.clock.start()
                gen = decoder.generate(self.engine, prompt, max_new, self.eos, self.spec.sampling, generator,
                                       self.clock)
                self.clock.stop()
        finally:
            self.engine.ledger.log = None
        times = {"prefill_s": self.clock.prefill_s, "decode_s": self.clock.decode_s, "total_s": self.clock.total_s}
        peak = self.memory.peak_mb(self.engine, gen.extras, (id(decoder), eager), self.others_held(decoder),
                                   self.spare_cache_bytes(decoder))
        return gen, times, compact(log), peak

    def others_held(self, decoder) -> int:
        """Bytes the run's other decoder keeps allocated while ``decoder`` decodes (:meth:`Decoder.held_bytes`)."""
        return sum(d.held_bytes() for d in (self.spec.method, self.spec.reference) if d is not decoder)

    def spare_cache_bytes(self, decoder) -> int:
        """Bytes of the shared static cache beyond the slots ``decoder`` needs: the run allocates it once, for the
        larger of the method's and the reference's needs over the run's samples (the plan's ``own_slots``),
        rounded up to whole blocks (:func:`~fafo.engine.engine.cache_slots`). 0 where the cache was released."""
        cache, plan = self.engine.static_cache, self.spec.plan
        if cache is None or plan is None or not any(decoder is d for d in (self.spec.method, self.spec.reference)):
            return 0
        own = plan.own_slots[decoder is self.spec.reference]
        return max(0, cache.max_len - own) * cache.nbytes // cache.max_len

    def eager(self, eager: bool):
        """Decode steps eager inside (``eager``) on an engine whose steps are compiled."""
        return self.engine.eager_steps() if eager and self.engine.compiled is not None else nullcontext()

    def warmup(self) -> float:
        """``bench.warmup`` generations of the first prompt by every decoder, excluded from all timings; with
        compiled steps at least one (two with CUDA graphs, which record on a graph's second call), compiling every
        step shape. Each decoder's warm-up peak is kept (:meth:`~fafo.bench.timing.PeakMemory.warm`); cross-request
        state (:attr:`~fafo.decoding.Decoder.cross_request_state`) is restored afterwards."""
        spec = self.spec
        rounds = max(spec.bench.warmup, (2 if spec.compile.cudagraphs else 1) if spec.compile is not None else 0)
        if not rounds or not spec.samples:
            return 0.0
        sample = spec.samples[0]
        prompt = spec.task.prompt_ids(self.engine.tokenizer, sample, 0, [])
        decoders = (spec.method, spec.reference)
        before = [d.snapshot() for d in decoders]  # warm-up leaves no learnt state behind
        runs = [(spec.method, spec.method_eager), (spec.reference, False)] + \
            ([(spec.reference, True)] if spec.method_eager else [])  # the eager vanilla timed beside an eager method
        total, tokens = 0.0, min(spec.max_new_tokens(sample), spec.bench.warmup_tokens)
        for _ in range(rounds):
            for decoder, eager in runs:
                self.memory.reset()
                self.clock.start()
                with self.eager(eager):
                    decoder.generate(self.engine, prompt, tokens, self.eos, spec.sampling,
                                     spec.sampling.generator(0, spec.device))
                    decoder.warm_shapes(self.engine)  # step shapes the generation did not take
                self.clock.stop()
                total += self.clock.total_s
                self.memory.warm((id(decoder), eager), self.others_held(decoder) + self.spare_cache_bytes(decoder))
        for decoder, snapshot in zip(decoders, before):
            decoder.restore(snapshot)
        if cudagraph_skips():  # each skipped graph would run without replay inside every timed sample
            raise RuntimeError(
                f"{cudagraph_skips()} compiled decode steps were not recorded as CUDA graphs (a CPU tensor or a "
                "dynamic shape reached a compiled step; TORCH_LOGS=perf_hints names it): timings would be of "
                "replay-free steps. Fix the decoder, or run with bench.compile_mode=default")
        return total
