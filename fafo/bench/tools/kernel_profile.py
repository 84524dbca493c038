"""Where a decode forward's time goes: device time per forward by kind of kernel, from ``torch.profiler``.

A compiled one-token forward of a 7B model should take about its weight bytes over the memory bandwidth; the GPU
self-check measures how far it is from that floor (:mod:`fafo.bench.gpu_check.decode`), and this says why. Over
``calls`` back-to-back forwards (warmed: compiled and, under CUDA graphs, recorded, so the replays' kernels are
what is profiled), every device event (kernels, copies, fills) is summed by kind:

* **matrix products**: cuBLAS / CUTLASS matrix-vector and matrix-matrix kernels, the weight reads; their time
  against the weights' bytes is the bandwidth the linear layers reach;
* **attention**: FlexAttention's Triton templates (and any other attention kernel);
* **fused element-wise and reductions**: inductor's Triton kernels around them (norms, rotary, SiLU, residuals,
  the KV write);
* **copies and fills**, **other**;

then **idle**: wall time per forward minus the device's busy time (launch gaps inside a graph, the host's work
between replays). On a CPU the same accounting runs over the ATen operators' own (self) time, for tests.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import torch

KINDS = (
    ("matrix products", re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitk|aten::(mm|addmm|bmm)$")),
    ("attention", re.compile(r"flex|attention|triton_tem")),
    ("fused element-wise and reductions", re.compile(r"triton_(poi|red|per)|elementwise|reduce|aten::")),
    ("copies and fills", re.compile(r"memcpy|memset|copy|fill")),
)


def kind_of(name: str) -> str:
    """The kind of a kernel (or, on a CPU, an ATen operator) by its name; the first pattern that matches wins,
    except that copies are told apart from ATen's other operators first."""
    low = name.lower()
    if re.search(r"memcpy|memset|aten::(copy_|fill_|zero_|index_copy_|index_put_)", low):
        return "copies and fills"
    return next((kind for kind, pattern in KINDS if pattern.search(low)), "other")


def profile_forward(fn, calls: int, device: torch.device) -> dict:
    """Profile ``calls`` back-to-back calls of ``fn`` (already warmed). Returns ``{"wall_ms", "busy_ms",
    "idle_ms", "kinds": {kind: {"events", "ms"}}}``, every figure per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize(device)
    # acc_events: one cycle either way; torch 2.11's prepare_trace (torch/profiler/profiler.py) creates its profiler
    # before asking whether one exists, so without it every first profile warns that events of earlier cycles are
    # dropped (there are none; later torch asks first)
    with profile(activities=activities, acc_events=True) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    kinds: dict[str, dict] = defaultdict(lambda: {"events": 0, "ms": 0.0})
    for e in prof.events():
        if cuda and e.device_type != DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us() if cuda else e.self_cpu_time_total
        if us <= 0:
            continue
        k = kinds[kind_of(e.name)]
        k["events"] += 1 / calls
        k["ms"] += us / 1e3 / calls
    busy = sum(k["ms"] for k in kinds.values())
    return {"wall_ms": wall_ms, "busy_ms": busy, "idle_ms": max(0.0, wall_ms - busy), "kinds": dict(kinds)}


def profile_rows(profile: dict, weight_bytes: int) -> list[dict]:
    """The profile as table rows (kind, events and ms per forward, share of the wall time), matrix products with
    the bandwidth their weight reads reach, idle last."""
    wall = profile["wall_ms"]
    if not profile["kinds"]:
        return [{"kind": "no device event recorded", "events": 0, "ms": "", "share": "",
                 "note": f"wall {wall:.3f} ms per forward; the profiler saw no kernel (CUPTI unavailable?)"}]
    rows = []
    for kind, _ in KINDS + (("other", None),):
        k = profile["kinds"].get(kind)
        if k:
            gbs = f"{weight_bytes / k['ms'] / 1e6:.0f} GB/s of weights" if kind == "matrix products" else ""
            rows.append({"kind": kind, "events": round(k["events"], 1), "ms": round(k["ms"], 4),
                         "share": f"{k['ms'] / wall:.0%}", "note": gbs})
    rows.append({"kind": "idle (launch gaps, host)", "events": "", "ms": round(profile["idle_ms"], 4),
                 "share": f"{profile['idle_ms'] / wall:.0%}", "note": f"wall {wall:.3f} ms per forward"})
    return rows
