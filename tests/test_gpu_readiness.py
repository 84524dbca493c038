"""What a first GPU run depends on, checked on the CPU: the single fused vanilla step on every attention path,
host-to-device copies and device-to-host reads per decode step, isolation between the methods of one process,
warm-up that leaves no compilation in timed rows, and the main comparison compiled and in bfloat16."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import fafo.engine.attention as attention
import fafo.engine.engine as engine_module
import fafo.engine.upload as upload_module
import fafo.tree
from baselines.vanilla import VanillaDecoder
from fafo.bench.metrics import summarize
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.bench.tools.host_probe import DeviceTraffic
from fafo.engine.compiled import CompiledStep, CompileOptions, reset_compiled_state
from fafo.engine.cache import KVCache
from fafo.engine.engine import Engine
from tests.lossless import PROMPTS
from tests.helpers import make_cfg, read_rows, run_cli
from tests.methods import METHODS as CASES

# One small instance per method class with its budgets per decode step (tests/methods.py, Traffic; the docs:
# docs/performance.md, "The GPU path, checked on the CPU"). Host-to-device copies: one packed upload per forward of
# the target (tokens, positions, slots and a tree's mask together), plus what a method moves besides (FAFO's KV
# moves are slices or built on the device; LongSpec drafts its tree on the device: the verification's upload and the
# KV move). Device-to-host reads (each a sync on CUDA): the step's verification, plus each drafted token of a
# drafting loop on the host (TriForce's middle level, SWIFT's confidence), a greedy draft chain once (QuantSpec's
# drafts, TriForce's draft model per proposal: fafo.engine.batching.greedy_chain), LongSpec's tree once, Token
# Recycling's top-k, FAFO-Quest's count of swaps (its busiest row's, which sizes the swap lists).
TRAFFIC = {name: case for name, case in CASES.items() if case.traffic}


class FactoryCopies(TorchFunctionMode):
    """Counts tensors built from Python data straight on a device (``torch.tensor(..., device=...)``): on CUDA
    each is a blocking copy from pageable memory."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("tensor", "as_tensor") and kwargs.get("device") is not None \
                and args and not isinstance(args[0], torch.Tensor):
            self.n += 1
        return func(*args, **kwargs)


READS_PER_GENERATION = 5  # the prompt's next token, and a gathered step mask built once per mask


@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_device_to_host_reads_per_step(name, engine):
    eng = engine("llama_gqa")
    ids = eng.tokenizer(PROMPTS[0] * 2).input_ids
    method = TRAFFIC[name].traffic_instance()
    with DeviceTraffic(eng.model.parameters()) as traffic:
        method.setup(eng)
        gen = method.generate(eng, ids, 40)
    steps, reads = len(gen.accept_lengths), traffic.d2h
    assert gen.tokens == VanillaDecoder().generate(eng, ids, 40).tokens
    assert steps and reads >= steps, "every step reads its committed tokens: the probe missed them"
    assert reads <= TRAFFIC[name].traffic.reads * steps + READS_PER_GENERATION, f"{reads} reads in {steps} steps"


def test_the_read_probe_sees_each_kind_of_read():
    """The host-work probe's transfers (:class:`DeviceTraffic`), which the read budgets above and the host table
    count with."""
    w = torch.ones(3)
    with DeviceTraffic([w]) as traffic:
        x = (w * 2).argmax()
        host = torch.zeros(2, dtype=torch.long)
        copied = (w + 1).cpu()
        _ = x.item(), int(x), bool(x), x.tolist(), [0, 1][x]
        host[0] = x
        on_device = torch.arange(3, device=w.device)
        _ = on_device.tolist(), torch.tensor([1, 2]).to(w.device).sum().item()
        before = traffic.d2h
        _ = host.tolist(), torch.arange(4).sum().item(), copied.tolist()  # host values: free
    assert before == 9 and traffic.d2h == before
    assert traffic.h2d == 1  # the host tensor moved with .to(device); arange(device=) is made there


@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_host_to_device_copies_per_step(name, engine, monkeypatch):
    eng = engine("llama_gqa")
    uploads = []
    real = engine_module.upload

    def counted(values, device, dtype=torch.long):
        out = real(values, device, dtype)
        uploads.append(out is not values)
        return out

    for module in (engine_module, fafo.tree):  # SWIFT compacts through fafo.tree too
        monkeypatch.setattr(module, "upload", counted)
    method = TRAFFIC[name].traffic_instance()
    method.setup(eng)
    ids = eng.tokenizer(PROMPTS[0] * 2).input_ids
    with FactoryCopies() as factory:
        gen = method.generate(eng, ids, 40)
    steps = len(gen.accept_lengths)
    copies = sum(uploads) + factory.n
    assert gen.tokens == VanillaDecoder().generate(eng, ids, 40).tokens
    assert copies <= TRAFFIC[name].traffic.copies * steps + 1, f"{copies} copies in {steps} steps (+1 for the prompt)"


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_vanilla_eager_step_is_one_attention_call(backend, engine, monkeypatch):
    """No split into prefix and step parts, no log-sum-exp merge: the token's KV is read from the cache."""
    eng = engine("qwen2_gqa", backend)
    merges = []
    real = attention.merge
    monkeypatch.setattr(attention, "merge", lambda *a: merges.append(1) or real(*a))
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    tokens = VanillaDecoder().generate(eng, ids, 12).tokens
    assert merges == []
    assert tokens == VanillaDecoder().generate(engine("qwen2_gqa", "dense"), ids, 12).tokens


@pytest.mark.parametrize("attention_kind", ["flex", "sdpa"])
def test_vanilla_compiled_step_reads_its_token_from_the_cache(attention_kind, checkpoint, engine, monkeypatch):
    """Compiled over the static capacity (CUDA's path: CUDA graphs or FlexAttention), vanilla's step has the
    one-call plan too: the live length counts the token whose KV was just written."""
    reset_compiled_state()
    eng = Engine.from_pretrained(str(checkpoint("llama_mha")))
    eng.enable_compile(CompileOptions(backend="aot_eager", attention=attention_kind))
    eng.compiled.live_lengths = False  # the static-capacity path CUDA graphs take (sdpa on CPU is dynamic)
    eng.cache(256)
    plans = []
    real = CompiledStep.static_plan

    def spy(self, cache, plan, n_queries):
        out = real(self, cache, plan, n_queries)
        plans.append((plan.prefix, out))
        return out

    monkeypatch.setattr(CompiledStep, "static_plan", spy)
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    assert VanillaDecoder().generate(eng, ids, 10).tokens == VanillaDecoder().generate(
        engine("llama_mha"), ids, 10).tokens
    assert plans and all(p.step_in_cache for _, p in plans)
    prefix, last = plans[-1]
    assert int(last.prefix_length[0]) == prefix + 1 and last.prefix == 256
    reset_compiled_state()


def test_upload_is_one_packed_copy_with_aligned_views():
    """What a device gets (the packed path, forced on the CPU here)."""
    mask = torch.eye(3, dtype=torch.bool)
    tokens, positions, none, got = upload_module.upload([[5, 6, 7], range(10, 13), None, mask], "cpu", pack=True)
    assert tokens.tolist() == [5, 6, 7] and positions.tolist() == [10, 11, 12] and none is None
    assert got.dtype == torch.bool and torch.equal(got, mask)
    assert positions.data_ptr() - tokens.data_ptr() == 8 * upload_module.ALIGN  # one buffer, aligned views
    # flat lists of ints (a decode step's inputs) are packed by one conversion; other values beside them by numpy
    for values in ([[5], [300], list(range(9)), []], [[5], np.array([[1, 2], [3, 4]]), [[6, 7], [8, 9]], [True]]):
        got = upload_module.upload(values, "cpu", pack=True)
        assert [g.tolist() for g in got] == [np.asarray(v).tolist() for v in values]
        assert [g.dtype for g in got] == [torch.bool if np.asarray(v).dtype == bool else torch.long for v in values]
        assert all(g.data_ptr() % (8 * upload_module.ALIGN) == got[0].data_ptr() % (8 * upload_module.ALIGN)
                   for g in got if g.numel() and g.dtype == torch.long)  # (a bool value is converted, not a view)
    for floats in (torch.ones(2), np.ones(2), [[0.5, 1.5]]):
        with pytest.raises(TypeError, match="integer and bool"):
            upload_module.upload([[5], floats], "meta")


UPLOADS = [[[5], [300], list(range(9)), []], [[5], np.array([[1, 2], [3, 4]]), [[6, 7], [8, 9]], [True]],
           [range(10, 13), None, torch.eye(3, dtype=torch.bool), np.array([3, 4], dtype=np.int32), torch.tensor([7])]]


@pytest.mark.parametrize("values", UPLOADS, ids=["ints", "arrays", "mask"])
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_upload_on_the_cpu_gives_the_packed_values_in_arrays_of_their_own(values, dtype):
    """On the CPU each value becomes its own array (no copy to save): the same values, shapes and dtypes as the
    packed path's, none sharing memory with the caller's arrays; under a torch mode (a probe counting what a device
    runs) the packed path runs."""
    got = upload_module.upload(values, "cpu", dtype)
    packed = upload_module.upload(values, "cpu", dtype, pack=True)
    for g, p, v in zip(got, packed, values):
        if v is None:
            assert g is None and p is None
            continue
        assert g.dtype == p.dtype and g.shape == p.shape and torch.equal(g, p)
        if isinstance(v, np.ndarray):
            assert not np.shares_memory(g.numpy(), v)
        if isinstance(v, torch.Tensor):  # already on the device: passed through
            assert g is v
    assert len({g.data_ptr() for g in got if g is not None and g.numel()}) == sum(
        1 for g in got if g is not None and g.numel())  # separate arrays, not views of one buffer
    with FactoryCopies():
        under_mode = upload_module.upload(values, "cpu", dtype)
    starts = [g.data_ptr() for g, v in zip(under_mode, values)
              if v is not None and not isinstance(v, torch.Tensor) and g.numel() and g.dtype != torch.bool]
    assert max(starts) - min(starts) < 8 * 64  # views of one packed buffer


def test_release_leaves_only_the_weights(tmp_path):
    spec = resolve(make_cfg(tmp_path, "model=tiny_llama", "method=triforce_nodraft", "method.budget=16",
                            "bench.max_samples=1", "bench.max_new_tokens=8", "bench.warmup=0"), tmp_path / "run")
    runner = Runner()
    runner.run(spec, report=False)
    assert runner.engine.static_cache is None and runner.engine.compiled is None
    init = {f.name: getattr(spec.method, f.name) for f in dataclasses.fields(spec.method) if f.init}
    assert vars(spec.method).keys() == vars(type(spec.method)(**init)).keys()
    held = [k for k, v in vars(spec.method).items() if isinstance(v, (torch.Tensor, Engine, KVCache))]
    assert held == []


def test_compiled_rows_are_left_out_of_speedups():
    def row(sample, total, compiles):
        return {"sample_id": sample, "turn": 0, "repeat": 0, "status": "ok", "new_tokens": 11, "forwards": 10,
                "target_forwards": 11, "total_s": total, "decode_s": total, "prefill_s": 0.0, "ref_total_s": 1.0,
                "ref_decode_s": 1.0, "ref_new_tokens": 11, "ref_source": "interleaved", "peak_mem_mb": 1.0,
                "compiles": compiles}

    clean = summarize([row("a", 0.5, 0), row("b", 0.5, 0)], n_boot=0)
    hit = summarize([row("a", 0.5, 0), row("b", 50.0, 3)], n_boot=0)
    assert clean["n_compiled"] == 0 and hit["n_compiled"] == 1 and hit["compiled"] == ["b/0"]
    assert hit["speedup"] == pytest.approx(clean["speedup"]) == pytest.approx(2.0)
    assert hit["tau"] == clean["tau"]  # counts keep every row


def test_cuda_graph_skip_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr("fafo.bench.timing.cudagraph_skips", lambda: 2)
    cfg = make_cfg(tmp_path, "model=tiny_llama", "bench.max_samples=1", "bench.max_new_tokens=4",
                   "bench.compile=true", "bench.compile_backend=aot_eager")
    with pytest.raises(RuntimeError, match="not recorded as CUDA graphs"):
        Runner().run(resolve(cfg, tmp_path / "run"), report=False)


def _demo(tmp_path, *overrides) -> dict[str, dict]:
    out = tmp_path / "out"
    proc = run_cli("experiment=demo", "model=tiny_llama", "bench.max_new_tokens=16", "bench.progress=false",
                   "task.ids=[chat-01,code-01]", f"bench.output_dir={out}", *overrides, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recompile" not in proc.stderr.lower()
    runs = {p.parent.name: p for p in out.rglob("summary.json")}
    assert len(runs) == 13, sorted(runs)
    return {name: {"summary": json.loads(p.read_text()), "rows": read_rows(p.parent)} for name, p in runs.items()}


@pytest.mark.slow
def test_main_comparison_compiled_is_token_identical_without_compiling_while_timed(tmp_path):
    """The main job with compiled steps (the CUDA path's graphs: FlexAttention, static shapes), every method in
    one process: each starts on a reset compiler, none hits the recompile limit, none compiles in a timed row."""
    runs = _demo(tmp_path, "bench.compile=true", "bench.compile_backend=aot_eager", "bench.compile_attention=flex")
    for name, run in runs.items():
        assert run["summary"]["n_failed"] == 0, (name, run["summary"]["failed"])
        assert run["summary"]["exact_match_rate"] == 1.0, name
        assert run["summary"]["n_compiled"] == 0, (name, [r["compiles"] for r in run["rows"]])
        # one baseline: every method races the compiled vanilla; one that cannot run compiled says so
        assert run["summary"]["reference_backend"] == "compiled" and run["summary"]["compiled_graphs"] >= 1, name
        assert bool(run["summary"]["timing_note"]) == (run["summary"]["method_backend"] == "eager"), name


@pytest.mark.slow
def test_main_comparison_in_bfloat16_is_exact_or_ties(tmp_path):
    """Half precision: a method may pick another token where two logits tie within rounding; every mismatch is
    classified by the float32 check, and none is a divergence."""
    runs = _demo(tmp_path, "bench.dtype=bfloat16")
    for name, run in runs.items():
        s = run["summary"]
        assert s["n_failed"] == 0, (name, s["failed"])
        assert s["n_mismatch_divergence"] == 0, (name, [r["mismatch_kind"] for r in run["rows"]])
        exact = [r for r in run["rows"] if r["exact_match"] == "True"]
        assert len(exact) + s["n_mismatch_tie"] == s["n_turns"], name


@pytest.mark.slow
def test_peak_memory_of_vanilla_is_the_same_after_another_method(tmp_path):
    """Isolation: vanilla's peak after a method with a larger cache equals its peak run alone, and so does the
    vanilla timed beside that method, though the run's shared cache has the method's scratch slots too."""
    common = ["model=tiny_llama", "bench.max_new_tokens=8", "task.ids=[chat-01]", "bench.progress=false"]
    after = run_cli(*common, "compare.methods=[lookahead,vanilla]", "+compare.overrides.lookahead=['method.window=60']",
                    f"bench.output_dir={tmp_path / 'a'}",
                    cwd=tmp_path)
    alone = run_cli(*common, "method=vanilla", f"bench.output_dir={tmp_path / 'b'}", cwd=tmp_path)
    assert after.returncode == 0 and alone.returncode == 0, after.stderr[-3000:] + alone.stderr[-3000:]
    rows = {p.parent.name: read_rows(p.parent) for p in tmp_path.rglob("samples.csv")}
    van = next(rows[k] for k in rows if k == "vanilla")[0]
    solo = next(r for k, v in rows.items() if k not in ("vanilla", "lookahead") for r in v)
    assert float(van["peak_mem_mb"]) == float(solo["peak_mem_mb"]) == float(van["ref_peak_mem_mb"])
    look = rows["lookahead"][0]
    assert float(look["peak_mem_mb"]) > float(look["ref_peak_mem_mb"]) == float(solo["peak_mem_mb"])


def test_a_mask_uploaded_under_inference_mode_is_cached():
    """On CUDA a tree's mask reaches attention as a tensor made inside the engine's inference mode, which tracks
    no version count: the gathered-mask and BlockMask caches must still key it."""
    from fafo.engine.flex_masks import FlexMasks
    from fafo.engine.kernels import gathered_mask

    with torch.inference_mode():
        mask = torch.ones(4, 4, dtype=torch.bool).tril()
        assert mask.is_inference()
        assert gathered_mask(mask) is gathered_mask(mask)
        masks = FlexMasks(torch.device("cpu"))
        assert masks.step(mask) is masks.step(mask)
