"""Decode-speed benchmarks of the engine (issue 19): against transformers, and a FAFO step's cost.

* ``vs-hf``: vanilla greedy decode per token, ours vs transformers ``generate`` (sdpa; dynamic cache and static
  cache), on a random Llama of 156M parameters (hidden 1024, 8 layers, GQA 16/4, vocab 32000) at prompt lengths
  256 and 4096. Per-token time = time from the first token's logits (our clock's prefill mark; the first call of
  a logits processor in transformers) to the end, over the N - 1 later tokens: prefill excluded alike.
* ``fafo-step``: one FAFO step (n = m = 40, k = 6: 481 tokens) fused vs FAFO-2forward's two forwards, and the
  share of the step spent in attention (wall time inside ``attend``; CPU runs ops in order), on ``dense`` (the
  reference maths) and ``sdpa`` (the fast paths).

Variants are interleaved (A, B, C, A, B, C ...) over ``--rounds`` and medians reported, with the thread count and
``/proc/loadavg`` beside them. Prints a markdown table and writes a CSV (``--out``)::

    python scripts/bench_decode.py vs-hf --threads 1 2 --rounds 3
    python scripts/bench_decode.py fafo-step --threads 2 --context 1024
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fafo.engine.model as model_module  # noqa: E402
from baselines.vanilla import VanillaDecoder  # noqa: E402
from fafo.engine.engine import Engine  # noqa: E402
from fafo.fafo import FAFODecoder, FAFOState  # noqa: E402

MODEL_156M = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=8192)


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return ""


def build_model(out: Path, spec: dict) -> Path:
    """A random Llama (fp32, seed 0) saved with save_pretrained, plus the embedded tokenizer (ids are random)."""
    import transformers

    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer

    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**spec, initializer_range=0.02, eos_token_id=None, bos_token_id=None)
        transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
        build_tiny_tokenizer().save_pretrained(out)
    return out


class MarkClock:
    """A decoder clock keeping the time of its ``prefill`` mark."""

    at = 0.0

    def mark(self, phase: str) -> None:
        self.at = time.perf_counter()


class FirstCall:
    """A transformers logits processor noting when it is first called (the prefill's logits are ready)."""

    at = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def vs_hf(args, path: Path) -> list[dict]:
    import transformers

    engine = Engine.from_pretrained(str(path))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    hf.eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    rows, same = [], None
    for prompt_len in args.prompts:
        ids = torch.randint(5, MODEL_156M["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(1))
        n = args.new_tokens

        def ours(k):  # decode seconds per token after the first (the prefill ends at the clock's mark)
            clock = MarkClock()
            tokens = VanillaDecoder().generate(engine, ids.tolist(), k, clock=clock)
            return tokens.tokens, (time.perf_counter() - clock.at) / (k - 1)

        def theirs(k, cache):
            kw = {"cache_implementation": "static"} if cache == "static" else {}
            first = FirstCall()  # called once per new token: its first call ends the prefill
            with torch.inference_mode():
                out = hf.generate(ids[None], max_new_tokens=k, min_new_tokens=k, do_sample=False,
                                  logits_processor=transformers.LogitsProcessorList([first]), **kw)
            return out[0, prompt_len:].tolist(), (time.perf_counter() - first.at) / (k - 1)

        variants = {"ours": ours, "hf-dynamic": lambda k: theirs(k, "dynamic"),
                    "hf-static": lambda k: theirs(k, "static")}
        if prompt_len == args.prompts[0]:  # once: equal tokens, and a warm-up (static cache allocation, kernels)
            same = ours(16)[0] == theirs(16, "dynamic")[0]
            for fn in variants.values():
                fn(4)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(fn(n)[1])
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        for name in variants:
            rows.append({"bench": "vs-hf", "threads": torch.get_num_threads(), "context": prompt_len,
                         "variant": name, "median_ms": med[name], "ratio_vs_ours": med[name] / med["ours"],
                         "loadavg": load_average(), "note": f"tokens equal to HF: {same}"})
            print(f"threads {torch.get_num_threads()} prompt {prompt_len:>5} {name:<10} {med[name]:8.2f} ms/token "
                  f"(ours is {med[name] / med['ours']:.2f}x faster than this)  load {load_average()}", flush=True)
    return rows


class AttentionTimer:
    """Wraps the model's ``attend`` and sums the wall time spent in it (CPU: ops run in order)."""

    def __init__(self):
        self.seconds, self._orig = 0.0, model_module.attend

    def __enter__(self):
        def timed_attend(*a, **kw):
            t0 = time.perf_counter()
            out = self._orig(*a, **kw)
            self.seconds += time.perf_counter() - t0
            return out

        model_module.attend = timed_attend
        return self

    def __exit__(self, *exc):
        model_module.attend = self._orig


def fafo_step(args, path: Path) -> list[dict]:
    rows = []
    prompt = torch.randint(5, MODEL_156M["vocab_size"], (args.context,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    for backend in ("dense", "sdpa"):
        engine = Engine.from_pretrained(str(path), backend=backend)
        states = {}
        for name, fused in (("fused", True), ("2forward", False)):
            state = FAFOState(FAFODecoder(fused=fused), engine, prompt, 64)
            state.prefill()
            cands, _ = state.candidates()
            states[name] = (state, cands)
        for state, cands in states.values():
            state.forward_logits(cands)  # warm-up
        times = {k: [] for k in states}
        attn = {k: [] for k in states}
        for _ in range(args.rounds):
            for name, (state, cands) in states.items():
                with AttentionTimer() as t:
                    times[name].append(timed(lambda: state.forward_logits(cands)))
                attn[name].append(t.seconds / times[name][-1])
        for name in states:
            med = statistics.median(times[name]) * 1e3
            share = statistics.median(attn[name])
            rows.append({"bench": "fafo-step", "threads": torch.get_num_threads(), "context": args.context,
                         "variant": f"{backend} {name}", "median_ms": med, "attention_share": share,
                         "ratio_vs_ours": med / (statistics.median(times["fused"]) * 1e3),
                         "loadavg": load_average(), "note": ""})
            print(f"threads {torch.get_num_threads()} context {args.context} {backend:<5} {name:<8} {med:9.1f} ms/step "
                  f"attention {share:6.1%}  load {load_average()}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", choices=["vs-hf", "fafo-step"])
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, nargs="+", default=[256, 4096])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--context", type=int, default=1024, help="fafo-step: prompt length before the step")
    p.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "fafo-bench-156m")
    p.add_argument("--spec", default=None, help="override the model spec (JSON), e.g. a smaller one for tests")
    p.add_argument("--out", type=Path, default=Path("results/bench/decode.csv"))
    args = p.parse_args(argv)
    spec = MODEL_156M if args.spec is None else {**MODEL_156M, **__import__("json").loads(args.spec)}
    MODEL_156M.update(spec)
    path = build_model(args.model_dir, spec)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        rows += (vs_hf if args.bench == "vs-hf" else fafo_step)(args, path)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cols = ["bench", "threads", "context", "variant", "median_ms", "ratio_vs_ours", "attention_share", "loadavg",
            "note"]
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}  (torch {torch.__version__})")
    return rows


if __name__ == "__main__":
    main()
