"""Stage 1: what the machine is, and whether its first kernels run.

Versions (Python, torch, CUDA, transformers, the GPU and its driver), which optional packages are importable, the
device-to-device copy bandwidth (the roofline of stage 3), and one compiled FlexAttention call through a BlockMask
whose mask_mod reads a live length from a tensor (torch's own API: the engine's masks are stage 2's business),
checked against SDPA.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib.util import find_spec

import torch
import torch.nn.functional as F

from fafo.bench.tools.engine_timing import copy_bandwidth, device_name

OPTIONAL = ("hydra", "omegaconf", "wandb", "gguf", "bayes_opt", "datasets", "triton")


def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def versions(device: torch.device) -> dict:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda or "-",
            "transformers": transformers.__version__, "device": device_name(device), "cpu_count": os.cpu_count(),
            "executable": sys.executable}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(driver=driver_version(), gpu_memory_gb=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count)
    info["installed"] = ", ".join(m for m in OPTIONAL if find_spec(m) is not None) or "-"
    info["missing"] = ", ".join(m for m in OPTIONAL if find_spec(m) is None) or "-"
    return info


def flex_probe(settings) -> dict:
    """One BlockMask (4 queries over 1024 slots, the first 700 live: a mask_mod reading the length from a tensor,
    as compiled decode steps do) and one compiled FlexAttention call (8 query heads over 2 KV heads) through it,
    against SDPA over the live slots."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dev, dtype = settings.device, torch.float16 if settings.cuda else torch.float32
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 64, generator=gen).to(dev, dtype) for h, n in ((8, 4), (2, 1024), (2, 1024)))
    length = torch.tensor([700], device=dev)
    t0 = time.perf_counter()
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx < length[0], None, None, 4, 1024, device=dev)
    build_s = time.perf_counter() - t0
    fn = torch.compile(flex_attention, backend=settings.compile.backend, dynamic=False, fullgraph=True)
    t0 = time.perf_counter()
    out = fn(q, k, v, block_mask=mask, enable_gqa=True)
    torch.cuda.synchronize(dev) if settings.cuda else None
    call_s = time.perf_counter() - t0
    ref = F.scaled_dot_product_attention(q.float(), k[:, :, :700].float(), v[:, :, :700].float(), enable_gqa=True)
    err = float((out.float() - ref).abs().max())
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    return {"mask_build_s": round(build_s, 3), "first_call_s": round(call_s, 2), "max_abs_err": err, "tol": tol,
            "ok": err <= tol}


def preflight_stage(budget, result, settings, state) -> None:
    info = state.versions = versions(settings.device)
    state.bandwidth = copy_bandwidth(settings.device)
    info["copy_bandwidth_gb_s"] = round(state.bandwidth / 1e9, 1)
    result.summary = (f"{info['device']}, torch {info['torch']}, CUDA {info['cuda']}, "
                      f"copy {state.bandwidth / 1e9:.0f} GB/s")
    result.sections.append("| item | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in info.items()))
    probe = flex_probe(settings)  # an exception here fails the stage, the versions above stay in the report
    result.sections.append("Compiled FlexAttention probe: " + ", ".join(f"{k} {v}" for k, v in probe.items()))
    if not probe["ok"]:
        result.failed_checks.append(f"compiled FlexAttention differs from SDPA by {probe['max_abs_err']:.3g} "
                                    f"(> {probe['tol']})")
    result.summary += f", compiled flex {'ok' if probe['ok'] else 'WRONG'} ({probe['first_call_s']} s)"
