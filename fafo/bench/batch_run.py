"""The benchmark loop at ``bench.batch_size`` B > 1: the task's samples decoded B at a time
(:func:`fafo.batch.decode_batch`), vanilla and the method each at the same B and batching mode, one pass after the
other (vanilla first, as at batch 1: interleaved), per turn and repeat (a turn's prompts need every sample's earlier
answers). Each pass writes one line of ``batch_steps.jsonl`` (its wall time and, per batched step, the active
requests and the tokens each committed) and each request its usual ``samples.csv`` row and output line.

A request's times in its row (the cost it put on the machine, so that sums over requests are the batch's wall time
and the aggregate speedups are throughput ratios under load): ``prefill_s`` its own prefill, ``decode_s`` its share
of every batched step it took part in (the step's time over its active requests; a step's time is the gap since the
previous step's end less the prefills admitted in it), ``total_s`` their sum. Beside them what the request saw:
``latency_s`` (admitted to last token), ``queue_s`` (waiting before admission) and ``tpot_ms`` (time per output
token after the first). ``ref_*`` are vanilla's, in its own pass at the same B and mode.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import torch

from fafo.batch import BatchResult, Request, decode_batch
from fafo.bench.records import compact, first_mismatch, output_line, row_key
from fafo.bench.timing import sync
from fafo.engine.batching import bucket_fillers
from fafo.engine.compiled import compile_stats, cudagraph_skips

BATCH_STEPS = "batch_steps.jsonl"
BATCH_COLUMNS = ["batch_size", "batching", "queue_s", "latency_s", "tpot_ms", "ref_latency_s", "ref_tpot_ms"]


def seed_index(sample_id, turn: int) -> int:
    """A (sample, turn)'s seed index, the one its batch-1 run uses (:func:`fafo.bench.runner.timed`)."""
    return int(hashlib.sha1(f"{sample_id}/{turn}".encode()).hexdigest()[:8], 16)


def shares(result: BatchResult) -> list[tuple[float, float]]:
    """Each request's (prefill, decode share) of ``result``'s wall time (module docstring)."""
    prefill = [t.first_token_s - t.admitted_s for t in result.times]
    decode = [0.0] * len(result.times)
    previous = result.start_s
    for step in result.steps:
        admitted = sum(p for p, t in zip(prefill, result.times) if previous <= t.admitted_s < step.end_s)
        seconds = max(0.0, step.end_s - previous - admitted)
        for i in step.requests:
            decode[i] += seconds / len(step.requests)
        previous = step.end_s
    return list(zip(prefill, decode))


class Pass:
    """One decoder's timed pass over a list of requests: its result, wall time, peak memory and forward log."""

    def __init__(self, spec, meter, decoder, prompts: list[list[int]], max_new: list[int], seeds: list[int],
                 eager: bool = False):
        b, engine = spec.bench, meter.engine
        for seeder in (random.seed, np.random.seed, torch.manual_seed):  # methods with their own randomness
            seeder((b.seed * 1_000_003 + seeds[0]) % 2**32)
        requests = [Request(p, m, meter.eos, None if spec.sampling.greedy else
                            spec.sampling.generator(s, spec.device)) for p, m, s in zip(prompts, max_new, seeds)]
        meter.memory.reset()
        engine.ledger.log = log = []
        try:
            with meter.eager(eager):
                sync(spec.device)
                self.result = decode_batch(decoder, engine, requests, b.batch_size, b.batching, spec.sampling)
                sync(spec.device)
        finally:
            engine.ledger.log = None
        self.log = compact(log)
        self.wall_s = max(t.finished_s for t in self.result.times) - self.result.start_s
        buffers = sorted((int(g.extras.get("buffer_bytes", 0)) for g in self.result.generations), reverse=True)
        self.peak = meter.memory.peak_mb(engine, {"buffer_bytes": sum(buffers[: b.batch_size])},
                                         (id(decoder), eager), meter.others_held(decoder),
                                         meter.spare_cache_bytes(decoder))
        self.shares = shares(self.result)

    def times(self, i: int) -> dict:
        """Request ``i``'s ``prefill_s``, ``decode_s``, ``total_s`` (its shares) and what it saw."""
        t, (prefill, decode) = self.result.times[i], self.shares[i]
        n = len(self.result.generations[i].tokens)
        return {"prefill_s": prefill, "decode_s": decode, "total_s": prefill + decode,
                "latency_s": t.finished_s - t.admitted_s, "queue_s": t.admitted_s - self.result.start_s,
                "tpot_ms": 1000 * (t.finished_s - t.first_token_s) / (n - 1) if n > 1 else ""}

    def record(self, decoder: str, turn: int, repeat: int, ids: list[str]) -> dict:
        """The pass's line of ``batch_steps.jsonl``: per batched step the active requests (sample ids) and the
        tokens each committed, and its end (seconds since the pass began)."""
        r = self.result
        return {"decoder": decoder, "turn": turn, "repeat": repeat, "requests": ids, "wall_s": self.wall_s,
                "tokens": sum(len(g.tokens) for g in r.generations), "host_s": r.host_s,
                "steps": [{"rows": [ids[i] for i in s.requests], "new_tokens": s.new_tokens,
                           "end_s": s.end_s - r.start_s} for s in r.steps]}


def measure_batch(spec, meter, records, logger=None, progress=None) -> list[dict]:
    """Every turn and repeat not on record, B samples at a time (module docstring); returns the run's rows."""
    from fafo.bench.runner import row  # the batch-1 row, B > 1 times and columns added

    done, samples = records.done, list(spec.samples)
    answers = {s.id: [] for s in samples}
    stopped: set = set()  # samples whose earlier turn failed
    steps_path = Path(spec.run_dir) / BATCH_STEPS
    for turn in range(max((len(s.turns) for s in samples), default=0)):
        here = [s for s in samples if turn < len(s.turns) and s.id not in stopped]
        decoders = (spec.method, spec.reference)
        snapshots = [d.snapshot() for d in decoders] if spec.bench.repeats > 1 else None
        for repeat in range(spec.bench.repeats):
            todo = [s for s in here if row_key(s.id, turn, repeat) not in done]
            if not todo:
                continue
            if snapshots is not None and repeat > 0:
                for decoder, snapshot in zip(decoders, snapshots):
                    decoder.restore(snapshot)
            built = []
            for s in todo:
                try:
                    built.append((s, spec.task.prompt_ids(meter.engine.tokenizer, s, turn, answers[s.id])))
                except Exception as exc:  # noqa: BLE001 - a bad sample must not stop the sweep
                    records.write(row(spec, s, turn, repeat, error=exc))
            if not built:
                continue
            try:
                rows = _passes(spec, meter, built, turn, repeat, steps_path, row)
            except Exception as exc:  # noqa: BLE001 - OOM and friends are recorded, the sweep goes on
                if spec.device.type == "cuda":
                    torch.cuda.empty_cache()
                rows = [(row(spec, s, turn, repeat, error=exc, prompt_tokens=len(p)), None) for s, p in built]
            for out, output in rows:
                sid = out["sample_id"]
                records.write(out, output if records.output(sid, turn) is None else None)
                if logger is not None:
                    logger.log_row(out)
        for s in here:
            previous = records.output(s.id, turn)
            if previous is None:
                stopped.add(s.id)
                for later in range(turn + 1, len(s.turns)):
                    for r in range(spec.bench.repeats):
                        if row_key(s.id, later, r) not in done:
                            records.write(row(spec, s, later, r, error=f"skipped: turn {turn} failed"))
            else:
                answers[s.id].append(previous["text"])
    if progress is not None:  # an outer bar (a comparison's) counts samples
        progress.update(len(samples))
    return records.rows


def _passes(spec, meter, built, turn: int, repeat: int, steps_path: Path, row) -> list[tuple[dict, dict]]:
    """Vanilla's pass, what is timed beside the method, the method's pass; each request's row and output."""
    ids = [str(s.id) for s, _ in built]
    prompts, seeds = [p for _, p in built], [seed_index(s.id, turn) for s, _ in built]
    max_new = [spec.max_new_tokens(s) for s, _ in built]
    graphs = compile_stats()["graphs"]
    ref = Pass(spec, meter, spec.reference, prompts, max_new, seeds)
    passes = {"reference": ref}
    if spec.method_eager:
        passes["eager_reference"] = Pass(spec, meter, spec.reference, prompts, max_new, seeds, eager=True)
    method = passes["method"] = Pass(spec, meter, spec.method, prompts, max_new, seeds, eager=spec.method_eager)
    if spec.bench.aa_floor:
        passes["aa_reference"] = Pass(spec, meter, spec.reference, prompts, max_new, seeds)
    compiles = compile_stats()["graphs"] - graphs  # compiled while timed: every request of the pass holds it
    with open(steps_path, "a") as f:
        for name, p in passes.items():
            f.write(json.dumps(p.record(name, turn, repeat, ids)) + "\n")
    out = []
    for i, (sample, prompt) in enumerate(built):
        gen, ref_gen = method.result.generations[i], ref.result.generations[i]
        t, t_ref = method.times(i), ref.times(i)
        beside = {"batch_size": spec.bench.batch_size, "batching": spec.bench.batching, "queue_s": t["queue_s"],
                  "latency_s": t["latency_s"], "tpot_ms": t["tpot_ms"], "ref_latency_s": t_ref["latency_s"],
                  "ref_tpot_ms": t_ref["tpot_ms"]}
        if "eager_reference" in passes:
            e = passes["eager_reference"].times(i)
            beside |= {"eager_ref_total_s": e["total_s"], "eager_ref_decode_s": e["decode_s"]}
        if "aa_reference" in passes:
            a = passes["aa_reference"].times(i)
            beside |= {"aa_total_s": a["total_s"], "aa_decode_s": a["decode_s"]}
        mismatch = first_mismatch(gen.tokens, ref_gen.tokens) if spec.sampling.greedy else -1
        judged = meter.judge(prompt, gen.tokens, ref_gen.tokens, mismatch) if mismatch >= 0 else ("", "")
        times = {k: t[k] for k in ("prefill_s", "decode_s", "total_s")}
        ref_times = {k: t_ref[k] for k in ("prefill_s", "decode_s", "total_s")}
        r = row(spec, sample, turn, repeat, prompt=prompt, gen=gen, times=times, peak=method.peak,
                ref_tokens=ref_gen.tokens, ref_times=ref_times, ref_peak=ref.peak, ref_source="interleaved",
                beside=beside, mismatch=mismatch, judged=judged, seed=seeds[i], compiles=compiles)
        ref_state = {"tokens": ref_gen.tokens, "forward_log": None}
        out.append((r, output_line(meter.engine.tokenizer, sample.id, turn, prompt, gen, None, ref_state)))
    return out


def warmup_batch(spec, meter) -> float:
    """``bench.warmup`` batched passes (at least one with compiled steps, two with CUDA graphs) of every decoder
    over the first B samples' first prompts at ``bench.warmup_tokens``, excluded from all timings; with compiled
    steps also over the first 2, 1, ... of them, one pass per row bucket (:func:`fafo.engine.batching.bucket_fillers`),
    so that no timed pass compiles a graph when its batch shrinks. Cross-request state is restored afterwards.
    Returns their seconds."""
    rounds = max(spec.bench.warmup, (2 if spec.compile.cudagraphs else 1) if spec.compile is not None else 0)
    if not rounds or not spec.samples:
        return 0.0
    firsts = list(spec.samples[: spec.bench.batch_size])
    prompts = [spec.task.prompt_ids(meter.engine.tokenizer, s, 0, []) for s in firsts]
    max_new = [min(spec.max_new_tokens(s), spec.bench.warmup_tokens) for s in firsts]
    decoders = (spec.method, spec.reference)
    before = [d.snapshot() for d in decoders]
    runs = [(spec.method, spec.method_eager), (spec.reference, False)] + \
        ([(spec.reference, True)] if spec.method_eager else [])
    # compiled steps: a batch of each bucket's size too (a shrinking batch's graphs, whatever order rows finish in)
    sizes = bucket_fillers(len(prompts), spec.bench.batch_size) if spec.compile is not None else [len(prompts)]
    total = 0.0
    for _ in range(rounds):
        for decoder, eager in runs:
            for n in sizes if not eager else sizes[:1]:
                p = Pass(spec, meter, decoder, prompts[:n], max_new[:n], list(range(n)), eager=eager)
                meter.memory.warm((id(decoder), eager), meter.others_held(decoder) + meter.spare_cache_bytes(decoder))
                total += p.wall_s
    for decoder, snapshot in zip(decoders, before):
        decoder.restore(snapshot)
    if cudagraph_skips():  # as at batch 1 (fafo.bench.timing.Meter.warmup): replay-free steps are not timed
        raise RuntimeError(f"{cudagraph_skips()} compiled batched decode steps were not recorded as CUDA graphs "
                           "(TORCH_LOGS=perf_hints names them): timings would be of replay-free steps. Fix the "
                           "decoder, or run with bench.compile_mode=default")
    return total
