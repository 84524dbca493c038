"""The benchmark loop: one model, one method, one task; every sample timed beside its vanilla reference.

Order of work: validate every setting and load the task (errors before any model is loaded), resolve the
checkpoint and check the prompts fit its context, load the weights once, warm up (timed apart), then per sample
and turn and repeat: time the vanilla reference right before the method (interleaved; a stored timing only with
``bench.reuse_reference=true`` and when :func:`~fafo.bench.reference.timing_reusable` accepts it), run the method,
compare tokens, append a row. Rows already in ``samples.csv`` are skipped, so a restarted run resumes.

One baseline: with compiled steps (``bench.compile``) the reference is the compiled vanilla for every method. A
method that cannot run compiled (``Decoder.eager_forwards``) runs eagerly against it, and an eager vanilla is timed
beside it as well (``eager_ref_*``, the summary's ``speedup_vs_eager``); the summary's ``timing_note`` says so.
With ``bench.aa_floor`` vanilla is timed a second time right after the method (``aa_*``, ``aa_speedup``): the A/A
noise floor measured beside this very method. Every generation's forwards are logged (tokens, attended lengths)
for the projection of :mod:`fafo.bench.projection`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import socket
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fafo.bench.console import RANDOM_MODEL_NOTE, RunningTotals, print_summary  # noqa: F401 (re-exported)
from fafo.bench.cost_curve import CostCurve
from fafo.bench.metrics import accept_histogram, flag_counts, summarize
from fafo.bench.mismatch import MismatchJudge
from fafo.bench.naming import Job, run_names, split_hydra
from fafo.bench.plan import check_run
from fafo.bench.preempt import sample_done
from fafo.bench.projection import compact, summary_fields
from fafo.bench.records import RecordWriter, check_lock_free, first_mismatch, write_json_atomic
from fafo.bench.reference import ReferenceStore, ReferenceTimings, reference_key
from fafo.bench.setup import (build, check_bench, check_config, check_region_fits, cpu_name,
                              environment, method_node, resolve_compile, resolve_device, resolve_dtype,
                              resolve_model)
from fafo.bench.timing import PeakMemory, SyncClock, busy_warning, load_average, machine_state
from fafo.bench.transcript import prompt_fields, reference_fields
from fafo.bench.wandb_log import WandbLogger
from fafo.engine.compiled import compile_stats, cudagraph_skips, reset_compiled_state
from fafo.engine.engine import Engine


class Runner:
    """Runs one configuration into ``run_dir`` (see module docstring). ``run()`` returns the summary dict."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path | None = None):
        """``cfg``: composed by ``python -m fafo.bench``, or in Python by :func:`fafo.bench.naming.compose_run` (or
        ``compose(..., return_hydra_config=True)``), whose Hydra node gives the run the CLI's names and, without
        ``run_dir``, its directory (``hydra.run.dir``). A config composed without it has no overrides typed."""
        self.hydra_job = Job.of(cfg)  # the overrides typed and the group options chosen
        cfg, hydra_dir = split_hydra(cfg)
        if run_dir is None and hydra_dir is None:
            raise TypeError("Runner: no run directory; pass run_dir, or compose the config with "
                            "fafo.bench.naming.compose_run (it holds hydra.run.dir)")
        self.cfg, self.bench, self.run_dir = cfg, cfg.bench, Path(run_dir or hydra_dir)
        check_config(cfg, self.hydra_job.overrides)
        check_bench(self.bench)
        self.device = resolve_device(self.bench.device)
        self.dtype = resolve_dtype(self.bench.dtype, self.device)
        self.compile = resolve_compile(self.bench, self.device)
        self.sampling = build(cfg.sampling, "sampling")
        self.method = build(method_node(cfg.method), "method")
        self.reference = build(self.bench.reference, "bench.reference")
        self.method.check_sampling(self.sampling)
        self.reference.check_sampling(self.sampling)
        self.timing_note = ""  # one baseline: every method of a table races the same (compiled) vanilla
        self.method_eager = False  # the method runs eagerly beside a compiled vanilla (module docstring)
        if self.compile is not None and self.reference.eager_forwards:
            self.timing_note = ("timed eagerly, method and reference alike (bench.compile set; the reference cannot "
                                f"run compiled: {self.reference.eager_forwards})")
            self.compile = None
        elif self.compile is not None and self.method.eager_forwards:
            self.method_eager = True
            self.timing_note = (f"the method runs eagerly ({self.method.eager_forwards}); its speedup is against the "
                                "compiled vanilla every other method races; speedup_vs_eager (against an eager "
                                "vanilla timed beside it) is next to it")
        self.cost_curve = CostCurve.load(self.bench.cost_curve) if self.bench.get("cost_curve") else None
        self.task = build(cfg.task, "task")
        self.samples = self.task.samples()[: self.bench.max_samples or None]
        check_lock_free(self.run_dir)  # a second writer is refused now, not after loading its model
        label = cfg.method.get("name") or type(self.method).__name__
        compress = getattr(self.method, "compress", None)  # e.g. "fafo-{compress}" -> "fafo-quest"
        overrides, choice = self.hydra_job.overrides, self.hydra_job.choices.get("model")
        self.ckpt = resolve_model(cfg.model, overrides, choice)  # model.path wins over a tiny spec
        self.names = {"model": run_names(cfg.model, self.hydra_job).model, "task": cfg.task.name,  # fafo.bench.naming
                      "method": label.format(compress=compress.label) if compress is not None else label}
        if self.sampling.from_generation_config:  # sampling=model_default: only now is the checkpoint known
            self.sampling = self.sampling.resolve(self.ckpt.path)
            self.method.check_sampling(self.sampling)
            self.reference.check_sampling(self.sampling)
        # again with the tokenizer: drops samples too short for the task (e.g. PG-19 books under the prefix length)
        self.samples = self.task.samples(self.ckpt.tokenizer)[: self.bench.max_samples or None]
        self.method.check_target(self.ckpt.config, self.ckpt.tokenizer)
        self.plan = check_run(self)  # fafo.bench.plan: context, every turn, scratch, memory; refuses or drops
        self.context, self.samples = self.plan.context_limit, self.plan.kept
        check_region_fits(self.method, self.context)

    def max_new_tokens(self, sample) -> int:
        """New tokens each turn of ``sample`` may generate: ``bench.max_new_tokens``, else the sample's own."""
        return self.bench.max_new_tokens or sample.max_new_tokens

    def _needed_slots(self, n_prompt: int, max_new: int) -> int:
        return n_prompt + max_new + max(self.method.extra_slots(max_new), self.reference.extra_slots(max_new))

    def _run_slots(self) -> int:
        """Cache slots the largest sample and turn of the run needs (a later turn's prompt holds the earlier
        answers, each at most max_new_tokens long): compiled steps are specialised to one cache size."""
        most = 0
        for s in self.samples:
            max_new = self.max_new_tokens(s)
            for turn in range(len(s.turns)):
                try:
                    n = len(self.task.prompt_ids(self.ckpt.tokenizer, s, turn, [""] * turn))
                except Exception:  # noqa: BLE001 - a bad sample is recorded when it runs, not here
                    continue
                most = max(most, self._needed_slots(n + turn * (max_new + 8), max_new))
        return most

    # ---------------------------------------------------------------- run
    def run(self, engine: Engine | None = None, progress=None, report: bool = True) -> dict:
        """Benchmark every sample; ``engine``: an already loaded one to share (``fafo.bench.compare``),
        ``progress``: an outer progress bar to advance per sample, ``report``: print the summary.

        However it ends, the run then :meth:`release`\ s what it holds on the device (the engine's weights
        excepted), so the next method of a comparison or job of a sweep starts from the same clean state."""
        try:
            return self._run(engine, progress, report)
        finally:
            self.release()

    def release(self) -> None:
        """Free the decoders' state, the static cache, the compiled steps and CUDA-graph pools, the float32 copy
        the mismatch check may have loaded; keep the weights (a comparison shares them)."""
        for decoder in (self.method, self.reference):
            decoder.release()
        if getattr(self, "engine", None) is not None:
            self.engine.release()
        if getattr(self, "judge", None) is not None:
            self.judge.release()
        self.judge = None
        reset_compiled_state()

    def _run(self, engine: Engine | None, progress, report: bool) -> dict:
        self.machine = machine_state(self.device)  # before loading, so our own load does not count
        # a shared engine (fafo.bench.compare) means this process itself just ran the previous method: only the
        # first run of a comparison judges whether the machine is busy
        self.busy = None if engine is not None else busy_warning(self.machine, self.bench.get("busy_load", 0.75))
        if self.busy:
            print(self.busy, file=sys.stderr, flush=True)
        t_load = time.perf_counter()
        self.engine = engine or Engine.load(
            self.ckpt.path, self.ckpt.config, self.ckpt.tokenizer, device=self.device, dtype=self.dtype,
            backend=self.cfg.model.get("attention", "sdpa"), max_len=self.context, name=self.names["model"])
        if self.compile is not None:
            self.engine.enable_compile(self.compile)
        self.engine.cache(self._run_slots())  # allocated once, before timing; compiled graphs are specialised to it
        load_s = time.perf_counter() - t_load
        self.n_params = sum(p.numel() for p in self.engine.model.parameters())  # tied embeddings counted once
        self.env = environment(self.device)
        self.eos = () if self.bench.ignore_eos else self.engine.eos_ids
        self.method.setup(self.engine)
        self.reference.setup(self.engine)
        self.clock, self.memory = SyncClock(self.device), PeakMemory(self.device)
        self.judge = MismatchJudge(self.engine, self.ckpt, self.context, self.bench.get("tie_margin", 0.1),
                                   self.bench.get("tie_check", "cpu"))
        self.references = ReferenceTimings(  # always written; read for reuse when asked
            ReferenceStore(self.bench.reference_dir), self.bench.reuse_reference,
            self.bench.get("reuse_max_spread", 1.1), self.bench.get("busy_load", 0.75))
        records = RecordWriter(self.run_dir)
        if records.repairs:
            print(f"records repaired in {self.run_dir}: " + "; ".join(records.repairs), file=sys.stderr, flush=True)
        logger = WandbLogger(self.cfg, self.run_dir, "/".join(self.names.values()))
        machine = {"threads": self.machine["threads"], "load_start": self.machine["load"],
                   "cpu_name": cpu_name(), "cpu_count": self.machine["cpu_count"],
                   "gpu_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                   "gpu_others_mb": self.machine["gpu_others_mb"], "busy_warning": self.busy}
        if getattr(logger, "run", None) is not None:
            logger.run.config.update({"machine": machine}, allow_val_change=True)
        OmegaConf.save(self.cfg, self.run_dir / "config.yaml", resolve=True)
        before = compile_stats()
        warmup_s = self._warmup()
        self.warm_compile = {k: v - before[k] for k, v in compile_stats().items()}
        done = records.done
        bar = progress or tqdm(total=len(self.samples), desc=f"{self.names['method']} on {self.names['task']}",
                               file=sys.stderr, disable=not self.bench.progress)
        totals = RunningTotals(self.bench.get("speedup_kind", "e2e"))
        for row in records.rows:  # resumed rows count from the start
            totals.add(row)
        for sample in self.samples:
            seen = len(records.rows)
            self._run_sample(sample, records, done, logger)
            sample_done()  # a scheduler's stop signal (fafo.bench.preempt): stop here, every row written
            for row in records.rows[seen:]:
                totals.add(row)
            bar.update(1)
            bar.set_postfix(totals.postfix())
        if progress is None:
            bar.close()
        problems = records.check(self._expected_keys())
        records.close()
        if records.repairs or problems:
            print(f"records check of {self.run_dir}: "
                  + (f"repaired on resume ({'; '.join(records.repairs)}); " if records.repairs else "")
                  + ("; ".join(problems) if problems else
                     f"now consistent ({len(records.rows)} rows, {len(records.outputs)} outputs)"),
                  file=sys.stderr, flush=True)
        summary = self._summary(records.rows, warmup_s, load_s)
        summary.update(machine, load_end=load_average(), repaired=records.repairs, records_check=problems or "ok",
                       ref_reuse_refused=self.references.refused, **self.plan.summary_fields())
        if self.references.refused["n"]:
            print(f"note: {self.references.refused['n']} stored reference timings were not reused and were timed "
                  f"again beside the method ({self.references.refused['examples'][0]})", file=sys.stderr, flush=True)
        if summary.get("ref_sources", {}).get("stored"):
            print(f"warning: {summary['ref_sources']['stored']} rows use a stored reference timing "
                  "(bench.reuse_reference=true), not one taken beside the method", file=sys.stderr, flush=True)
        summary.update(compile=asdict(self.compile) if self.compile else None, timing_note=self.timing_note or None,
                       reference_backend="compiled" if self.compile else "eager",
                       method_backend="compiled" if self.compile and not self.method_eager else "eager",
                       step_attention=self.engine.step_backend,
                       compile_s=self.warm_compile["compile_s"], compiled_graphs=self.warm_compile["graphs"])
        summary |= summary_fields(self.method, self.cost_curve, records.rows, records.outputs, self.n_params,
                                  self.names["method"])
        summary["accept_hist"] = accept_histogram(o["accept_lengths"] for o in records.outputs.values())
        summary["flag_counts"] = flag_counts(records.outputs.values())  # e.g. {"retrieval_covers_prompt": 3}
        if self.judge.note:
            summary["mismatch_check"] = self.judge.note
        write_json_atomic(self.run_dir / "summary.json", summary)
        logger.finish(records.rows, summary)
        if report:
            print_summary(summary, self.ckpt.random)
        return summary

    def _warmup(self) -> float:
        """bench.warmup generations of the first prompt by method and reference, excluded from all timings.

        With compiled steps at least one is run: it compiles every step shape (compile time is reported apart as
        ``compile_s``; each row counts the graphs compiled during its own timing in ``compiles``, normally 0).
        Each decoder's warm-up peak is kept (:meth:`~fafo.bench.timing.PeakMemory.warm`: on CUDA its compiled
        steps' intermediates, which replays reuse unseen). Cross-request state
        (:attr:`~fafo.decoding.Decoder.cross_request_state`) is restored afterwards.
        """
        # CUDA graphs record on a graph's second call: two rounds, so no shape records inside a timed sample
        rounds = max(self.bench.warmup, (2 if self.compile.cudagraphs else 1) if self.compile is not None else 0)
        if not rounds or not self.samples:
            return 0.0
        sample = self.samples[0]
        prompt = self.task.prompt_ids(self.engine.tokenizer, sample, 0, [])
        before = [d.snapshot() for d in (self.method, self.reference)]  # warm-up leaves no learnt state behind
        runs = [(self.method, self.method_eager), (self.reference, False)] + \
            ([(self.reference, True)] if self.method_eager else [])  # the eager vanilla timed beside an eager method
        total, tokens = 0.0, self.bench.get("warmup_tokens", 64)
        for _ in range(rounds):
            for decoder, eager in runs:
                self.memory.reset()
                self.clock.start()
                with self._backend(eager):
                    decoder.generate(self.engine, prompt, min(self.max_new_tokens(sample), tokens), self.eos,
                                     self.sampling, self.sampling.generator(0, self.device))
                self.clock.stop()
                total += self.clock.total_s
                self.memory.warm((id(decoder), eager))
        for decoder, snapshot in zip((self.method, self.reference), before):
            decoder.restore(snapshot)
        if cudagraph_skips():  # each skipped graph would run without replay inside every timed sample
            raise RuntimeError(
                f"{cudagraph_skips()} compiled decode steps were not recorded as CUDA graphs (a CPU tensor or a "
                "dynamic shape reached a compiled step; TORCH_LOGS=perf_hints names it): timings would be of "
                "replay-free steps. Fix the decoder, or run with bench.compile_mode=default")
        return total

    def _backend(self, eager: bool):
        """Decode steps run eagerly inside (``eager``) on an engine whose steps are compiled."""
        return self.engine.eager_steps() if eager and self.engine.compiled is not None else nullcontext()

    def _expected_keys(self) -> set[tuple[str, int, int]]:
        return {(str(s.id), t, r) for s in self.samples for t in range(len(s.turns)) for r in range(self.bench.repeats)}

    def _run_sample(self, sample, records: RecordWriter, done: set, logger: WandbLogger) -> None:
        """Every turn and repeat of ``sample`` that is not on record yet (a resumed run fills exactly the gaps)."""
        answers: list[str] = []
        for turn in range(len(sample.turns)):
            keys = [(str(sample.id), turn, r) for r in range(self.bench.repeats)]
            if all(k in done for k in keys) and records.output(sample.id, turn) is None:
                self._skip_later(sample, turn, records, done)  # failed in an earlier run
                return
            try:
                prompt = self.task.prompt_ids(self.engine.tokenizer, sample, turn, answers)
            except Exception as exc:  # noqa: BLE001 - a bad sample must not stop the sweep
                prompt, error = None, exc
            ref = None
            # every timing repeat starts from the cross-request state the sample's first run started from
            snapshots = [d.snapshot() for d in (self.method, self.reference)] if self.bench.repeats > 1 else None
            for key in keys:
                if key in done:
                    continue
                if snapshots is not None and key[2] > 0:
                    for decoder, snapshot in zip((self.method, self.reference), snapshots):
                        decoder.restore(snapshot)
                if prompt is None:
                    records.write(self._failed_row(sample, turn, key[2], error))
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
                self._skip_later(sample, turn, records, done)
                return
            answers.append(previous["text"])

    def _skip_later(self, sample, turn: int, records: RecordWriter, done: set) -> None:
        for later in range(turn + 1, len(sample.turns)):
            for r in range(self.bench.repeats):
                if (str(sample.id), later, r) not in done:
                    records.write(self._failed_row(sample, later, r, f"skipped: turn {turn} failed"))

    def _generate(self, decoder, prompt, max_new, seed_index, eager: bool = False):
        """One timed generation: (Generation, times, its forward log grouped by :func:`~fafo.bench.projection.
        compact`, peak MB)."""
        seed_everything(self.bench.seed * 1_000_003 + seed_index)  # methods with their own randomness (stream init)
        generator = self.sampling.generator(seed_index, self.device)
        self.memory.reset()
        self.engine.ledger.log = log = []
        try:
            with self._backend(eager):
                self.clock.start()
                gen = decoder.generate(self.engine, prompt, max_new, self.eos, self.sampling, generator, self.clock)
                self.clock.stop()
        finally:
            self.engine.ledger.log = None
        times = {"prefill_s": self.clock.prefill_s, "decode_s": self.clock.decode_s, "total_s": self.clock.total_s}
        return gen, times, compact(log), self.memory.peak_mb(self.engine, gen.extras, (id(decoder), eager))

    def _reference_key(self, prompt: list[int], max_new: int) -> str:
        return reference_key(
            model=self.ckpt.identity, dtype=self.dtype, device=self.env["device_name"], backend=self.engine.backend,
            prompt=hashlib.sha256(json.dumps(prompt).encode()).hexdigest(), max_new_tokens=max_new, eos=self.eos,
            sampling=asdict(self.sampling), decoder=repr(self.reference), context=self.context,
            **({"compile": asdict(self.compile)} if self.compile else {}),  # eager keys stay as they were
            versions=[self.env["torch"], self.env["transformers"], self.env["fafo_bench"]],
            threads=torch.get_num_threads(), host=socket.gethostname(), engine_commit=self.env["git_sha"],
        )

    def _measure(self, sample, turn: int, repeat: int, prompt: list[int], ref: dict | None):
        max_new = self.max_new_tokens(sample)
        seed_index = int(hashlib.sha1(f"{sample.id}/{turn}".encode()).hexdigest()[:8], 16)
        key = self._reference_key(prompt, max_new)
        graphs = compile_stats()["graphs"]
        ref = ref or self.references.start(key)
        if ref.get("stored_ok"):  # bench.reuse_reference=true and the stored timing passed timing_reusable
            ref_total, ref_decode, ref_source = _median(ref["total_s"]), _median(ref["decode_s"]), "stored"
            ref_peak = ref.get("peak_mem_mb")
        else:  # interleaved: the reference runs right before the method, in this process, every repeat
            gen_ref, t_ref, ref["forward_log"], ref_peak = self._generate(self.reference, prompt, max_new, seed_index)
            ref["tokens"] = gen_ref.tokens  # this run's own reference tokens decide exact_match
            ref["total_s"].append(t_ref["total_s"])
            ref["decode_s"].append(t_ref["decode_s"])
            ref["peak_mem_mb"] = ref_peak
            ref_total, ref_decode, ref_source = t_ref["total_s"], t_ref["decode_s"], "interleaved"
            if len(ref["total_s"]) >= self.bench.repeats:
                self.references.keep(key, ref, {"device": self.env["device_name"], "load": load_average(),
                                                "cpu_count": self.machine["cpu_count"],
                                                "threads": torch.get_num_threads()})
        beside = {}
        if self.method_eager:  # the same backend as the method, timed beside it (speedup_vs_eager)
            _, t_eager, _, _ = self._generate(self.reference, prompt, max_new, seed_index, eager=True)
            beside |= {"eager_ref_total_s": t_eager["total_s"], "eager_ref_decode_s": t_eager["decode_s"]}
        gen, t, log, peak = self._generate(self.method, prompt, max_new, seed_index, eager=self.method_eager)
        if self.bench.get("aa_floor"):  # vanilla again, right after the method: the A/A floor beside it
            _, t_aa, _, _ = self._generate(self.reference, prompt, max_new, seed_index)
            beside |= {"aa_total_s": t_aa["total_s"], "aa_decode_s": t_aa["decode_s"]}
        greedy = self.sampling.greedy
        mismatch = first_mismatch(gen.tokens, ref["tokens"]) if greedy else -1
        kind, gap = self.judge(prompt, gen.tokens, ref["tokens"], mismatch) if mismatch >= 0 else ("", "")
        n, ref_n, f = len(gen.tokens), len(ref["tokens"]), gen.forwards
        timed = n > 1 and ref_n > 1  # a decode step on both sides (else a prefill against a prefill: no speedup)
        e2e = (n / t["total_s"]) / (ref_n / ref_total) if timed else ""
        row = {
            **self._base_row(sample, turn, repeat), "prompt_tokens": len(prompt), "new_tokens": n,
            "forwards": f.verify, "tau": _nan_blank(gen.tau), "tau_with_prefill": gen.tau_with_prefill,
            "tau_all": gen.tau_all, "mean_accept": sum(gen.accept_lengths) / max(1, len(gen.accept_lengths)),
            "prefill_forwards": f.prefill, "draft_forwards": f.draft, "aux_forwards": f.aux,
            "target_forwards": f.total, "target_tokens": f.tokens, "draft_model_forwards": gen.draft_model_forwards,
            "draft_model_params": gen.draft_model_params, "drafted": gen.drafted, "accepted": gen.accepted, **t,
            "tokens_per_s": n / t["total_s"], "verify_ms": 1000 * t["decode_s"] / f.verify if f.verify else "",
            "host_ms": _nan_blank(gen.host_ms_per_step),  # outside model calls (fafo.decoding.decode)
            "peak_mem_mb": peak, "ref_peak_mem_mb": ref_peak,
            "mem_overhead_mb": peak - ref_peak if ref_peak is not None else "",
            "ref_new_tokens": ref_n, "ref_total_s": ref_total, "ref_decode_s": ref_decode, **beside,
            "speedup": e2e, "speedup_e2e": e2e,
            "speedup_decode": ((n - 1) / t["decode_s"]) / ((ref_n - 1) / ref_decode) if timed else "",
            "exact_match": (mismatch == -1) if greedy else "", "first_mismatch": mismatch if greedy else "",
            "mismatch_kind": kind, "mismatch_gap": gap, "ref_source": ref_source, "seed": seed_index,
            "compiles": compile_stats()["graphs"] - graphs, "threads": torch.get_num_threads(),
            "load": load_average(), "status": "ok",
        }
        tok = self.engine.tokenizer
        output = {"sample_id": str(sample.id), "turn": turn, "prompt_tokens": len(prompt), "tokens": gen.tokens,
                  "text": tok.decode(gen.tokens, skip_special_tokens=True),
                  "accept_lengths": gen.accept_lengths, "forwards": asdict(gen.forwards),
                  "draft_model_forwards": gen.draft_model_forwards, "drafted": gen.drafted,
                  "accepted": gen.accepted, "extras": gen.extras, "forward_log": log,
                  "ref_forward_log": ref.get("forward_log"),  # then the prompt and vanilla's answer (transcript)
                  **prompt_fields(tok, prompt), **reference_fields(tok, ref["tokens"])}
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
        return {**self.names, **summarize(rows, self.bench.get("max_spread", 1.5), self.bench.get("bootstrap", 1000),
                                          self.bench.get("speedup_kind", "e2e")),
                "tie_margin": self.judge.margin,
                "dtype": self.dtype, **self.env,
                "attention": self.engine.backend, "repeats": self.bench.repeats, "warmup_s": warmup_s,
                "load_s": load_s, "sampling": asdict(self.sampling), "ignore_eos": bool(self.bench.ignore_eos),
                "random_model": self.ckpt.random, "checkpoint": self.ckpt.source, "n_params": self.n_params,
                "run_dir": str(self.run_dir), "host_ms_per_step": _median_of(rows, "host_ms")}


def _median_of(rows, key: str) -> float | None:
    """The median of a numeric column over the rows that have it (None: none has)."""
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(values) if values else None


def _nan_blank(x: float):
    return "" if math.isnan(x) else x


def _median(values: list[float]) -> float:
    return float(np.median(values))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (per sample, so reruns and resumes agree)."""
    seed %= 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
