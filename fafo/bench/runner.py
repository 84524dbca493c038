"""The benchmark loop over a resolved run (:class:`~fafo.bench.spec.RunSpec`): :meth:`Runner.run` loads the
weights once (a comparison's methods share them), sizes the shared cache, warms up, then :func:`measure` times per
sample, turn and repeat vanilla right before the method (interleaved; a stored timing only with
``bench.reuse_reference``), compares tokens and appends one row (:func:`row`); a restarted run resumes. With compiled
steps every method races the compiled vanilla; one that cannot run compiled runs eagerly beside an eager vanilla too
(``eager_ref_*``); ``bench.aa_floor`` times vanilla again right after the method (``aa_*``, the A/A floor).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from fafo.bench.batch_run import BATCH_COLUMNS, measure_batch, warmup_batch
from fafo.bench.records import RecordWriter, first_mismatch, output_line, row_key, write_json_atomic
from fafo.bench.reference import reference_key
from fafo.bench.summary import RunningTotals, print_summary, run_summary
from fafo.bench.timing import Meter, busy_warning, load_average, machine_state
from fafo.bench.tools.wandb_log import WandbLogger
from fafo.engine.compiled import compile_stats, reset_compiled_state
from fafo.engine.engine import Engine

SAMPLE_HOOKS: list = []  # run after each sample, every row of it written (a scheduler's stop: tools.preempt)


class Runner:
    """Runs resolved specs on one engine, loaded by the first run (the methods of a comparison share it)."""

    def __init__(self):
        self.engine: Engine | None = None

    def run(self, spec, progress=None, report: bool = True) -> dict:
        """Benchmark every sample of ``spec`` into its run directory; returns the summary. ``progress``: an outer
        bar to advance per sample, ``report``: print the summary. However it ends, what the run holds on the device
        (the weights excepted) is released, so the next method or job starts from the same clean state."""
        machine = machine_state(spec.device)  # before loading, so our own load does not count
        # a loaded engine: this process just ran the previous method, so only the first run judges the machine
        machine["busy_warning"] = None if self.engine else busy_warning(machine, spec.bench.busy_load)
        if machine["busy_warning"]:
            print(machine["busy_warning"], file=sys.stderr, flush=True)
        t_load, ckpt, meter = time.perf_counter(), spec.ckpt, None
        try:
            self.engine = engine = self.engine or Engine.load(
                ckpt.path, ckpt.config, ckpt.tokenizer, device=spec.device, dtype=spec.dtype,
                backend=spec.cfg.model.get("attention", "sdpa"), max_len=spec.context, name=spec.names["model"])
            if spec.compile is not None:
                engine.enable_compile(spec.compile)
            batched = spec.bench.batch_size > 1  # fafo.bench.batch_run: B requests at once
            engine.cache(spec.cache_slots, batch=spec.bench.batch_size)  # allocated once, before timing; compiled
            # graphs are specialised to it
            load_s, meter = time.perf_counter() - t_load, Meter(spec, engine)
            for decoder in (spec.method, spec.reference):
                decoder.setup(engine)
            records = RecordWriter(spec.run_dir, BATCH_COLUMNS if batched else ())
            logger = WandbLogger(spec.cfg, spec.run_dir, "/".join(spec.names.values()))
            logger.config({"machine": machine})
            OmegaConf.save(spec.cfg, spec.run_dir / "config.yaml", resolve=True)
            before = compile_stats()
            warmup_s = warmup_batch(spec, meter) if batched else meter.warmup()
            warm = {k: v - before[k] for k, v in compile_stats().items()}
            (measure_batch if batched else measure)(spec, meter, records, logger, progress)
            problems = records.finish({row_key(s.id, t, r) for s in spec.samples for t in range(len(s.turns))
                                       for r in range(spec.bench.repeats)})
            summary = run_summary(spec, meter, records, machine, problems, load_s=load_s, warmup_s=warmup_s,
                                  compile_s=warm["compile_s"], compiled_graphs=warm["graphs"])
            write_json_atomic(spec.run_dir / "summary.json", summary)
            logger.finish(records.rows, summary)
            if report:
                print_summary(summary, ckpt.random)
            return summary
        finally:
            for decoder in (spec.method, spec.reference):  # draft models, caches, cross-request state
                decoder.release()
            if self.engine is not None:
                self.engine.release()  # the static cache and the compiled steps; the weights stay
            if meter is not None:
                meter.judge.release()  # the float32 copy the tie check may have loaded
            reset_compiled_state()


def measure(spec, meter: Meter, records: RecordWriter, logger=None, progress=None) -> list[dict]:
    """Every turn and repeat of every sample not on record yet (a resumed run fills exactly the gaps), each
    repeat from the cross-request state the sample's first run started from; returns the run's rows."""
    decoders = (spec.method, spec.reference)
    done = records.done
    bar = progress or tqdm(total=len(spec.samples), desc=f"{spec.names['method']} on {spec.names['task']}",
                           file=sys.stderr, disable=not spec.bench.progress)
    totals = RunningTotals(spec.bench.speedup_kind)
    for r in records.rows:  # resumed rows count from the start
        totals.add(r)

    def skip_after(sample, turn: int) -> None:  # a failed turn: the later ones cannot be built
        for later, r in ((t, r) for t in range(turn + 1, len(sample.turns)) for r in range(spec.bench.repeats)):
            if row_key(sample.id, later, r) not in done:
                records.write(row(spec, sample, later, r, error=f"skipped: turn {turn} failed"))

    for sample in spec.samples:
        seen, answers = len(records.rows), []
        for turn in range(len(sample.turns)):
            keys = [row_key(sample.id, turn, r) for r in range(spec.bench.repeats)]
            if all(k in done for k in keys) and records.output(sample.id, turn) is None:
                skip_after(sample, turn)  # failed in an earlier run
                break
            try:
                prompt, error = spec.task.prompt_ids(meter.engine.tokenizer, sample, turn, answers), None
            except Exception as exc:  # noqa: BLE001 - a bad sample must not stop the sweep
                prompt, error = None, exc
            ref, snapshots = None, [d.snapshot() for d in decoders] if spec.bench.repeats > 1 else None
            for key in (k for k in keys if k not in done):
                if snapshots is not None and key[2] > 0:
                    for decoder, snapshot in zip(decoders, snapshots):
                        decoder.restore(snapshot)
                output = None
                try:
                    if prompt is None:
                        raise error
                    out, output, ref = timed(spec, meter, sample, turn, key[2], prompt, ref)
                except Exception as exc:  # noqa: BLE001 - OOM and friends are recorded, the sweep goes on
                    if spec.device.type == "cuda":
                        torch.cuda.empty_cache()
                    out = row(spec, sample, turn, key[2], error=exc,
                              prompt_tokens=len(prompt) if prompt is not None else "")
                records.write(out, output if records.output(sample.id, turn) is None else None)
                if logger is not None:
                    logger.log_row(out)
            previous = records.output(sample.id, turn)
            if previous is None:
                skip_after(sample, turn)
                break
            answers.append(previous["text"])
        for hook in SAMPLE_HOOKS:
            hook()
        for r in records.rows[seen:]:
            totals.add(r)
        bar.update(1)
        bar.set_postfix(totals.postfix())
    if progress is None:
        bar.close()
    return records.rows


def timed(spec, meter: Meter, sample, turn: int, repeat: int, prompt: list[int], ref: dict | None):
    """One repeat of one (sample, turn): vanilla (or its stored timing), the method, and what else is timed beside
    it; returns (row, output line, the reference state the turn's next repeat continues)."""
    max_new = spec.max_new_tokens(sample)
    seed_index = int(hashlib.sha1(f"{sample.id}/{turn}".encode()).hexdigest()[:8], 16)
    key = reference_key(spec, meter.engine, meter.env, meter.eos, prompt, max_new)
    graphs = compile_stats()["graphs"]
    ref = ref or meter.references.start(key)
    if ref.get("stored_ok"):  # bench.reuse_reference=true and the stored timing passed timing_reusable
        t_ref = {"total_s": float(np.median(ref["total_s"])), "decode_s": float(np.median(ref["decode_s"]))}
        ref_peak, source = ref.get("peak_mem_mb"), "stored"
    else:  # interleaved: the reference runs right before the method, in this process, every repeat
        gen_ref, t_ref, ref["forward_log"], ref_peak = meter.generate(spec.reference, prompt, max_new, seed_index)
        ref["tokens"], ref["peak_mem_mb"], source = gen_ref.tokens, ref_peak, "interleaved"
        ref["total_s"].append(t_ref["total_s"])
        ref["decode_s"].append(t_ref["decode_s"])
        if len(ref["total_s"]) >= spec.bench.repeats:
            meter.references.keep(key, ref, {"device": meter.env["device_name"], "load": load_average(),
                                             "cpu_count": os.cpu_count() or 1, "threads": torch.get_num_threads()})
    beside = {}
    if spec.method_eager:  # the same backend as the method, timed beside it (speedup_vs_eager)
        t = meter.generate(spec.reference, prompt, max_new, seed_index, eager=True)[1]
        beside |= {"eager_ref_total_s": t["total_s"], "eager_ref_decode_s": t["decode_s"]}
    gen, t, log, peak = meter.generate(spec.method, prompt, max_new, seed_index, eager=spec.method_eager)
    if spec.bench.aa_floor:  # vanilla again, right after the method: the A/A floor beside it
        t_aa = meter.generate(spec.reference, prompt, max_new, seed_index)[1]
        beside |= {"aa_total_s": t_aa["total_s"], "aa_decode_s": t_aa["decode_s"]}
    mismatch = first_mismatch(gen.tokens, ref["tokens"]) if spec.sampling.greedy else -1
    judged = meter.judge(prompt, gen.tokens, ref["tokens"], mismatch) if mismatch >= 0 else ("", "")
    out = row(spec, sample, turn, repeat, prompt=prompt, gen=gen, times=t, peak=peak, ref_tokens=ref["tokens"],
              ref_times=t_ref, ref_peak=ref_peak, ref_source=source, beside=beside, mismatch=mismatch,
              judged=judged, seed=seed_index, compiles=compile_stats()["graphs"] - graphs)
    return out, output_line(meter.engine.tokenizer, sample.id, turn, prompt, gen, log, ref), ref


def row(spec, sample, turn: int, repeat: int, *, error=None, prompt_tokens="", prompt=None, gen=None, times=None,
        peak=None, ref_tokens=None, ref_times=None, ref_peak=None, ref_source="", beside=None, mismatch=-1,
        judged=("", ""), seed="", compiles="") -> dict:
    """One ``samples.csv`` row: a measured repeat (``gen`` and the rest), or a failed one (``error``: an exception
    or a status line)."""
    base = {"sample_id": str(sample.id), "turn": turn, "repeat": repeat, "category": sample.category, **spec.names}
    if gen is None:
        if isinstance(error, BaseException):
            traceback.print_exception(error, file=sys.stderr)
            error = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        return {**base, "prompt_tokens": prompt_tokens, "status": error}
    n, ref_n, f, greedy = len(gen.tokens), len(ref_tokens), gen.forwards, spec.sampling.greedy
    timed_both = n > 1 and ref_n > 1  # a decode step on both sides (else a prefill against a prefill: no speedup)
    e2e = (n / times["total_s"]) / (ref_n / ref_times["total_s"]) if timed_both else ""
    return {**base, "prompt_tokens": len(prompt), "new_tokens": n, "forwards": f.verify, "tau": _blank(gen.tau),
            "tau_with_prefill": gen.tau_with_prefill, "tau_all": gen.tau_all,
            "mean_accept": sum(gen.accept_lengths) / max(1, len(gen.accept_lengths)), "prefill_forwards": f.prefill,
            "draft_forwards": f.draft, "aux_forwards": f.aux, "target_forwards": f.total, "target_tokens": f.tokens,
            "draft_model_forwards": gen.draft_model_forwards, "draft_model_params": gen.draft_model_params,
            "drafted": gen.drafted, "accepted": gen.accepted, **times, "tokens_per_s": n / times["total_s"],
            "verify_ms": 1000 * times["decode_s"] / f.verify if f.verify else "",
            "host_ms": _blank(gen.host_ms_per_step),  # outside model calls (fafo.decoding.decode)
            "peak_mem_mb": peak, "ref_peak_mem_mb": ref_peak,
            "mem_overhead_mb": peak - ref_peak if ref_peak is not None else "", "ref_new_tokens": ref_n,
            "ref_total_s": ref_times["total_s"], "ref_decode_s": ref_times["decode_s"], **(beside or {}),
            "speedup": e2e, "speedup_e2e": e2e,
            "speedup_decode": ((n - 1) / times["decode_s"]) / ((ref_n - 1) / ref_times["decode_s"])
            if timed_both else "",
            "exact_match": (mismatch == -1) if greedy else "", "first_mismatch": mismatch if greedy else "",
            "mismatch_kind": judged[0], "mismatch_gap": judged[1], "ref_source": ref_source, "seed": seed,
            "compiles": compiles, "threads": torch.get_num_threads(), "load": load_average(), "status": "ok"}


def _blank(x: float):
    return "" if x != x else x  # NaN (no decode step) as an empty cell
