"""SLURM time limits for the paper presets' jobs (``hydra.launcher.timeout_min`` of ``hydra/launcher=slurm``).

A limit is twice the estimated A100 time of the preset's longest job, at least 1 h and at most 24 h (a common
cluster maximum). The estimates follow docs/reproduce.md's assumptions: generated tokens (generations x an assumed
average length) over an assumed vanilla speed (35 tokens/s for 7-8B models, 13 for 32B, SCBench's 128k prefill
about 25 s per turn) for the vanilla reference timed beside each sample, plus the same over the paper's speedup for
the method, plus 5 minutes of loading and warm-up. A job longer than its limit is not lost: SLURM signals it
``signal_delay_s`` before the limit, it stops at a sample boundary and submitit requeues it (``max_num_timeout``
times); the requeued job resumes from its records (fafo.bench.tools.preempt, fafo.bench.tools.slurm).
"""

from __future__ import annotations

import math

from omegaconf import OmegaConf

DEFAULT_MINUTES = 1440  # a run that is no paper preset, or a preset without an estimate
MIN_MINUTES, MAX_MINUTES = 60, 1440

# preset -> estimated hours of its longest job on one A100 (docs/reproduce.md, "Presets")
LONGEST_JOB_HOURS = {
    "table1": 1.0,      # MT-Bench 160 x 400 tokens, Llama-2-7b: 0.5 h vanilla + the method
    "table2": 9.5,      # GSM8K 1319 x 200 tokens on Qwen2.5-32B at 13 tokens/s + the method
    "table3": 1.2,      # LongBench multi_news 200 x 400 tokens, Llama-3.1-8B
    "table4": 9.5,      # Table 2's tasks, sampled
    "table5": 4.0,      # AIME24 30 x 10k tokens, 7-8B
    "table6": 38.0,     # Multi-IF 4501 rows x 3 turns (English only: ~5 h): continues after requeues
    "table7": 9.0,      # SCBench at 128k, per task
    "table8": 23.0,     # Multi-IF with FAFO-SnapKV
    "table9": 0.3,      # NarrativeQA 20 books x 256 tokens
    "table10": 0.4,     # PG-19 100 x 256 tokens
    "table11": 0.5,
    "table12": 0.5,
    "table13": 34.0,    # Multi-IF, one budget per job
    "figure1": 0.5,
    "specbench": 0.9,   # Spec-Bench 480 questions, Vicuna-7B
}


def slurm_minutes(preset: str | None) -> int:
    """The time limit in minutes for a job of ``preset`` (``paper.table``), see the module docstring."""
    hours = LONGEST_JOB_HOURS.get(str(preset)) if preset else None
    if hours is None:
        return DEFAULT_MINUTES
    return int(min(MAX_MINUTES, max(MIN_MINUTES, math.ceil(2 * hours * 60 / 30) * 30)))


# used by conf/hydra/launcher/slurm.yaml: timeout_min: ${fafo_slurm_minutes:${oc.select:paper.table,null}}
OmegaConf.register_new_resolver("fafo_slurm_minutes", slurm_minutes, replace=True)
