"""Build the corpus that SAM-Decoding's static automaton drafts from: the target model's own answers to a task's
prompts, stored as token ids (prompt + answer per turn), as the official ``tools/gen_response.py`` +
``tools/gen_sam_alpaca_sam_only.py`` do (hyx1999/SAM-Decoding at 18c41f055b424fa3fa0bac41a8953d34cea1ed77: vLLM
answers to Alpaca-cleaned, python-code-instructions-18k and GSM8K-train prompts, sampled at T=0.8, top-p 0.95).

    python scripts/build_sam_corpus.py model=vicuna_7b_v13 task=prompts task.data_path=alpaca.jsonl \\
        bench.device=cuda --out corpora/vicuna_7b_v13.jsonl
    python -m fafo.bench model=vicuna_7b_v13 task=spec_bench method=sam_decoding_published \\
        method.corpus_path=corpora/vicuna_7b_v13.jsonl

Greedy by default (``--temperature`` / ``--top-p`` for the official sampling); ``bench.max_samples`` and
``bench.max_new_tokens`` limit the work. ``--answers FILE`` reads answers instead of generating them: a run's
``outputs.jsonl`` (its ``tokens`` after the task's own prompts) or records with ``prompt`` / ``response`` text
(the official ``sam_dialogues``, tokenised as the official). Build from other prompts than those you evaluate:
a corpus holding the evaluated answers drafts them verbatim.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def corpus_records(cfg, answers_path: str | None, temperature: float, top_p: float) -> list[dict]:
    """One record per (sample, turn): ``ids`` = the turn's prompt ids + the answer's ids."""
    from baselines.sam_decoding import tokenizer_fingerprint
    from baselines.vanilla import VanillaDecoder
    from fafo.bench.naming import checkpoint, model_name
    from fafo.bench.settings import resolve_device, resolve_dtype
    from fafo.bench.spec import build
    from fafo.engine.engine import Engine
    from fafo.files import Source, parse_jsonl, read_text
    from fafo.sampling import Sampling

    task, ckpt = build(cfg.task, "task"), checkpoint(cfg.model)
    tok = ckpt.tokenizer
    base = {"model": model_name(cfg.model), "tokenizer": tokenizer_fingerprint(tok)}
    samples = task.samples(tok)[: cfg.bench.max_samples or None]
    given = {}
    if answers_path is not None:
        src = Source("--answers", answers_path, "give a run's outputs.jsonl or records with prompt/response")
        rows = parse_jsonl(read_text(Path(answers_path), src), answers_path, src)
        if rows and all("prompt" in r and "response" in r for r in rows):  # official sam_dialogues
            return [dict(base, ids=list(tok(r["prompt"] + r["response"]).input_ids)) for r in rows]
        given = {(str(r["sample_id"]), int(r["turn"])): r["tokens"] for r in rows if "tokens" in r}
        if not given:
            raise src.error(answers_path, "holds no records with sample_id/turn/tokens or prompt/response")
        engine = device = None
    else:
        device = resolve_device(cfg.bench.device)
        engine = Engine.load(ckpt.path, ckpt.config, tok, device=device, dtype=resolve_dtype(cfg.bench.dtype, device),
                             backend=cfg.model.get("attention", "sdpa"))
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=0)
    records = []
    for s in samples:
        texts: list[str] = []
        for turn in range(len(s.turns)):
            prompt = task.prompt_ids(tok, s, turn, texts)
            if engine is None:
                answer = given.get((str(s.id), turn))
                if answer is None:
                    break
            else:
                budget = cfg.bench.max_new_tokens or s.max_new_tokens
                answer = VanillaDecoder().generate(engine, prompt, budget, engine.eos_ids, sampling,
                                                   sampling.generator(len(records), device)).tokens
            texts.append(tok.decode(answer, skip_special_tokens=True))
            records.append(dict(base, sample_id=str(s.id), turn=turn, n_prompt=len(prompt),
                                ids=[int(t) for t in prompt + list(answer)]))
        print(f"\r{len(records)} answers", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides: model=..., task=..., bench.max_samples=...")
    ap.add_argument("--out", required=True, help="the corpus file to write (.jsonl)")
    ap.add_argument("--answers", help="read answers from this JSONL instead of generating them")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (official: 0.8)")
    ap.add_argument("--top-p", type=float, default=1.0, help="official: 0.95")
    args = ap.parse_args(argv)

    from hydra import compose, initialize_config_dir

    from fafo.errors import ConfigError

    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            cfg = compose("config", overrides=args.overrides)
        records = corpus_records(cfg, args.answers, args.temperature, args.top_p)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    print(f"wrote {len(records)} documents ({sum(len(r['ids']) for r in records)} tokens) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
