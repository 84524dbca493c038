"""The host table: every method config's work per decoding step outside its forwards, counted and timed.

:func:`measure` runs one method on an engine under the probe (:class:`fafo.bench.tools.host_probe.HostWork`: ops
dispatched, host-to-device copies and device-to-host reads per step) and reports these per step;
:func:`host_table` does it for every method config at given depths (``scripts/bench_engine.py host``) with each
method's host milliseconds per step (wall time minus time inside model calls,
:attr:`fafo.decoding.Generation.host_s`, timed without the probe).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from omegaconf import DictConfig

from fafo.bench.naming import CONF
from fafo.bench.tools.host_probe import count_host_work


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
