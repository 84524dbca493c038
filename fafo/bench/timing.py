"""Timing and memory measurement: device sync + perf_counter, peak memory per generation."""

from __future__ import annotations

import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class SyncClock:
    """The runner's clock: ``start()``, decoders call ``mark("prefill")``, ``stop()``; every read syncs the device.

    Attributes after stop: ``prefill_s`` (prompt processing and first token), ``decode_s`` (the rest), ``total_s``.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: dict[str, float] = {}

    def start(self) -> None:
        sync(self.device)
        self.marks = {}
        self.t0 = time.perf_counter()

    def mark(self, phase: str) -> None:
        sync(self.device)
        self.marks[phase] = time.perf_counter()

    def stop(self) -> None:
        sync(self.device)
        self.t1 = time.perf_counter()
        t_prefill = self.marks.get("prefill", self.t0)
        self.prefill_s = t_prefill - self.t0
        self.decode_s = self.t1 - t_prefill
        self.total_s = self.t1 - self.t0


class PeakMemory:
    """Peak memory of one generation in MB.

    CUDA: ``reset_peak_memory_stats`` before, ``max_memory_allocated`` after. CPU (no allocator statistics): the
    bytes of the engine's tensors the method used, i.e. weights + the static cache + the extra buffers the method
    reports in ``Generation.extras["buffer_bytes"]``.
    """

    def __init__(self, device: torch.device):
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self, engine, extras: dict) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        cache = engine._cache.nbytes if engine._cache is not None else 0
        return (engine.weights_nbytes + cache + int(extras.get("buffer_bytes", 0))) / 2**20
