"""Host work per decoding step (fafo/bench/tools/host_probe.py, host_work.py): every method config dispatches a
listed handful of ops per step outside its model forwards, the same number at 4 layers as at 8, and the probe, the
host-time measurement and the ``host`` table count what they say."""

import csv
import importlib.util
import statistics
from pathlib import Path

import pytest
import torch

from fafo.bench.tools.host_probe import HostWork, count_host_work
from fafo.bench.tools.host_work import budget_overrides, build_method, host_model, identity_layers
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine
from tests.helpers import make_cfg, read_rows
from tests.lossless import PROMPTS
from tests.methods import METHODS

# Most torch ops one decoding step (its commit included) dispatches outside model forwards, per method config, at
# any depth (docs/performance.md, "Host work per step"; tests/methods.py, ``ops``): the ops a device would launch
# eagerly around its (compiled) forwards. Reads and copies are counted apart (tests/test_gpu_readiness.py).
OPS_PER_STEP = {name: case.ops for name, case in METHODS.items()}
LIMIT = 40  # the most any method may dispatch per step (docs/performance.md)
# their skip sets cover different layers at another depth: the drafts, hence the steps, differ
SAME_STEPS_EXCEPT = {"swift", "swift_script"}
NEW_TOKENS = 40  # past SWIFT's first layer-set scoring (context_window + 2 tokens)


@pytest.fixture(scope="module")
def depths(ckpt_root):
    ckpt = host_model(4, ckpt_root)
    shallow, deep = Engine.from_pretrained(str(ckpt)), identity_layers(ckpt, 4)
    ids = shallow.tokenizer(PROMPTS[0] * 12).input_ids[:160]
    return shallow, deep, ids


def test_every_method_config_has_a_budget():
    assert all(OPS_PER_STEP.values()) and max(OPS_PER_STEP.values()) <= LIMIT


@pytest.mark.slow  # every method config at two depths: about a minute
@pytest.mark.parametrize("name", sorted(METHODS))
def test_host_ops_per_step_are_few_and_do_not_grow_with_depth(name, depths):
    shallow, deep, ids = depths
    overrides = [*METHODS[name].overrides, *budget_overrides(name)]  # budgets below the prompt: swaps happen
    probes = {}
    for eng in (shallow, deep):
        probes[eng.model.args.n_layers] = count_host_work(build_method(name, overrides), eng, ids, NEW_TOKENS)
    four, eight = probes[4], probes[8]
    assert four.steps and eight.steps, "no decoding step was counted"
    for probe in (four, eight):
        assert probe.per_step("ops")[1] <= OPS_PER_STEP[name], [s["ops"] for s in probe.steps]
    if name not in SAME_STEPS_EXCEPT:
        assert four.generation.tokens == eight.generation.tokens
        assert four.steps == eight.steps, "per-layer work outside the forwards"


@pytest.mark.slow  # compiles each method's steps (aot_eager): about 30 s
@pytest.mark.compat
@pytest.mark.parametrize("name", ["vanilla", "prompt_lookup", "fafo_stream", "lookahead", "triforce_nodraft"])
def test_compiled_steps_add_one_write_per_forward_and_no_read(name, ckpt_root):
    """The compiled path (the graphs a GPU replays: FlexAttention over the static cache, traced here by aot_eager)
    adds to a step's eager host work only what each forward's graph inputs need outside the graph: its live length
    (one write; the block counts of its masks once per 128 tokens) and a tree's mask copied into the graph's
    buffer; and it reads nothing more. A greedy forward's argmax (TriForce's, QuantSpec's) runs inside its graph:
    that op leaves the step's host work."""
    from fafo.engine.compiled import CompileOptions, reset_compiled_state

    ckpt = host_model(4, ckpt_root)
    probes, forwards = {}, {}
    for compiled in (False, True):
        reset_compiled_state()
        eng = Engine.from_pretrained(str(ckpt))
        if compiled:
            eng.enable_compile(CompileOptions(backend="aot_eager", attention="flex"))
        ids = eng.tokenizer(PROMPTS[0] * 12).input_ids[:160]
        probes[compiled] = count_host_work(build_method(name, budget_overrides(name)), eng, ids, NEW_TOKENS)
        counts = probes[compiled].generation.forwards
        forwards[compiled] = counts.verify + counts.draft + counts.aux
    eager, comp = probes[False], probes[True]
    assert comp.generation.tokens == eager.generation.tokens and len(comp.steps) == len(eager.steps)
    assert [s["d2h"] for s in comp.steps] == [s["d2h"] for s in eager.steps]
    # a tree's mask, new at every step, is copied into the compiled step's buffer (FAFO's, the same at every step,
    # once per generation)
    per_forward = 2 if name in ("lookahead", "prompt_lookup") else 1
    moved = eager.names["aten::argmax"] - comp.names["aten::argmax"]  # computed in the graphs
    assert (moved > 0) == name.startswith("triforce"), moved
    extra = sum(s["ops"] for s in comp.steps) - (sum(s["ops"] for s in eager.steps) - moved)
    assert 0 < extra <= per_forward * forwards[True] + 2, (extra, forwards[True])


def test_the_probe_counts_outside_model_calls_only(engine):
    eng = engine("llama_gqa")
    cache = eng.model.new_cache(16)
    with HostWork([eng]) as probe:
        probe.start_steps()
        logits = eng.forward(cache, [5, 6], [0, 1], [0, 1], causal_plan(0), kind="prefill")  # one upload
        best = logits[0].argmax(-1)  # one op (the forward's own ops are not counted)
        _ = best.tolist(), int(torch.tensor(3))  # one read; a host value's is free
        cache.move(torch.tensor([0], device=eng.device), torch.tensor([2], device=eng.device))  # two copies, two ops
        probe._step()
    assert probe.steps == [{"ops": 3, "h2d": 3, "d2h": 1, "forward_ops": 0}]


def test_the_probe_counts_a_decoders_own_caches_as_device_memory(engine):
    """A cache ``Engine.new_cache`` made before the probe started (a draft's, a retrieval cache) is device memory:
    writing a device value into it is no read, copying from it into a host tensor is one."""
    eng = engine("llama_gqa")
    own = eng.new_cache(8)
    host = torch.zeros(own.kv[0, 0, 0, 0, :2].shape)
    with HostWork([eng]) as probe:
        probe.start_steps()
        own.kv[0, 0, 0, 0, :2].copy_(own.kv[1, 0, 0, 0, :2] * 2)  # on the device: an op, no transfer
        host.copy_(own.kv[0, 0, 0, 0, :2])  # a read
        probe._step()
    assert probe.steps == [{"ops": 3, "h2d": 0, "d2h": 1, "forward_ops": 0}]


def test_host_time_is_measured_per_step(engine):
    from baselines.vanilla import VanillaDecoder

    eng = engine("llama_gqa")
    gen = VanillaDecoder().generate(eng, eng.tokenizer(PROMPTS[1]).input_ids, 8)
    assert 0 < gen.host_s and gen.host_ms_per_step == pytest.approx(1000 * gen.host_s / len(gen.accept_lengths))


def test_runs_record_host_ms_per_step(tmp_path):
    from fafo.bench.runner import Runner
    from fafo.bench.spec import resolve

    cfg = make_cfg(tmp_path, "model=tiny_llama", "method=prompt_lookup", "bench.max_samples=2",
                   "bench.max_new_tokens=8", "bench.warmup=0")
    summary = Runner().run(resolve(cfg, tmp_path / "run"), report=False)
    rows = read_rows(tmp_path / "run")
    assert rows and all(float(r["host_ms"]) > 0 for r in rows)
    assert summary["host_ms_per_step"] == pytest.approx(statistics.median(float(r["host_ms"]) for r in rows))


def bench_engine():
    """``scripts/bench_engine.py`` as a module (a script, not a package)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_engine.py"
    spec = importlib.util.spec_from_file_location("bench_engine", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_engine_host_mode_writes_the_table(tmp_path, capsys):
    out = tmp_path / "host.csv"
    bench_engine().main(["host", "--layers", "2", "3", "--methods", "vanilla", "fafo_stream", "--new-tokens", "6",
                         "--repeats", "1", "--out", str(out)])
    rows = list(csv.DictReader(open(out)))
    assert [(r["method"], r["layers"]) for r in rows] == [("vanilla", "2"), ("fafo_stream", "2"), ("vanilla", "3"),
                                                         ("fafo_stream", "3")]
    assert all(r["exact"] == "True" and float(r["host_ms"]) > 0 and float(r["host_ms_replayed"]) > 0 for r in rows)
    assert rows[0]["ops_max"] == rows[2]["ops_max"] == "1"
    # the deeper model is the shallow one with identity layers: the same steps, so the same ops per step
    assert [rows[1][k] for k in ("steps", "tau", "ops_mean")] == [rows[3][k] for k in ("steps", "tau", "ops_mean")]
    assert "| fafo_stream |" in capsys.readouterr().out


@pytest.mark.slow  # compiles two methods' steps (aot_eager)
@pytest.mark.compat
def test_bench_engine_host_mode_counts_the_compiled_path(tmp_path, capsys):
    """``host --compile default --compile-backend aot_eager --compile-attention flex``: the counts of the graphs a
    GPU replays, the tokens still vanilla's, no timing."""
    out = tmp_path / "host.csv"
    bench_engine().main(["host", "--layers", "2", "--methods", "vanilla", "fafo_stream", "--new-tokens", "6",
                         "--compile", "default", "--compile-backend", "aot_eager", "--compile-attention", "flex",
                         "--out", str(out)])
    rows = {r["method"]: r for r in csv.DictReader(open(out))}
    assert set(rows) == {"vanilla", "fafo_stream"} and all(r["exact"] == "True" for r in rows.values())
    assert rows["vanilla"]["ops_max"] == "2"  # the argmax, and the live length the compiled step writes
    assert rows["vanilla"]["host_ms"] == rows["vanilla"]["host_ms_replayed"] == ""
    assert "| vanilla | 2 (2) | 1.0 | 1.0 | - | - |" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["fafo_stream", "token_recycling", "triforce"])  # region, tree, draft model
def test_a_replayed_generation_takes_the_same_steps_without_running_the_model(name, engine):
    """The replay serves every model call's recorded outputs (target, draft model) in order: the same tokens and
    steps, every output served once, and almost no time inside model calls; a replay that needs more calls than
    were recorded (a longer generation) is refused."""
    from fafo.bench.tools.replayed_forwards import ReplayedForwards, live_and_replayed
    from fafo.engine.ledger import MODEL_TIME
    from tests.methods import METHODS

    eng, method = engine("llama_gqa"), METHODS[name].small()
    ids = eng.tokenizer(PROMPTS[0] * 3).input_ids
    method.setup(eng)
    snapshot = method.snapshot()
    probe = ReplayedForwards()
    before = MODEL_TIME.seconds
    with probe.recording():
        live = method.generate(eng, ids, 16)
    method.restore(snapshot)
    live_model_s, calls = MODEL_TIME.seconds - before, len(probe.outputs)
    assert calls > len(live.accept_lengths)  # the prefill and every step's forwards
    before = MODEL_TIME.seconds
    with probe.replaying():
        replayed = method.generate(eng, ids, 16)
    method.restore(snapshot)
    assert replayed.tokens == live.tokens and replayed.accept_lengths == live.accept_lengths
    assert probe.served == calls and MODEL_TIME.seconds - before < 0.2 * live_model_s
    assert all(x > 0 for x in live_and_replayed(method, eng, ids, 16, snapshot))
    from baselines.vanilla import VanillaDecoder

    with probe.recording():
        VanillaDecoder().generate(eng, ids, 8)
    with pytest.raises(RuntimeError, match="more model calls"), probe.replaying():
        VanillaDecoder().generate(eng, ids, 9)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_methods_steps_and_commits_run_in_inference_mode(name, engine, monkeypatch):
    """A method's generate runs in inference mode (torch skips autograd's dispatch on every op outside the forwards
    too), each step and its commit included, and a batch's steps likewise; the caches it leaves on the engine stay
    normal tensors, which a later method writes in place outside the mode."""
    import fafo.batch
    from fafo import decoding
    from fafo.batch import Request, decode_batch

    eng, method = engine("llama_gqa"), build_method(name, [*METHODS[name].overrides, *budget_overrides(name)])
    ids = eng.tokenizer(PROMPTS[0] * 3).input_ids
    seen = []
    hooks = [lambda: seen.append(torch.is_inference_mode_enabled())]
    monkeypatch.setattr(decoding, "STEP_HOOKS", hooks)
    monkeypatch.setattr(fafo.batch, "STEP_HOOKS", hooks)
    method.generate(eng, ids, 8)
    assert seen and all(seen) and not torch.is_inference_mode_enabled()
    assert not any(c.kv.is_inference() for c in [eng.cache(len(ids)), *eng.decoder_caches])
    if not method.batch_refusal:
        seen.clear()
        decode_batch(method, eng, [Request(ids, 6), Request(ids[:-3], 6)], 2)
        assert seen and all(seen)
