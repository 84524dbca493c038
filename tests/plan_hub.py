"""Config-only checkpoints of every model a paper preset names, and release-format data for every task they run.

Checkpoints: ``config.json`` with the real dimensions and rope settings (each checkpoint's hub config.json) plus the
tiny byte-level tokenizer (no weights), laid out as a Hugging Face hub cache (``models--org--name/snapshots/<rev>/``
with ``refs/main``), so that hub ids resolve offline exactly as on a user's machine. Data: each task's release
format (field names as the loaders read them) at the lengths the presets need, with a few samples that the
presets' filters must drop.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096, rope_theta=10000.0)
LLAMA2_13B = dict(LLAMA2_7B, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                  num_attention_heads=40, num_key_value_heads=40)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
LLAMA31 = dict(LLAMA3_8B, max_position_embeddings=131072, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192})
QWEN_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
               rope_theta=1000000.0, tie_word_embeddings=False)

# hub id -> config.json fields (llama unless model_type says otherwise)
MODELS = {
    "meta-llama/Llama-2-7b-chat-hf": LLAMA2_7B,
    "lmsys/vicuna-7b-v1.3": dict(LLAMA2_7B, max_position_embeddings=2048),
    "lmsys/vicuna-7b-v1.5-16k": dict(LLAMA2_7B, max_sequence_length=16384,
                                     rope_scaling={"type": "linear", "factor": 4.0}),
    "lmsys/vicuna-13b-v1.5-16k": dict(LLAMA2_13B, max_sequence_length=16384,
                                      rope_scaling={"type": "linear", "factor": 4.0}),
    "lmsys/longchat-7b-v1.5-32k": dict(LLAMA2_7B, max_sequence_length=32768,
                                       rope_scaling={"type": "linear", "factor": 8.0}),
    "lmsys/longchat-13b-16k": dict(LLAMA2_13B, max_position_embeddings=2048,
                                   rope_scaling={"type": "linear", "factor": 8.0}),
    "togethercomputer/Llama-2-7B-32K-Instruct": dict(LLAMA2_7B, max_position_embeddings=32768,
                                                     rope_scaling={"type": "linear", "factor": 8.0}),
    "LargeWorldModel/LWM-Text-Chat-128K": dict(LLAMA2_7B, max_position_embeddings=131072, rope_theta=1e7),
    "NousResearch/Yarn-Llama-2-7b-128k": dict(LLAMA2_7B, max_position_embeddings=131072, rope_scaling={
        "type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}),
    "meta-llama/Meta-Llama-3-8B-Instruct": LLAMA3_8B,
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA31,
    "gradientai/Llama-3-8B-Instruct-262k": dict(LLAMA3_8B, max_position_embeddings=262144, rope_theta=283461213.0),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": LLAMA31,
    "Qwen/Qwen2.5-7B-Instruct": QWEN_7B,
    "Qwen/Qwen2.5-32B-Instruct": dict(QWEN_7B, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                                      num_attention_heads=40, num_key_value_heads=8),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": dict(QWEN_7B, max_position_embeddings=131072, rope_theta=10000.0),
    "JackFram/llama-68m": dict(LLAMA2_7B, hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
                               num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048),
}
# LongSpec's released drafts copy their target's config (check_shapes compares them)
DRAFTS = {
    "sail/longspec-vicuna-7b-v1.5-16k": "lmsys/vicuna-7b-v1.5-16k",
    "sail/longspec-vicuna-13b-v1.5-16k": "lmsys/vicuna-13b-v1.5-16k",
    "sail/longspec-longchat-7b-v1.5-32k": "lmsys/longchat-7b-v1.5-32k",
    "sail/longspec-longchat-13b-16k": "lmsys/longchat-13b-16k",
    "sail/longspec-Llama-3-8B-Instruct-262k": "gradientai/Llama-3-8B-Instruct-262k",
}
REVISION = "0" * 40


def config_json(fields: dict) -> dict:
    out = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "rms_norm_eps": 1e-5,
           "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}
    out.update(fields)
    if out["model_type"] == "qwen2":
        out.update(architectures=["Qwen2ForCausalLM"], use_sliding_window=False,
                   sliding_window=out["max_position_embeddings"])
    return out


def write_hub(cache: Path, models: dict | None = None, drafts: dict | None = None) -> Path:
    """A hub cache at ``cache`` with a config-only snapshot of every model (and LongSpec draft)."""
    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    models = MODELS if models is None else models
    drafts = DRAFTS if drafts is None else drafts
    repos = {**{hub: config_json(f) for hub, f in models.items()},
             **{hub: config_json(models[target]) for hub, target in drafts.items()}}
    for hub, cfg in repos.items():
        repo = cache / f"models--{hub.replace('/', '--')}"
        snap = repo / "snapshots" / REVISION
        snap.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
        tokenizer.save_pretrained(snap)
        (snap / "config.json").write_text(json.dumps(cfg, indent=1))
    return cache


# ------------------------------------------------------------------ data
VOCAB = ["river", "bridge", "garden", "letter", "window", "summer", "market", "lantern", "harbour", "meadow",
         "court", "appeal", "ruling", "motion", "filed", "counsel", "north", "stone", "winter", "ledger"]


def text(n_words: int, seed: int = 0) -> str:
    """Plain English-like words (about 2.7 tiny-tokenizer tokens each), a full stop every 9 words."""
    return " ".join(VOCAB[(i * 7 + seed) % len(VOCAB)] + ("." if i % 9 == 8 else "") for i in range(n_words))


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


LONGBENCH = ("gov_report", "qmsum", "multi_news", "lcc", "repobench-p", "trec", "qasper", "2wikimqa")
SCBENCH = ("mf", "repoqa", "many_shot", "vt")
# LongBench context lengths in words: under LongSpec's 1200-token floor, mid-length, past a 16k context - 2000
LONGBENCH_WORDS = (150, 2500, 6500)


def write_data(root: Path) -> dict[str, str]:
    """Release-format data for every task of the paper presets; returns task name -> ``task.data_path``."""
    paths = {}
    mt = [{"question_id": 81 + i, "category": "writing", "turns": [text(40, i), text(20, i + 1)]} for i in range(2)]
    paths["mt_bench"] = str(jsonl(root / "mt_bench" / "question.jsonl", mt).parent)
    paths["gsm8k"] = str(jsonl(root / "gsm8k" / "test.jsonl", [
        {"question": text(50, i), "answer": "so\n#### 3"} for i in range(2)]).parent)
    he = root / "humaneval" / "HumanEval.jsonl.gz"
    he.parent.mkdir(parents=True)
    he.write_bytes(gzip.compress("".join(json.dumps({
        "task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"{text(60, i)}\"\"\"\n",
        "entry_point": f"f{i}", "canonical_solution": "    return x\n", "test": "def check(c):\n    pass\n"}) + "\n"
        for i in range(2)).encode()))
    paths["humaneval"] = str(he.parent)
    lb = root / "longbench"
    for subset in LONGBENCH:
        jsonl(lb / "data" / f"{subset}.jsonl", [
            {"input": "What happened?", "context": text(n, i), "answers": ["x"], "length": n, "dataset": subset,
             "language": "en", "all_classes": None, "_id": f"{subset}-{i}"} for i, n in enumerate(LONGBENCH_WORDS)])
        paths[f"longbench_{subset.replace('-', '_')}"] = str(lb)
    sc = root / "scbench"
    for subset in SCBENCH:
        turns = [{"input": text(30, t) + " The largest number of the list is", "answer": text(8, t)}
                 for t in range(5)]
        # Math.Find's list is past the 128k cap (truncated to it); the others are short
        context = list(range(26000)) if subset == "mf" else text(400)
        jsonl(sc / "data" / f"scbench_{subset}.jsonl", [{"id": 0, "context": context, "multi_turns": turns,
                                                         "task": "banking77"}])
        paths[f"scbench_{subset}"] = str(sc)
    paths["aime24"] = str(jsonl(root / "aime" / "test.jsonl", [
        {"id": str(60 + i), "problem": text(60, i), "answer": "204"} for i in range(2)]).parent)
    paths["multi_if"] = str(root / "multi_if")
    (root / "multi_if").mkdir()
    pd.DataFrame([{"key": 1000 + i, "language": "English", "turn_index": 1, "turns": "", "responses": "",
                   **{f"turn_{t}_prompt": json.dumps({"role": "user", "content": text(60, t)}) for t in (1, 2, 3)},
                   "turn_1_instruction_id_list": "[]", "turn_1_kwargs": "[]"} for i in range(2)]
                 ).to_csv(root / "multi_if" / "multiIF_20241018.csv", index=False)
    book = {"short_book_title": "A Book", "publication_date": 1890, "url": "http://x"}
    paths["pg19"] = str(parquet(root / "pg19" / "data" / "test-00000-of-00001.parquet", [
        {**book, "text": text(3600, 0)}, {**book, "text": text(900, 1)}]).parent.parent)  # 2nd: short for 4k+

    def doc(i, n):  # a deepmind/narrativeqa row: its book, a question, an answer
        return {"document": {"id": f"d{i}", "kind": "gutenberg", "url": "", "file_size": 1, "word_count": 1,
                             "start": "", "end": "", "text": "\ufeff  " + text(n, i),
                             "summary": {"text": "s", "tokens": ["s"], "url": "", "title": "t"}},
                "question": {"text": "Who?", "tokens": ["Who"]}, "answers": [{"text": "x", "tokens": ["x"]}]}

    conf = Path(__file__).resolve().parents[1] / "conf" / "task" / "narrativeqa_triforce.yaml"
    indices = OmegaConf.load(conf).indices
    parquet(root / "narrativeqa" / "data" / "train-00000-of-00001.parquet",
            [doc(i, 4200 if i in indices else 5) for i in range(max(indices) + 1)])
    paths["narrativeqa_triforce"] = str(root / "narrativeqa")
    paths["multi_lexsum"] = str(parquet(root / "multi_lexsum" / "test-00000-of-00001.parquet", [
        {"id": "c0", "sources": [text(50000, 0)], "summary/short": "Settled."},
        {"id": "c1", "sources": [text(4000, 1)], "summary/short": "Dismissed."}]).parent)  # 2nd: 8k only
    paths["infbench_sum"] = str(jsonl(root / "infbench" / "longbook_sum_eng.jsonl", [
        {"id": 0, "context": text(13000), "input": "", "answer": ["A summary."], "options": []}]).parent)
    spec = [{"question_id": 81, "category": "writing", "turns": [text(40), text(20, 1)]},
            {"question_id": 161, "category": "translation", "turns": [text(40, 2)]},
            {"question_id": 241, "category": "summarization", "turns": [text(420, 3)]},  # + 1024 > 2048 positions
            {"question_id": 321, "category": "qa", "turns": [text(30, 4)]},
            {"question_id": 401, "category": "math_reasoning", "turns": [text(30, 5)]},
            {"question_id": 481, "category": "rag", "turns": [text(300, 6)]}]
    paths["spec_bench"] = str(jsonl(root / "spec_bench" / "question.jsonl", spec))
    return paths
