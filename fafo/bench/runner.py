"""The benchmark loop: one model, one method, one task; every sample timed beside its vanilla reference.

Order of work: validate every setting and load the task (errors before any model is loaded), resolve the
checkpoint and check the prompts fit its context, load the weights once, warm up (timed apart), then per sample
and turn: reuse or run the vanilla reference (interleaved with the method), run the method ``bench.repeats``
times, compare tokens, append a row. Rows already in ``samples.csv`` are skipped, so a restarted run resumes.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fafo.bench.metrics import accept_histogram, summarize
from fafo.bench.records import RecordWriter, first_mismatch, write_json_atomic
from fafo.bench.reference import ReferenceStore, reference_key
from fafo.bench.setup import (build, check_bench, environment, method_node, resolve_compile, resolve_device,
                              resolve_dtype, resolve_model)
from fafo.bench.timing import PeakMemory, SyncClock
from fafo.bench.wandb_log import WandbLogger
from fafo.engine.compiled import compile_stats
from fafo.engine.engine import Engine
from fafo.errors import ConfigError

RANDOM_MODEL_NOTE = "NOTE: a random tiny model - its speed numbers are a smoke test only, not a benchmark."


class Runner:
    """Runs one configuration into ``run_dir`` (see module docstring). ``run()`` returns the summary dict."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path):
        self.cfg, self.bench, self.run_dir = cfg, cfg.bench, Path(run_dir)
        check_bench(self.bench)
        self.device = resolve_device(self.bench.device)
        self.dtype = resolve_dtype(self.bench.dtype, self.device)
        self.compile = resolve_compile(self.bench, self.device)
        self.sampling = build(cfg.sampling, "sampling")
        self.method = build(method_node(cfg.method), "method")
        self.reference = build(self.bench.reference, "bench.reference")
        self.method.check_sampling(self.sampling)
        self.reference.check_sampling(self.sampling)
        self.task = build(cfg.task, "task")
        self.samples = self.task.samples()[: self.bench.max_samples or None]
        label = cfg.method.get("name") or type(self.method).__name__
        compress = getattr(self.method, "compress", None)  # e.g. "fafo-{compress}" -> "fafo-quest"
        self.names = {"model": cfg.model.name, "task": cfg.task.name,
                      "method": label.format(compress=compress.label) if compress is not None else label}
        self.ckpt = resolve_model(cfg.model)
        if self.sampling.from_generation_config:  # sampling=model_default: only now is the checkpoint known
            self.sampling = self.sampling.resolve(self.ckpt.path)
            self.method.check_sampling(self.sampling)
            self.reference.check_sampling(self.sampling)
        # again with the tokenizer: drops samples too short for the task (e.g. PG-19 books under the prefix length)
        self.samples = self.task.samples(self.ckpt.tokenizer)[: self.bench.max_samples or None]
        self.method.check_target(self.ckpt.config, self.ckpt.tokenizer)
        self.context = min(self.ckpt.context, cfg.model.get("max_len") or self.ckpt.context)
        self._check_prompts_fit()

    def budget(self, sample) -> int:
        return self.bench.max_new_tokens or sample.max_new_tokens

    def _needed_slots(self, n_prompt: int, budget: int) -> int:
        return n_prompt + budget + max(self.method.extra_slots(budget), self.reference.extra_slots(budget))

    def _run_slots(self) -> int:
        """Cache slots the largest sample and turn of the run needs (a later turn's prompt holds the earlier
        answers, each at most the token budget): compiled steps are specialised to one cache size."""
        most = 0
        for s in self.samples:
            budget = self.budget(s)
            for turn in range(len(s.turns)):
                try:
                    n = len(self.task.prompt_ids(self.ckpt.tokenizer, s, turn, [""] * turn))
                except Exception:  # noqa: BLE001 - a bad sample is recorded when it runs, not here
                    continue
                most = max(most, self._needed_slots(n + turn * (budget + 8), budget))
        return most

    def _check_prompts_fit(self) -> None:
        for s in self.samples:
            n = len(self.task.prompt_ids(self.ckpt.tokenizer, s, 0, []))
            if self._needed_slots(n, self.budget(s)) > self.context:
                raise ConfigError(
                    f"sample {s.id!r} of task {self.names['task']} needs {n} prompt + {self.budget(s)} new tokens "
                    f"(+ method scratch), more than the model context {self.context}; lower bench.max_new_tokens, "
                    "leave it out with task.ids/task.limit, or raise model.max_len up to max_position_embeddings")

    # ---------------------------------------------------------------- run
    def run(self) -> dict:
        t_load = time.perf_counter()
        self.engine = Engine.load(self.ckpt.path, self.ckpt.config, self.ckpt.tokenizer, device=self.device,
                                  dtype=self.dtype, backend=self.cfg.model.get("attention", "sdpa"),
                                  max_len=self.context, name=self.names["model"])
        if self.compile is not None:
            self.engine.enable_compile(self.compile)
            self.engine.cache(self._run_slots())  # allocated once: every sample reuses the compiled graphs
        load_s = time.perf_counter() - t_load
        self.env = environment(self.device)
        self.eos = () if self.bench.ignore_eos else self.engine.eos_ids
        self.method.setup(self.engine)
        self.reference.setup(self.engine)
        self.clock, self.memory = SyncClock(self.device), PeakMemory(self.device)
        self.store = ReferenceStore(self.bench.reference_dir if self.bench.reuse_reference else None)
        records = RecordWriter(self.run_dir)
        logger = WandbLogger(self.cfg, self.run_dir, "/".join(self.names.values()))
        OmegaConf.save(self.cfg, self.run_dir / "config.yaml", resolve=True)
        before = compile_stats()
        warmup_s = self._warmup()
        self.warm_compile = {k: v - before[k] for k, v in compile_stats().items()}
        done = records.done
        bar = tqdm(self.samples, desc=f"{self.names['method']} on {self.names['task']}", file=sys.stderr,
                   disable=not self.bench.progress)
        for sample in bar:
            self._run_sample(sample, records, done, logger)
            s = summarize(records.rows)
            bar.set_postfix(tau=f"{s.get('tau', 0):.2f}", speedup=f"{s.get('speedup', math.nan):.2f}")
        records.close()
        summary = self._summary(records.rows, warmup_s, load_s)
        summary.update(compile=asdict(self.compile) if self.compile else None, step_attention=self.engine.step_backend,
                       compile_s=self.warm_compile["compile_s"], compiled_graphs=self.warm_compile["graphs"])
        summary["accept_hist"] = accept_histogram(o["accept_lengths"] for o in records.outputs.values())
        write_json_atomic(self.run_dir / "summary.json", summary)
        logger.finish(records.rows, summary)
        print_summary(summary, self.cfg.model.get("tiny") is not None)
        return summary

    def _warmup(self) -> float:
        """bench.warmup generations of the first prompt by method and reference, excluded from all timings.

        With compiled steps at least one is run: it compiles every step shape (compile time is reported apart as
        ``compile_s``; each row counts the graphs compiled during its own timing in ``compiles``, normally 0).
        """
        rounds = max(self.bench.warmup, 1 if self.compile is not None else 0)
        if not rounds or not self.samples:
            return 0.0
        sample = self.samples[0]
        prompt = self.task.prompt_ids(self.engine.tokenizer, sample, 0, [])
        self.clock.start()
        for _ in range(rounds):
            for decoder in (self.method, self.reference):
                decoder.generate(self.engine, prompt, min(self.budget(sample), 64), self.eos, self.sampling,
                                 self.sampling.generator(0, self.device))
        self.clock.stop()
        return self.clock.total_s

    def _run_sample(self, sample, records: RecordWriter, done: set, logger: WandbLogger) -> None:
        answers: list[str] = []
        for turn in range(len(sample.turns)):
            keys = [(str(sample.id), turn, r) for r in range(self.bench.repeats)]
            if all(k in done for k in keys) and records.output(sample.id, turn) is None:
                return  # this turn failed in an earlier run: its later turns were recorded as skipped
            try:
                prompt = self.task.prompt_ids(self.engine.tokenizer, sample, turn, answers)
            except Exception as exc:  # noqa: BLE001 - a bad sample must not stop the sweep
                prompt, error = None, exc
            ref = None
            for key in keys:
                if key in done:
                    continue
                if prompt is None:
                    row = self._failed_row(sample, turn, key[2], error)
                    records.write(row)
                    continue
                try:
                    row, output, ref = self._measure(sample, turn, key[2], prompt, ref)
                except Exception as exc:  # noqa: BLE001 - OOM and friends are recorded, the sweep goes on
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                    row, output = self._failed_row(sample, turn, key[2], exc, len(prompt)), None
                records.write(row, output if records.output(sample.id, turn) is None else None)
                logger.log_row(row)
            previous = records.output(sample.id, turn)
            if previous is None:  # failed: later turns cannot be built
                for later in range(turn + 1, len(sample.turns)):
                    for r in range(self.bench.repeats):
                        if (str(sample.id), later, r) not in done:
                            records.write(self._failed_row(sample, later, r, f"skipped: turn {turn} failed"))
                return
            answers.append(previous["text"])

    def _generate(self, decoder, prompt, budget, seed_index):
        seed_everything(self.bench.seed * 1_000_003 + seed_index)  # methods with their own randomness (stream init)
        generator = self.sampling.generator(seed_index, self.device)
        self.memory.reset()
        self.clock.start()
        gen = decoder.generate(self.engine, prompt, budget, self.eos, self.sampling, generator, self.clock)
        self.clock.stop()
        times = {"prefill_s": self.clock.prefill_s, "decode_s": self.clock.decode_s, "total_s": self.clock.total_s}
        return gen, times

    def _reference_key(self, prompt: list[int], budget: int) -> str:
        return reference_key(
            model=self.ckpt.identity, dtype=self.dtype, device=self.env["device_name"], backend=self.engine.backend,
            prompt=hashlib.sha256(json.dumps(prompt).encode()).hexdigest(), max_new_tokens=budget, eos=self.eos,
            sampling=asdict(self.sampling), decoder=repr(self.reference), context=self.context,
            **({"compile": asdict(self.compile)} if self.compile else {}),  # eager keys stay as they were
            versions=[self.env["torch"], self.env["transformers"], self.env["fafo_bench"]],
        )

    def _measure(self, sample, turn: int, repeat: int, prompt: list[int], ref: dict | None):
        budget = self.budget(sample)
        seed_index = int(hashlib.sha1(f"{sample.id}/{turn}".encode()).hexdigest()[:8], 16)
        key = self._reference_key(prompt, budget)
        graphs = compile_stats()["graphs"]
        ref = ref or self.store.get(key)
        ref_source = "stored"
        if ref is None or len(ref["total_s"]) <= repeat:  # interleave: reference right before the method
            gen_ref, t_ref = self._generate(self.reference, prompt, budget, seed_index)
            ref = ref or {"tokens": gen_ref.tokens, "total_s": [], "decode_s": [], "device": self.env["device_name"]}
            ref["total_s"].append(t_ref["total_s"])
            ref["decode_s"].append(t_ref["decode_s"])
            ref_total, ref_decode, ref_source = t_ref["total_s"], t_ref["decode_s"], "interleaved"
            if len(ref["total_s"]) >= self.bench.repeats:
                self.store.put(key, ref)
        else:
            ref_total = sorted(ref["total_s"])[len(ref["total_s"]) // 2]
            ref_decode = sorted(ref["decode_s"])[len(ref["decode_s"]) // 2]
        gen, t = self._generate(self.method, prompt, budget, seed_index)
        peak = self.memory.peak_mb(self.engine, gen.extras)
        greedy = self.sampling.greedy
        mismatch = first_mismatch(gen.tokens, ref["tokens"])
        row = {
            **self._base_row(sample, turn, repeat), "prompt_tokens": len(prompt), "new_tokens": len(gen.tokens),
            "forwards": gen.n_forwards, "tau": gen.tau,
            "mean_accept": sum(gen.accept_lengths) / max(1, len(gen.accept_lengths)), **t,
            "tokens_per_s": len(gen.tokens) / t["total_s"], "peak_mem_mb": peak,
            "ref_new_tokens": len(ref["tokens"]), "ref_total_s": ref_total, "ref_decode_s": ref_decode,
            "speedup": ref_total / t["total_s"], "exact_match": (mismatch == -1) if greedy else "",
            "first_mismatch": mismatch if greedy else "", "ref_source": ref_source, "seed": seed_index,
            "compiles": compile_stats()["graphs"] - graphs, "status": "ok",
        }
        output = {"sample_id": str(sample.id), "turn": turn, "prompt_tokens": len(prompt), "tokens": gen.tokens,
                  "text": self.engine.tokenizer.decode(gen.tokens, skip_special_tokens=True),
                  "accept_lengths": gen.accept_lengths, "extras": gen.extras}
        return row, output, ref

    def _base_row(self, sample, turn, repeat) -> dict:
        return {"sample_id": str(sample.id), "turn": turn, "repeat": repeat, "category": sample.category,
                **self.names}

    def _failed_row(self, sample, turn, repeat, error, prompt_tokens="") -> dict:
        if isinstance(error, BaseException):
            traceback.print_exception(error, file=sys.stderr)
            error = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        return {**self._base_row(sample, turn, repeat), "prompt_tokens": prompt_tokens, "status": error}

    def _summary(self, rows, warmup_s: float, load_s: float) -> dict:
        return {**self.names, **summarize(rows), "dtype": self.dtype, **self.env,
                "attention": self.engine.backend, "repeats": self.bench.repeats, "warmup_s": warmup_s,
                "load_s": load_s, "sampling": asdict(self.sampling), "ignore_eos": bool(self.bench.ignore_eos),
                "random_model": self.cfg.model.get("tiny") is not None, "run_dir": str(self.run_dir)}


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (per sample, so reruns and resumes agree)."""
    seed %= 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def print_summary(summary: dict, random_model: bool) -> None:
    keys = ["model", "method", "task", "n_samples", "n_turns", "n_failed", "new_tokens", "tau", "tau_request",
            "tokens_per_s", "speedup", "speedup_mean", "speedup_min", "speedup_max", "peak_mem_mb",
            "exact_match_rate", "dtype", "device_name", "warmup_s", "compile_s", "run_dir"]
    width = max(map(len, keys))
    lines = ["", "== fafo-bench summary =="]
    for k in keys:
        v = summary.get(k)
        if v is None:
            continue
        lines.append(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if random_model:
        lines.append(RANDOM_MODEL_NOTE)
    print("\n".join(lines), flush=True)
