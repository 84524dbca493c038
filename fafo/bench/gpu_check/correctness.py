"""Stage 2: compiled steps token-identical to eager, for vanilla and every draftless method, on small random
models of GQA groups 1, 3, 4 and 7.

Per model, one engine compiled with the device's defaults and its cache sized once for the largest prompt and
method (compiled graphs are specialised to it; the methods of a model share the graphs of equal step shapes).
Per case (a model and a method), as the runner does it: the method warmed on the first prompt (twice under CUDA
graphs: a graph records on its second call), then two more prompts of other lengths and acceptance generated.
Every generation is compared with eager vanilla greedy on the same weights and dtype (``sdpa``). Checked:

* tokens identical; in float16 a first mismatch is classified by :class:`~fafo.bench.mismatch.MismatchJudge`
  (``tie``: the two tokens' float32 logits within 0.1; ``divergence``: a bug);
* no graph compiled after the warm-up (``compile_stats``), no step refused by CUDA graphs (``cudagraph_skips``);
* the largest step, in rows and rows x GQA group (what torch's choice of FlexAttention kernel reads; the engine
  sends every step of more than one row to the main template: :mod:`fafo.engine.flex_routing`).

Methods whose forwards cannot run compiled (``Decoder.eager_forwards``, none of the built-in ones) run eagerly, as the
runner times them; forwards that skip layers (SWIFT's drafts) run a compiled graph per sub-layer without CUDA
graphs (:mod:`fafo.engine.skipping_step`). QuantSpec runs with its fp16 verifier (lossless against vanilla): its
INT4 drafts read the quantized cache through the compiled path the INT8 verifier also takes
(``QuantKVCache.static_plan``). LongSpec, the one method with a trained draft, runs with a random draft: its tokens
are the target's whatever it drafts, and its draft layer's rows and levels run as compiled graphs (without CUDA
graphs) beside the verification's.

Then, per model, a few methods decode the three prompts and the first again as **one batch** of four requests of
ragged lengths (``bench.batch_size=4``, static batching, :func:`fafo.batch.decode_batch`): BlockMasks with a batch
dimension, one live length per row, CUDA graphs per batch shape; each request must equal its eager batch-1 tokens.
"""

from __future__ import annotations

import csv
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from fafo.bench.gpu_check.report import markdown_table
from fafo.bench.gpu_check.methods import build_method, most_extra_slots, selected, steps_as_the_runner
from fafo.bench.mismatch import MismatchJudge
from fafo.engine.batching import bucket_fillers
from fafo.engine.compiled import compile_stats, cudagraph_skips, reset_compiled_state
from fafo.engine.engine import Engine
from fafo.engine.loader import load_hf_config
from fafo.engine.tiny import tiny_checkpoint

# head_dim 16, 2 layers; group 7 is a Qwen2 (qkv bias) like Qwen2.5-7B, the others Llamas
GROUP_MODELS = {
    1: dict(family="llama", num_attention_heads=4, num_key_value_heads=4, hidden_size=64, seed=21),
    3: dict(family="llama", num_attention_heads=6, num_key_value_heads=2, hidden_size=96, seed=23),
    4: dict(family="llama", num_attention_heads=8, num_key_value_heads=2, hidden_size=128, seed=24),
    7: dict(family="qwen2", num_attention_heads=7, num_key_value_heads=1, hidden_size=112, seed=27),
}
# the warm-up prompt, then varied text (acceptance near zero) and repetitive code (acceptance high)
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4 + "The quick brown",
    "Rivers carry sediment from the mountains to the sea, building deltas where the current slows; farmers "
    "have settled on such plains for millennia because the soil is renewed by every flood. In the",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" * 3
    + "def",
]
COLUMNS = ["group", "method", "batch", "family", "compiled", "max_rows", "rows_x_group", "graphs", "recompiles",
           "cudagraph_skips", "generations", "identical", "ties", "divergences", "status", "seconds", "note"]


class GroupModel:
    """One tiny model: an eager engine and its vanilla tokens (the references), a compiled engine."""

    def __init__(self, group: int, settings, root: Path, methods: list[str]):
        from baselines.vanilla import VanillaDecoder

        spec = {**GROUP_MODELS[group], "intermediate_size": 128, "num_hidden_layers": 2}
        self.group, self.family = group, spec["family"]
        path = tiny_checkpoint(spec, cache_dir=root)
        kw = dict(device=settings.device, dtype=settings.dtype)
        self.eager = Engine.from_pretrained(str(path), backend="sdpa", **kw)
        ckpt = SimpleNamespace(path=path, config=load_hf_config(path), tokenizer=self.eager.tokenizer)
        self.judge = MismatchJudge(self.eager, ckpt, context=1024)
        self.prompts = [self.eager.tokenizer(p).input_ids for p in PROMPTS]
        self.refs = [VanillaDecoder().generate(self.eager, p, settings.max_new).tokens for p in self.prompts]
        self.compiled = Engine.from_pretrained(str(path), backend="sdpa", **kw)
        self.slots = max(map(len, self.prompts)) + settings.max_new + most_extra_slots(methods, settings.max_new,
                                                                                          small=True)
        self.compile(settings)

    def compile(self, settings) -> None:
        """Compiled steps from scratch (also after a failed case: no state of it reaches the next one)."""
        reset_compiled_state()
        self.compiled.release()
        self.compiled.enable_compile(settings.compile)
        self.compiled.cache(self.slots)


def compare(model: GroupModel, i: int, tokens: list[int]) -> tuple[str, str]:
    """(``identical`` | ``tie`` | ``divergence``, a note on the first mismatch)."""
    ref = model.refs[i]
    if tokens == ref:
        return "identical", ""
    at = next((j for j, (a, b) in enumerate(zip(tokens, ref)) if a != b), min(len(tokens), len(ref)))
    kind, gap = model.judge(model.prompts[i], tokens, ref, at)
    gap = f"{gap:.3g}" if isinstance(gap, float) else "length"
    return kind, f"prompt {i}: first mismatch at token {at} ({kind}, float32 logit gap {gap})"


def verdict(kinds: list[tuple[str, str]], recompiles: int, skips: int) -> tuple[dict, str]:
    """Counts of identical / tie / divergence generations, and the case's status: ``FAIL`` on a divergence, a
    recompile or a CUDA-graph skip, else ``tie`` when any tie, else ``ok``."""
    counts = {k: sum(kind == k for kind, _ in kinds) for k in ("identical", "tie", "divergence")}
    return counts, "FAIL" if counts["divergence"] or recompiles or skips else "tie" if counts["tie"] else "ok"


def run_case(model: GroupModel, name: str, settings) -> dict:
    t0 = time.perf_counter()
    engine, max_new = model.compiled, settings.max_new
    method = build_method(name, small=True)
    compiled = not method.eager_forwards
    method.setup(engine)
    engine.ledger.log = []  # every forward's record: the widest step's rows
    skips0, graphs0 = cudagraph_skips(), compile_stats()["graphs"]
    kinds = []
    try:
        with steps_as_the_runner(engine, method):
            rounds = 2 if compiled and settings.compile.cudagraphs else 1
            for r in range(rounds):
                gen = method.generate(engine, model.prompts[0], max_new)
                method.warm_shapes(engine)  # as the runner's warm-up: step shapes the generation did not take
                if r == 0:
                    kinds.append(compare(model, 0, gen.tokens))
            graphs_warm = compile_stats()["graphs"]
            for i in range(1, len(model.prompts)):
                kinds.append(compare(model, i, method.generate(engine, model.prompts[i], max_new).tokens))
            recompiles = compile_stats()["graphs"] - graphs_warm
    finally:
        rows = [f.tokens for f in engine.ledger.log if f.kind != "prefill"]
        engine.ledger.log = None
    notes = [note for _, note in kinds if note]
    skips = cudagraph_skips() - skips0
    counts, status = verdict(kinds, recompiles, skips)
    if not compiled:
        notes.append(f"eager, as the runner times it ({method.eager_forwards})")
    step = max(rows) if rows else 0
    return {"group": model.group, "method": name, "batch": 1, "family": model.family, "compiled": int(compiled),
            "max_rows": step, "rows_x_group": step * model.group, "graphs": graphs_warm - graphs0,
            "recompiles": recompiles, "cudagraph_skips": skips, "generations": len(kinds),
            "identical": counts["identical"], "ties": counts["tie"], "divergences": counts["divergence"],
            "status": status, "seconds": round(time.perf_counter() - t0, 1), "note": "; ".join(notes)}


def run_batch_case(model: GroupModel, name: str, settings) -> dict:
    """``name`` decoding every prompt (and the first again) as one static batch on the compiled engine: warmed as
    the runner warms (a batch of each row bucket's size: compiles, records), then the batch whose requests are
    compared with eager batch-1 vanilla."""
    from fafo.batch import Request, decode_batch

    t0 = time.perf_counter()
    engine, B = model.compiled, settings.batch_size
    method = build_method(name, small=True)
    method.setup(engine)
    order = [i % len(model.prompts) for i in range(B)]
    requests = [Request(model.prompts[i], settings.max_new) for i in order]
    skips0, graphs0 = cudagraph_skips(), compile_stats()["graphs"]
    with steps_as_the_runner(engine, method):
        for n in bucket_fillers(B, B):  # as the runner warms: every row bucket a shrinking batch runs
            decode_batch(method, engine, requests[:n], B)
        graphs_warm = compile_stats()["graphs"]
        result = decode_batch(method, engine, requests, B)
    recompiles, skips = compile_stats()["graphs"] - graphs_warm, cudagraph_skips() - skips0
    kinds = [compare(model, i, g.tokens) for i, g in zip(order, result.generations)]
    counts, status = verdict(kinds, recompiles, skips)
    model.compile(settings)  # the next case starts on the batch-1 cache and graphs
    return {"group": model.group, "method": name, "batch": B, "family": model.family,
            "compiled": int(not method.eager_forwards), "max_rows": "", "rows_x_group": "",
            "graphs": graphs_warm - graphs0, "recompiles": recompiles, "cudagraph_skips": skips,
            "generations": len(kinds), "identical": counts["identical"], "ties": counts["tie"],
            "divergences": counts["divergence"], "status": status, "seconds": round(time.perf_counter() - t0, 1),
            "note": "; ".join(note for _, note in kinds if note)}


def correctness_stage(budget, result, settings, out: Path) -> None:
    methods = selected(settings.methods)
    batched = [m for m in settings.batch_methods if m in methods]
    cases = [(g, m, b) for g in settings.groups for m, b in [(m, 1) for m in methods] + [(m, settings.batch_size)
                                                                                          for m in batched]]
    rows: list[dict] = []
    models: dict[int, GroupModel | str] = {}  # the current group's model, or why it could not be built
    reset_compiled_state()
    try:
        with tempfile.TemporaryDirectory(prefix="fafo-gpu-check-") as root:
            for group, name, batch in budget.each(cases, label=lambda c: f"group {c[0]} {c[1]}"
                                                                           + (f" at batch {c[2]}" if c[2] > 1 else "")):
                try:
                    if group not in models:
                        models.clear()  # one model on the device at a time, its graphs forgotten with it
                        try:
                            models[group] = GroupModel(group, settings, Path(root), methods)
                        except Exception:  # noqa: BLE001 - once per group, then each of its cases says so
                            models[group] = f"the model or its eager reference failed: {last_line()}"
                            result.errors.append(f"group {group}, model and eager reference:\n"
                                                 + traceback.format_exc())
                    if isinstance(models[group], str):
                        rows.append({"group": group, "method": name, "batch": batch, "status": "error",
                                     "note": models[group]})
                        continue
                    rows.append(run_case(models[group], name, settings) if batch == 1 else
                                run_batch_case(models[group], name, settings))
                    budget.note = f"{rows[-1]['status']} (max rows {rows[-1]['max_rows']}) {rows[-1]['note']}"[:200]
                except Exception:  # noqa: BLE001 - the case is recorded as an error, the next one runs
                    result.errors.append(f"group {group} {name} (batch {batch}):\n{traceback.format_exc()}")
                    rows.append({"group": group, "method": name, "batch": batch, "status": "error",
                                 "note": last_line()})
                    budget.note = f"error: {last_line()}"
                    if isinstance(models.get(group), GroupModel):
                        models[group].compile(settings)
    finally:
        models.clear()
        reset_compiled_state()
        write_rows(out / "correctness.csv", rows)
        summarize(result, rows, len(cases))


def batch_label(row: dict) -> str:
    return f" at batch {row['batch']}" if str(row.get("batch", 1)) not in ("1", "") else ""


def last_line() -> str:
    """The last line of the exception being handled (its type and message)."""
    return traceback.format_exc().strip().splitlines()[-1][:200]


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def summarize(result, rows: list[dict], n_cases: int) -> None:
    bad = [r for r in rows if r["status"] in ("FAIL", "error")]
    identical = sum(r["status"] == "ok" for r in rows)
    tied = sum(r["status"] == "tie" for r in rows)
    result.failed_checks += [f"group {r['group']} {r['method']}{batch_label(r)}: {r['status']} {r.get('note', '')}"
                             .strip() for r in bad]
    recompiled = sum(1 for r in rows if r.get("recompiles"))
    skipped = sum(1 for r in rows if r.get("cudagraph_skips"))
    widest = max(rows, key=lambda r: r.get("rows_x_group") or 0, default=None)
    result.summary = (f"{identical}/{n_cases} cases token-identical"
                      + (f", {tied} identical but for fp16 ties" if tied else "")
                      + f", {len(bad)} failed, {recompiled} recompiled, {skipped} with CUDA-graph skips"
                      + (f"; widest step {widest['max_rows']} rows x group {widest['group']}" if widest and
                         widest.get("max_rows") else ""))
    result.sections.append(markdown_table(COLUMNS, rows))
