"""Probe: which part of a compiled step leaves eager's tokens on a GPU? One variant of the step per process.

When the GPU self-check's correctness stage finds a method diverging from eager, this reruns such cases on one of
its small models (``GROUP``, default 4) under one change to the compiled step (``VARIANT``), so that several
variants run side by side in one call of a short lease and the change that restores the tokens names the cause:

    control     as the runner compiles it
    nocg        no CUDA graphs (torch.compile mode "default")
    exactmask   each step's tree mask as its own BlockMask (not the reused buffer of the compiled step)
    syncupload  host inputs copied to the device without pinned, non-blocking copies
    fp32        float32 weights and activations
    eagerflex   no compiled step: eager FlexAttention steps (their block masks from fafo.engine.flex_masks)
    decoding    steps of 2-127 rows on FlexAttention's decoding template wherever it has a kernel (query rows x
                group <= 128), instead of the main template (fafo.engine.flex_routing, rule 2): whether that
                template, which splits the keys, is token-identical through a whole model

    VARIANT=nocg GROUP=4 python scripts/gpu_tree_probe.py [METHOD ...]     (CUDA; a CPU traces the CUDA path)

On an NVIDIA H200 (torch 2.11.0+cu130, 2026-11-27) it found the cause of Token Recycling, SuffixDecoding, SWIFT,
FAFO-2forward and SAM diverging: none of these variants restored their tokens, one more did (a compiled step's
prefix read in one call instead of in chunks), and the chunked read was removed (docs/performance.md, "The
acceptance run: NVIDIA H200, 2026-11-27").
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

METHODS = ["token_recycling", "swift", "fafo_2forward", "suffix_decoding", "sam_decoding", "prompt_lookup"]
VARIANTS = ("control", "nocg", "exactmask", "syncupload", "fp32", "eagerflex", "decoding")


def sync_upload(values, device, dtype=torch.long):
    """:func:`fafo.engine.upload.upload` without pinned memory or non-blocking copies: one copy per value."""
    device, out, moved = torch.device(device), list(values), False
    for i, v in enumerate(values):
        if v is None or (isinstance(v, torch.Tensor) and v.device == device):
            continue
        a = v.cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(list(v) if isinstance(v, range) else v)
        t = torch.from_numpy(np.ascontiguousarray(a).astype(np.int64)).to(device)
        out[i], moved = (t.bool() if a.dtype == np.bool_ else t.to(dtype)), True
    return out if moved else values


def decoding_route(route):
    """``fafo.engine.flex_routing.flex_route`` with rule 2 lifted: a static step of 2-127 rows takes the decoding
    template (the group padded to a power of two, as rule 3 pads one-row steps) where its default BLOCK_M fits the
    query block; elsewhere the engine's rule."""
    from fafo.engine.flex_routing import SHORT_QUERY, FlexRoute, default_block_m, next_power_of_2

    def lifted(q_len, hq, hkv, q_block=128, static=True):
        group = next_power_of_2(hq // hkv)
        if static and 1 < q_len < SHORT_QUERY and q_block % default_block_m(q_len, group) == 0:
            return FlexRoute("decoding", hkv * group, {})
        return route(q_len, hq, hkv, q_block, static)

    return lifted


def apply(variant: str, settings) -> None:
    """Change the compiled step as ``variant`` says (module attributes patched in this process only)."""
    from fafo import tree
    from fafo.engine import attention, block_masks, compiled, engine
    from fafo.engine.compiled import CompileOptions

    if variant == "nocg":
        settings.compile = CompileOptions(mode="default", backend=settings.compile.backend, attention="auto")
    elif variant == "exactmask":
        buffered = compiled.CompiledStep._step_block_mask

        def exact(self, plan, Q, dev):
            if plan.step_mask is None or plan.step_block_mask is not None:
                return buffered(self, plan, Q, dev)
            return block_masks.step_block_mask(plan.step_mask.clone())

        compiled.CompiledStep._step_block_mask = exact
    elif variant == "syncupload":
        engine.upload = tree.upload = sync_upload
    elif variant == "fp32":
        settings.dtype = "float32"
    elif variant == "decoding":
        attention.flex_route = decoding_route(attention.flex_route)
    elif variant not in VARIANTS:
        raise SystemExit(f"VARIANT={variant!r} is not one of {', '.join(VARIANTS)}")


def main() -> int:
    from fafo.bench.gpu_check.correctness import GroupModel, run_case
    from fafo.bench.gpu_check.settings import settings_for

    variant, group = os.environ.get("VARIANT", "control"), int(os.environ.get("GROUP", "4"))
    methods = sys.argv[1:] or METHODS
    settings = settings_for("cuda" if torch.cuda.is_available() else "cpu", quick=False, groups=[group])
    apply(variant, settings)
    model = GroupModel(group, settings, Path(tempfile.mkdtemp()), methods)
    if variant == "eagerflex":
        model.compiled.release()
        model.compiled.backend = "flex"
    for name in methods:
        try:
            row = run_case(model, name, settings)
            print(f"[{variant} g{group}] {name}: {row['status']} identical {row['identical']}/{row['generations']} "
                  f"recompiles {row['recompiles']} {row['note'][:160]}", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(f"[{variant} g{group}] {name}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
            if variant != "eagerflex":
                model.compile(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
