"""Speedups that noise cannot fake: a slow reference sample (a sleeping hook) under interleaved and stored timing."""

import time
from dataclasses import dataclass

import pytest

from baselines.vanilla import VanillaDecoder
from fafo.bench.metrics import bootstrap_ci
from fafo.bench.reference import timing_reusable
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from tests.helpers import make_cfg, read_rows

SLEEP_S = 1.0


@dataclass
class SleepyReference(VanillaDecoder):
    """Vanilla that sleeps inside its timed generation on chosen calls, or on every call for one prompt length.

    The knobs are class attributes, not fields, so the reference key (which holds the decoder's repr) stays the
    same whatever they are.
    """

    def generate(self, engine, prompt_ids, max_new_tokens, *args, **kwargs):
        SleepyReference.calls += 1
        if SleepyReference.calls in SleepyReference.sleep_calls or len(prompt_ids) == SleepyReference.sleep_len:
            time.sleep(SLEEP_S)
        return super().generate(engine, prompt_ids, max_new_tokens, *args, **kwargs)


SleepyReference.calls, SleepyReference.sleep_calls, SleepyReference.sleep_len = 0, set(), -1
BASE = ["bench.max_new_tokens=6", "bench.max_samples=3", "bench.warmup=0", "bench.repeats=3",
        "bench.busy_load=1000", "bench.reference._target_=tests.test_timing.SleepyReference"]


def _sleepy(calls=(), prompt_len=-1):
    SleepyReference.calls, SleepyReference.sleep_calls, SleepyReference.sleep_len = 0, set(calls), prompt_len


def test_slow_reference_sample_cannot_fake_a_speedup(tmp_path):
    # interleaved (default): the second reference call (sample 0, repeat 1) sleeps 1 s
    _sleepy(calls=[2])
    summary = Runner().run(resolve(make_cfg(tmp_path, *BASE, "bench.max_spread=10"), tmp_path / "a"))
    rows = read_rows(tmp_path / "a")
    first = rows[0]["sample_id"]
    slowed = [r for r in rows if r["sample_id"] == first and r["repeat"] == "1"][0]
    assert float(slowed["speedup"]) > 5  # that one row alone would claim a large speedup...
    ids = {r["sample_id"] for r in rows}
    mean_ref = {s: sum(float(r["ref_total_s"]) for r in rows if r["sample_id"] == s) / 3 for s in ids}
    method = {s: sorted(float(r["total_s"]) for r in rows if r["sample_id"] == s)[1] for s in mean_ref}
    assert sum(mean_ref.values()) / sum(method.values()) > 3  # ...and so would a mean over repeats
    assert summary["speedup"] < 2.5  # the median over repeats is unaffected: vanilla against itself
    assert summary["flagged"] == [f"{first}/0"] and summary["n_flagged"] == 1  # its repeats disagree
    # the store now holds [fast, slow, fast] for sample 0: a later run asking for reuse re-times that one
    _sleepy()
    summary = Runner().run(resolve(make_cfg(tmp_path, *BASE, "bench.max_spread=10", "bench.reuse_max_spread=10",
                              "bench.reuse_reference=true"), tmp_path / "b"))
    source = {r["sample_id"]: r["ref_source"] for r in read_rows(tmp_path / "b")}
    assert source.pop(first) == "interleaved" and set(source.values()) == {"stored"}
    assert summary["ref_reuse_refused"]["n"] == 1 and summary["speedup"] < 2.5


def test_consistently_slow_stored_reference_is_flagged_when_reused(tmp_path, capsys):
    # every repeat of one sample's stored reference slept: spread passes, so reuse is possible, and it shows
    _sleepy()
    cfg = make_cfg(tmp_path, *BASE, "bench.max_spread=10")
    spec = resolve(cfg, tmp_path / "probe")
    _sleepy(prompt_len=len(spec.task.prompt_ids(spec.ckpt.tokenizer, spec.samples[0], 0, [])))
    Runner().run(spec)  # stores 3 slow, agreeing repeats for sample 0 (as if taken while the machine was loaded)
    _sleepy()
    capsys.readouterr()
    summary = Runner().run(resolve(make_cfg(tmp_path, *BASE, "bench.max_spread=10", "bench.reuse_max_spread=10",
                              "bench.reuse_reference=true"), tmp_path / "b"))
    assert summary["ref_sources"] == {"stored": 9} and summary["speedup"] > 3  # the stale timing inflates it...
    assert "rows use a stored reference timing" in capsys.readouterr().err  # ...and the run says so
    # and the default, interleaved, is not fooled by the store
    summary = Runner().run(resolve(make_cfg(tmp_path, *BASE, "bench.max_spread=10"), tmp_path / "c"))
    assert summary["ref_sources"] == {"interleaved": 9} and summary["speedup"] < 2.5


def test_stored_timing_rules_and_bootstrap_interval():
    good = {"total_s": [1.0, 1.1, 1.05], "load": 0.1, "cpu_count": 2}
    assert timing_reusable(good, 1.5, 0.75) == (True, "")
    assert not timing_reusable({**good, "total_s": [1.0]}, 1.5, 0.75)[0]
    assert "spread" in timing_reusable({**good, "total_s": [1.0, 10.2, 1.0]}, 1.5, 0.75)[1]
    assert "busy" in timing_reusable({**good, "load": 8.0}, 1.5, 0.75)[1]
    import numpy as np

    arrays = {"ref": np.array([2.0, 2.2, 1.8, 2.1]), "method": np.array([1.0, 1.0, 1.0, 1.0])}

    def ratio(a):  # over the last axis: the samples (one row per resample when bootstrapping)
        return a["ref"].sum(-1) / a["method"].sum(-1)

    lo, hi = bootstrap_ci(ratio, arrays, 2000)
    assert 1.8 <= lo < ratio(arrays) < hi <= 2.2
    assert bootstrap_ci(ratio, arrays, 2000) == [lo, hi]  # seeded: reproducible
    assert bootstrap_ci(ratio, {k: v[:1] for k, v in arrays.items()}) is None  # one sample: no interval at all


def test_intervals_are_labelled_by_what_they_are_at_each_sample_count():
    """n >= 10: a 95 % bootstrap interval; 2..9: the per-sample range (at n = 3 the percentile bootstrap interval
    is exactly that range, so calling it 95 % would be false); 1: none."""
    import numpy as np

    from fafo.bench.metrics import MIN_BOOTSTRAP, interval, interval_kind, sample_range, summarize
    from tests.report_runs import make_rows

    def ratio(a):
        return a["ref"].sum(-1) / a["method"].sum(-1)

    three = {"ref": np.array([2.0, 2.6, 1.8]), "method": np.ones(3)}
    assert bootstrap_ci(ratio, three, 4000) == pytest.approx([1.8, 2.6])  # the bootstrap gives just the range...
    assert sample_range(ratio, three) == [1.8, 2.6]
    assert interval("speedup", ratio, three, 1000) == {"speedup_range": [1.8, 2.6]}  # ...so it is named a range
    assert [interval_kind(n) for n in (1, 2, MIN_BOOTSTRAP - 1, MIN_BOOTSTRAP)] == ["none", "range", "range", "ci95"]
    twelve = {"ref": np.linspace(1.5, 2.5, 12), "method": np.ones(12)}
    assert set(interval("speedup", ratio, twelve, 1000)) == {"speedup_ci95"}
    assert interval("speedup", ratio, {k: v[:1] for k, v in three.items()}, 1000) == {}
    rows, _ = make_rows("m", "fafo", "t", 0)  # 4 samples
    s = summarize(rows, n_boot=200)
    assert s["interval"] == "range" and not any(k.endswith("_ci95") for k in s)
    taus = [r["tau"] for r in rows if r["status"] == "ok"]  # one turn and repeat each: a sample's own tau
    assert s["speedup_range"] == s["speedup_e2e_range"] and s["tau_range"] == pytest.approx([min(taus), max(taus)])
    one = summarize([r for r in rows if r["sample_id"] == "s0"], n_boot=200)
    assert one["interval"] == "none" and not any(k.endswith(("_ci95", "_range")) for k in one)


def test_a_stored_timing_is_reused_only_within_the_tight_spread():
    good = {"total_s": [1.0, 1.05, 1.08], "load": 0.1, "cpu_count": 2}
    assert timing_reusable(good, 1.1, 0.75)[0]
    assert "spread 1.20x" in timing_reusable({**good, "total_s": [1.0, 1.2, 1.1]}, 1.1, 0.75)[1]


def test_busy_machine_warning_and_machine_record():
    import torch

    from fafo.bench.timing import busy_warning, machine_state

    assert busy_warning({"load_start": 3.0, "cpu_count": 2}, 0.75).startswith("warning: the machine is busy: load")
    assert busy_warning({"load_start": 1.0, "cpu_count": 2}, 0.75) is None
    assert "on the GPU" in busy_warning({"load_start": 0.0, "cpu_count": 2, "gpu_others_mb": 5000.0}, 0.75)
    state = machine_state(torch.device("cpu"))
    assert state["threads"] == torch.get_num_threads() and state["cpu_count"] >= 1 and state["load_start"] is not None


def test_cuda_peak_of_a_generation_counts_its_own_compiled_steps_only(monkeypatch):
    """On CUDA a replay allocates nothing and every decoder's graphs share one pool (torch/_inductor/
    cudagraph_trees.py, CUDAGraphTreeManager / CUDAGraphNode.run_graph): each decoder's peak takes its own warm-up
    peak (its steps allocated their intermediates then), never the pool's free part, which another decoder's
    intermediates would inflate."""
    import torch

    from fafo.bench.timing import PeakMemory

    allocated = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocated.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    memory, mb = PeakMemory(torch.device("cuda")), 2**20

    def generation(key, peak_mb, warm=False):
        memory.reset()
        allocated["peak"] = peak_mb * mb
        if warm:
            memory.warm(key)
        return memory.peak_mb(None, {}, key)

    generation("method", 900, warm=True)  # recording its graphs: weights + cache + its 400 MB of intermediates
    generation("vanilla", 600, warm=True)  # vanilla's: 100 MB of intermediates
    assert generation("method", 500) == 900 and generation("vanilla", 500) == 600  # replays: 500 MB live
    assert generation("vanilla", 700) == 700  # a longer prompt's eager prefill beyond the warm-up peak counts


def test_cuda_peak_leaves_out_what_the_other_decoder_holds(monkeypatch):
    """A method that keeps a draft model or a reused cache allocated between its generations (``held_bytes``)
    has them on the device while vanilla decodes: they come off vanilla's CUDA peak (warm-up and timed), not off
    the method's own."""
    import torch

    from fafo.bench.timing import PeakMemory

    allocated = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocated.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    memory, mb = PeakMemory(torch.device("cuda")), 2**20
    held = 300 * mb  # e.g. QuantSpec's kept quantized cache and 4-bit MLPs

    def generation(key, peak_mb, others, warm=False):
        memory.reset()
        allocated["peak"] = peak_mb * mb
        if warm:
            memory.warm(key, others)
        return memory.peak_mb(None, {}, key, others)

    assert generation("method", 1000, 0, warm=True) == 1000  # its own held bytes stay in its peak
    assert generation("vanilla", 900, held, warm=True) == 600  # 600 MB of vanilla's own + the method's 300
    assert generation("vanilla", 850, held) == 600 and generation("vanilla", 1000, held) == 700
    assert generation("method", 950, 0) == 1000


def test_each_decoder_is_charged_only_the_shared_cache_slots_it_needs(monkeypatch):
    """The run's shared cache has the slots of the larger need (the method's scratch), rounded up to whole blocks;
    each decoder is charged the slots it needs, the rest comes off its peak, on CUDA and CPU alike."""
    from types import SimpleNamespace

    import torch

    from fafo.bench.plan import JobPlan
    from fafo.bench.timing import Meter, PeakMemory
    from fafo.engine.engine import CACHE_BLOCK

    method, vanilla = object(), object()
    per_slot = 1000
    cache = SimpleNamespace(max_len=2 * CACHE_BLOCK, nbytes=2 * CACHE_BLOCK * per_slot)
    engine = SimpleNamespace(static_cache=cache, weights_nbytes=10**6, cache_nbytes=cache.nbytes)
    meter = Meter.__new__(Meter)
    meter.engine = engine
    meter.spec = SimpleNamespace(method=method, reference=vanilla,
                                 plan=JobPlan(own_slots=(CACHE_BLOCK + 20, CACHE_BLOCK - 20)))
    assert meter.spare_cache_bytes(method) == (CACHE_BLOCK - 20) * per_slot  # the engine's rounding
    assert meter.spare_cache_bytes(vanilla) == (CACHE_BLOCK + 20) * per_slot  # + the method's 40 slots of scratch
    assert meter.spare_cache_bytes(object()) == 0  # a decoder of no run: nothing known, nothing taken off
    engine.static_cache = None  # released (a decoder with a cache of its own)
    assert meter.spare_cache_bytes(vanilla) == 0
    engine.static_cache = cache
    meter.spec.plan = None
    assert meter.spare_cache_bytes(vanilla) == 0

    spare, mb = (CACHE_BLOCK + 20) * per_slot, 2**20
    cpu = PeakMemory(torch.device("cpu"))
    assert cpu.peak_mb(engine, {"buffer_bytes": 7}) * mb == 10**6 + cache.nbytes + 7
    assert cpu.peak_mb(engine, {}, spare=spare) * mb == 10**6 + cache.nbytes - spare
    allocated = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocated.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    cuda = PeakMemory(torch.device("cuda"))
    allocated["peak"] = 5 * 10**6
    cuda.warm("vanilla", 100 + spare)  # warm-up: the other's held bytes and the spare slots both off
    allocated["peak"] = 4 * 10**6
    assert cuda.peak_mb(None, {}, "vanilla", 100, spare) * mb == 5 * 10**6 - 100 - spare
    allocated["peak"] = 6 * 10**6
    assert cuda.peak_mb(None, {}, "vanilla", 100, spare) * mb == 6 * 10**6 - 100 - spare


def test_decoders_report_what_they_keep_between_generations(engine, checkpoint, fresh_dynamo):
    """``held_bytes``: QuantSpec's 4-bit MLPs (and, compiled, its kept quantized cache), LongSpec's draft layer;
    vanilla nothing; the meter charges each decoder's to the other one only."""
    from types import SimpleNamespace

    from baselines.longspec import LongSpecDecoder
    from baselines.quantspec import QuantSpecDecoder
    from baselines.triforce import TriForceDecoder
    from baselines.vanilla import VanillaDecoder
    from fafo.bench.timing import Meter
    from fafo.engine.compiled import CompileOptions
    from tests.compiled_cases import compiled_engine
    from tests.methods import DRAFT_SPEC, TRIFORCE_SMALL

    eng = engine("llama_gqa")
    ids = eng.tokenizer("hello there, general").input_ids
    quant = QuantSpecDecoder(group_size=16, gamma=2, weight_group=32)
    assert quant.held_bytes() == 0
    quant.generate(eng, ids, 4)
    mlps = sum(m.nbytes for m in quant._mlps[1])
    assert quant.held_bytes() == mlps > 0  # eager: the quantized cache was freed with its generation
    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager"))
    quant.generate(compiled, ids, 4)
    assert quant.held_bytes() == sum(m.nbytes for m in quant._mlps[1]) + quant._kept[1].nbytes > mlps
    longspec = LongSpecDecoder(draft={"path": None, "random_seed": 0})
    longspec.setup(eng)
    assert longspec.held_bytes() > 0
    triforce = TriForceDecoder(**TRIFORCE_SMALL, draft={"tiny": DRAFT_SPEC})
    triforce.setup(eng)
    assert triforce.held_bytes() >= triforce._loaded[1].engine.weights_nbytes > 0
    vanilla = VanillaDecoder()
    meter = Meter.__new__(Meter)
    meter.spec = SimpleNamespace(method=quant, reference=vanilla)
    assert meter.others_held(vanilla) == quant.held_bytes() and meter.others_held(quant) == 0
