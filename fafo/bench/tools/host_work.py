"""Host work per decoding step: what a method does around its model forwards, counted and timed.

On a GPU a 7B decode forward costs a few milliseconds and each eagerly launched op 5-10 us of host time; CUDA graphs
hide launches only inside the compiled forward. :class:`HostWork` counts, per decoding step, outside every model
call (:func:`fafo.engine.ledger.model_call`, where it is suspended):

* ``ops``: torch operators dispatched (ATen ops, views excluded): on a device each one on device data is a launch,
  and each costs host time (on host tensors too);
* ``h2d``: host values moved to the device (a tensor built from Python data with ``device=``, or ``.to(device)``
  of a host tensor; :meth:`fafo.engine.engine.Engine.upload` packs a forward's inputs into one);
* ``d2h``: device values read on the host (``.tolist()``, ``.item()``, ``int()``, ``.cpu()``...: a sync on CUDA).

The CPU stands in for the device: a tensor is "on the device" when it is a weight or a cache buffer, was made with
``device=`` or moved with ``.to(device)``, came out of a model call, or was computed from such a tensor.
:func:`measure` runs one method on an engine and reports these per step; :func:`host_table` does it for every
method config at given depths (``scripts/bench_engine.py host``) with each method's host milliseconds per step
(wall time minus time inside model calls, :attr:`fafo.decoding.Generation.host_s`, timed without the probe). The
probe suspends itself with torch's ``_pop_mode_temporarily`` helpers (``torch.overrides`` and
``torch.utils._python_dispatch``, the same in torch 2.11 and 2.13).
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from fafo import decoding
from fafo.bench.naming import CONF
from fafo.engine.ledger import MODEL_TIME

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randint", "rand", "randn",
             "zeros_like", "ones_like", "empty_like", "full_like"}
FROM_HOST = {"tensor", "as_tensor"}  # factories that copy host data
# not counted as ops: no-ops, and reads (counted as d2h)
NOT_OPS = {"aten::lift_fresh", "aten::detach", "aten::alias", "aten::item", "aten::_local_scalar_dense"}


class _Ops(TorchDispatchMode):
    """ATen operators, views and no-ops excluded, by name."""

    def __init__(self):
        super().__init__()
        self.names: Counter = Counter()
        self.paused = 0
        self.inside = 0  # > 0: inside a model call that is counted apart
        self.forward_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0]  # aten::add.Tensor -> aten::add
        if not (func.is_view or name in NOT_OPS or self.paused):
            if self.inside:
                self.forward_ops += 1
            else:
                self.names[name] += 1
        return func(*args, **(kwargs or {}))


class _Transfers(TorchFunctionMode):
    """Host-to-device copies and device-to-host reads, following device values through torch calls."""

    def __init__(self, on_device, ops: _Ops):
        super().__init__()
        self.on_device = WeakIdKeyDictionary({t: True for t in on_device})
        self.h2d = self.d2h = 0
        self.ops = ops

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """The copy a device would make where the CPU, standing in for it, returns the tensor itself (counted as a
        transfer, not as an op)."""
        self.ops.paused += 1
        try:
            return t.clone()
        finally:
            self.ops.paused -= 1

    def mark(self, values) -> None:
        for t in tree_flatten(values)[0]:
            if isinstance(t, torch.Tensor):
                self.on_device[t] = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        on_device = [isinstance(x, torch.Tensor) and x in self.on_device for x in flat]
        if name in READS and first is not None and on_device[0]:
            self.d2h += 1
            return self._copy(out) if out is first else out  # on the CPU .cpu() returns the tensor itself
        if name in ("__setitem__", "copy_") and first is not None and not on_device[0] and any(on_device[1:]):
            self.d2h += 1
            return out
        to_device = kwargs.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args[1:2])
        if name in ("to", "as_tensor") and to_device and first is not None and not on_device[0]:
            self.h2d += 1
            if out is first:
                out = self._copy(out)
        elif name in FROM_HOST and kwargs.get("device") is not None and not isinstance(first, torch.Tensor):
            self.h2d += 1
        if (name in ("to", *FACTORIES) and to_device) or any(on_device):
            self.mark(out)
            if name.endswith("_") and first is not None:
                self.mark(first)
        return out


class HostWork:
    """Counts a generation's host work per decoding step (see the module docstring); use as a context manager
    around ``generate``. ``engines``: the engines whose weights and caches are on the device.

    After the context: :attr:`steps`, one ``{"ops", "h2d", "d2h", "forward_ops"}`` dict per decoding step (its
    commit included), and :attr:`names`, the operators counted in steps by name. ``forward_ops``: with
    ``forwards=True``, the ops inside the step's model calls when they run eagerly (what a compiled forward with
    CUDA graphs replays as one launch, and an eager one launches op by op); else 0.
    """

    def __init__(self, engines, forwards: bool = False):
        self.forwards = forwards
        seeds = [p for e in engines for p in e.model.parameters()]
        for e in engines:  # the shared cache, the decoder's own (a retrieval cache, a draft's), compiled steps' buffers
            seeds += [t for cache in (e.static_cache, *e.decoder_caches) if cache is not None for t in cache.tensors()]
            seeds += e.compiled.buffers() if e.compiled is not None else []
        self._ops = _Ops()
        self._io = _Transfers(seeds, self._ops)
        self.steps: list[dict] = []
        self.names: Counter = Counter()
        self._last = None

    def _now(self) -> tuple:
        o, io = self._ops, self._io
        return sum(o.names.values()), io.h2d, io.d2h, o.forward_ops, Counter(o.names)

    def around(self, call):
        """Run one model call with the probe suspended (or, with ``forwards``, its ops counted apart); its
        outputs are device values."""
        from torch.overrides import _pop_mode_temporarily as pop_function_mode
        from torch.utils._python_dispatch import _pop_mode_temporarily as pop_dispatch_mode

        if self.forwards:
            transfers = self._io.h2d, self._io.d2h
            self._ops.inside += 1
            try:
                out = call()
            finally:
                self._ops.inside -= 1
                self._io.h2d, self._io.d2h = transfers
            self._io.mark(out)
            return out
        with pop_function_mode() as f, pop_dispatch_mode() as d:
            assert f is self._io and d is self._ops, "another probe was entered inside HostWork"
            out = call()
        self._io.mark(out)
        return out

    def _step(self) -> None:
        now = self._now()
        if self._last is not None:
            ops, h2d, d2h, forward_ops, names = (a - b for a, b in zip(now, self._last))
            self.steps.append({"ops": ops, "h2d": h2d, "d2h": d2h, "forward_ops": forward_ops})
            self.names += names
        self._last = now

    def start_steps(self) -> None:
        """Called when the prompt is processed: steps are counted from here."""
        self._last = self._now()

    def __enter__(self) -> "HostWork":
        self._io.__enter__()
        self._ops.__enter__()
        MODEL_TIME.probes.append(self)
        decoding.STEP_HOOKS.append(self._step)
        return self

    def __exit__(self, *exc) -> None:
        decoding.STEP_HOOKS.remove(self._step)
        MODEL_TIME.probes.remove(self)
        self._ops.__exit__(*exc)
        self._io.__exit__(*exc)

    def per_step(self, key: str) -> tuple[float, int]:
        """(mean, max) of ``key`` over the steps."""
        values = [s[key] for s in self.steps] or [0]
        return sum(values) / len(values), max(values)


class _PrefillMark:
    """A clock for ``generate`` that starts the probe's step count when the prompt is processed."""

    def __init__(self, probe: HostWork):
        self.probe = probe

    def mark(self, phase: str) -> None:
        if phase == "prefill":
            self.probe.start_steps()


def count_host_work(method, engine, prompt_ids: list[int], max_new_tokens: int, warmup: bool = True,
                    forwards: bool = False) -> HostWork:
    """One generation under :class:`HostWork` (after a warm-up generation: what is built once per shape is not
    per-step work). Cross-request state is restored before the counted run."""
    method.setup(engine)
    snapshot = method.snapshot()
    if warmup:
        method.generate(engine, prompt_ids, max_new_tokens, engine.eos_ids)
        method.restore(snapshot)
    probe = HostWork(method.engines(engine), forwards)
    with probe:
        gen = method.generate(engine, prompt_ids, max_new_tokens, engine.eos_ids, clock=_PrefillMark(probe))
    probe.generation = gen
    method.restore(snapshot)
    return probe


def measure(name: str, method, engine, prompt_ids: list[int], max_new_tokens: int,
            reference: list[int] | None = None) -> dict:
    """One row of the host table without its timing: ops, copies and reads per step (mean and max)."""
    probe = count_host_work(method, engine, prompt_ids, max_new_tokens)
    gen = probe.generation
    row = {"method": name, "layers": engine.model.args.n_layers, "steps": len(probe.steps),
           "new_tokens": len(gen.tokens), "tau": round(gen.tau, 3)}
    for key in ("ops", "h2d", "d2h"):
        mean, top = probe.per_step(key)
        row[f"{key}_mean"], row[f"{key}_max"] = round(mean, 2), top
    if engine.compiled is None:  # a compiled forward is its graphs (and they run no dispatch mode's ops)
        inside = count_host_work(method, engine, prompt_ids, max_new_tokens, warmup=False, forwards=True)
        row["forward_ops"] = round(inside.per_step("forward_ops")[0], 1)
    row["eager_forwards"] = bool(method.eager_forwards)  # its forwards cannot run compiled
    row["exact"] = "" if reference is None else gen.tokens == reference
    row["top_ops"] = " ".join(f"{n.split('::')[-1]}:{c / max(len(probe.steps), 1):.1f}"
                              for n, c in probe.names.most_common(4))
    return row


# ---------------------------------------------------------------------------------------------- the host table
COLUMNS = ["method", "layers", "steps", "new_tokens", "tau", "ops_mean", "ops_max", "h2d_mean", "h2d_max",
           "d2h_mean", "d2h_max", "host_ms", "host_ms_runs", "host_ms_replayed", "host_ms_replayed_runs",
           "forward_ops", "eager_forwards", "exact", "top_ops", "threads", "load", "torch"]
PROMPT = "The quick brown fox jumps over the lazy dog, and the lazy dog sleeps in the sun all day long. "
# a preset's budgets below the prompt, so that every step selects, swaps and evicts (the presets' own budgets
# exceed the table's short prompts and would leave the compressed region static)
SMALL_BUDGETS = {"StreamingLLM": ("sink=4", "local=40"), "Quest": ("token_budget=64", "page_size=16"),
                 "SnapKV": ("capacity=48", "window=8", "local=16")}


def method_names() -> list[str]:
    """Every method config (``conf/method/*.yaml``)."""
    return sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


def _compose(name: str, overrides) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=[f"method={name}", *overrides]).method
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"method={name}", *overrides]).method


def budget_overrides(name: str) -> list[str]:
    """Overrides that put a preset's KV budgets below the host table's prompt (compressed region, retrieval
    cache), so its steps do the work a long context makes them do."""
    node = _compose(name, [])
    out = []
    compress = node.get("compress")
    if compress is not None:
        out += [f"method.compress.{kv}" for kv in SMALL_BUDGETS[str(compress._target_).rsplit(".", 1)[-1]]]
    if str(node._target_).endswith("TriForceDecoder"):
        out.append("method.budget=64")
    return out


def offline_overrides(name: str, corpus: Path) -> list[str]:
    """Overrides that let a preset run offline on the table's random model: a tiny random draft for TriForce and
    LongSpec (their released drafts are downloads), ``corpus`` for a preset that requires one (SAM-Decoding)."""
    node = _compose(name, [])
    draft = node.get("draft") or {}
    out = []
    if draft.get("path") and "tiny" in draft:
        out += ["method.draft.path=null", "method.draft.tiny={family: llama, hidden_size: 32, num_hidden_layers: 1}"]
    elif draft.get("path"):
        out += ["method.draft.path=null", "method.draft.random_seed=0"]
    if node.get("corpus_required"):
        out.append(f"method.corpus_path={corpus}")
    return out


def build_method(name: str, overrides=()):
    """The decoder ``method=<name>`` with ``overrides`` builds, as a run would."""
    from fafo.bench.spec import build, method_node

    return build(method_node(_compose(name, overrides)), "method")


def host_table(layers: list[int], names: list[str], new_tokens: int = 64, prompt_tokens: int = 256,
               rounds: int = 5, cache_dir: Path | None = None, compiled=None) -> list[dict]:
    """The host table: per depth and method, ops / copies / reads per step (one probed generation after a
    warm-up) and host ms per step, the median of ``rounds`` generations interleaved across the methods (a
    shared machine's load drifts: interleaving spreads it over every method alike), each generation followed by
    its replay (``host_ms_replayed``: :mod:`fafo.bench.tools.replayed_forwards`, the host work without the cache
    misses the forwards cause on a CPU). A deeper model is the
    shallowest one with identity layers appended (:func:`identity_layers`), so every depth decodes the same tokens
    in the same steps and a difference between depths is per-layer work.

    ``compiled`` (:class:`~fafo.engine.compiled.CompileOptions`): the counts of the compiled path instead, each
    method on freshly compiled steps (on a CPU ``aot_eager`` + ``flex`` traces the graphs CUDA runs); no timing."""
    import tempfile

    from baselines.vanilla import VanillaDecoder
    from fafo.bench.timing import load_average
    from fafo.bench.tools.replayed_forwards import live_and_replayed
    from fafo.engine.compiled import reset_compiled_state

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(PROMPT * 8)
        ckpt = host_model(min(layers), cache_dir)
        for n_layers in layers:
            engine = identity_layers(ckpt, n_layers - min(layers))
            ids = engine.tokenizer(PROMPT * (prompt_tokens // 10)).input_ids[:prompt_tokens]
            reference = VanillaDecoder().generate(engine, ids, new_tokens, engine.eos_ids).tokens
            methods, depth_rows = {}, {}
            for name in names:
                m = build_method(name, [*budget_overrides(name), *offline_overrides(name, corpus)])
                if compiled is not None:  # each method's graphs from scratch (the runner's reset between methods)
                    reset_compiled_state()
                    engine.enable_compile(compiled)
                depth_rows[name] = measure(name, m, engine, ids, new_tokens, reference)
                methods[name] = (m, m.snapshot())
            times = {name: [] for name in names}
            for _ in range(rounds if compiled is None else 0):  # the compiled path: counts only
                for name, (m, snapshot) in methods.items():  # live, then the same generation replayed
                    times[name].append(live_and_replayed(m, engine, ids, new_tokens, snapshot))
            for name in names:
                row = depth_rows[name]
                row.update(threads=torch.get_num_threads(), torch=torch.__version__)
                if times[name]:
                    live, replayed = zip(*times[name])
                    row.update(host_ms=round(statistics.median(live), 3),
                               host_ms_runs=" ".join(f"{x:.3f}" for x in live),
                               host_ms_replayed=round(statistics.median(replayed), 3),
                               host_ms_replayed_runs=" ".join(f"{x:.3f}" for x in replayed), load=load_average())
                rows.append(row)
            for m, _ in methods.values():
                m.release()
            del engine
    return rows


def bench(args) -> list[dict]:
    """``scripts/bench_engine.py host``: :func:`host_table` over ``--layers`` and ``--methods`` (``--compile`` a
    mode: the compiled path's counts)."""
    from fafo.engine.compiled import CompileOptions

    compiled = None
    if args.compile not in ("auto", "off"):
        compiled = CompileOptions(mode=args.compile, backend=args.compile_backend, attention=args.compile_attention)
    return host_table(args.layers, args.methods or method_names(), args.new_tokens, rounds=args.repeats,
                      compiled=compiled)


def report(args, rows: list[dict]) -> None:
    """Print the table as markdown: one line per method, ops/copies/reads and host ms at each depth."""
    layers = sorted({r["layers"] for r in rows})
    by = {(r["method"], r["layers"]): r for r in rows}
    head = ["method"] + [f"{c} @{n}" for n in layers
                         for c in ("ops/step (max)", "H2D", "D2H", "host ms", "host ms replayed")]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in dict.fromkeys(r["method"] for r in rows):
        cells = [name]
        for n in layers:
            r = by.get((name, n))
            if r is None:
                cells += ["-"] * 5
                continue
            cells += [f"{r['ops_mean']:.0f} ({r['ops_max']})", f"{r['h2d_mean']:.1f}", f"{r['d2h_mean']:.1f}",
                      *(f"{r[k]:.2f}" if k in r else "-" for k in ("host_ms", "host_ms_replayed"))]  # - : compiled
        print("| " + " | ".join(cells) + " |")


def host_model(layers: int, cache_dir: Path | None = None):
    """The narrow model of the host table: ``layers`` layers, hidden 64, GQA 4/2, a repetitive random init (so
    guesses are accepted and KV moves happen)."""
    from fafo.engine.tiny import tiny_checkpoint

    return tiny_checkpoint({"family": "llama", "num_hidden_layers": layers, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "seed": 3, "initializer_range": 0.05}, cache_dir=cache_dir)


def identity_layers(ckpt, extra: int):
    """The model of ``ckpt`` with ``extra`` layers appended that change nothing (zero output projections): every
    logit, hence every token and step, is the shallow model's, while the cache and every per-layer loop grow."""
    from fafo.engine.engine import Engine
    from fafo.engine.model import Block

    eng = Engine.from_pretrained(str(ckpt))
    args = eng.model.args
    for i in range(extra):
        block = Block(args, args.n_layers + i)
        torch.nn.init.zeros_(block.self_attn.o_proj.weight)
        torch.nn.init.zeros_(block.mlp.down_proj.weight)
        dtype = eng.model.lm_head.weight.dtype
        eng.model.model.layers.append(block.to(eng.device, dtype).eval().requires_grad_(False))  # as loaded ones
    args.n_layers += extra
    eng.model.hf_config.num_hidden_layers = args.n_layers
    return eng
