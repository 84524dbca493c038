"""Probe: which of inductor's FlexAttention templates compute a multi-row GQA step right, for which masks?

Left to torch, a step of 2..127 queries under a power-of-two GQA group takes the flex-decoding template on CUDA;
the engine sends such steps to the main template instead (``fafo.engine.flex_routing``, rule 2), because on an
NVIDIA H200 with torch 2.11.0+cu130 this probe found the decoding template wrong (relative error 0.76-0.86) for
causal steps of 11 and 40 rows at group 4, whether q, k and v were views or dense copies. The main template does
not split the keys, which costs short steps 2-3 ms at 4k of context on an H100 at 7B; if the decoding template is
right for masks that never read the query index (a step's prefix part), that part could take it. Each row compiles
one call (shape x mask x template: torch's choice, the decoding template with 16-row blocks, the main template as
the control: a probe whose main-template rows fail is itself wrong) and compares it with float64 attention on the
same inputs. It also times the decode-shaped matrix-vector products of a 7B model through cuBLAS in one CUDA graph
(the bandwidth a one-token step's weight reads can reach) against a device-to-device copy.

    python scripts/gpu_flex_probe.py            (CUDA only; about a minute)
"""

from __future__ import annotations

import itertools
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fafo.engine.flex_routing import default_block_m
from fafo.engine.torch_compat import main_template_option


def visible(kind: str, Q: int, K: int, device) -> torch.Tensor:
    """[Q, K] bool: ``causal`` (the last Q keys are the queries', as in a step), or ``length`` (every query sees the
    first K - 7 keys, whatever its row: the prefix part of a step, whose mask_mod never reads q_idx)."""
    if kind == "causal":
        return torch.ones(Q, K, dtype=torch.bool, device=device).tril(K - Q)
    return (torch.arange(K, device=device) < K - 7).expand(Q, K)


def reference(q, k, v, scale, mask):
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = (q.double() @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def step(q, k, v, block_mask, options: dict):
    return flex_attention(q, k, v, block_mask=block_mask, scale=q.shape[-1] ** -0.5, enable_gqa=True,
                          kernel_options=options or None)


def template_options(q_len: int, group: int) -> dict:
    """kernel_options per template: torch's own choice (decoding; BLOCK_M = 128 where its default has no config),
    the decoding template with 16-row blocks (several query blocks per KV head), and the main template, forced, as
    the engine issues such steps."""
    decoding = {} if default_block_m(q_len, group) <= 128 else {"BLOCK_M": 128}
    return {"decoding": decoding, "decoding BLOCK_M 16": {"BLOCK_M": 16}, "main": main_template_option()}


def cases(dev) -> list[tuple]:
    """Each shape x mask x template, compiled alone, against float64. Whether the decoding template's error on
    multi-row steps (found on an H200) comes from masks that read the query index (``causal``) or also hits masks
    that do not (``length``: the prefix part of a step, which could then take the split-over-keys kernel)."""
    rows = []
    torch._dynamo.config.recompile_limit = 256
    for (hq, hkv, d, Q), kind in itertools.product([(8, 2, 16, 11), (32, 8, 128, 11), (8, 2, 16, 40),
                                                    (8, 1, 16, 11)], ["causal", "length"]):
        K = Q if kind == "causal" else 300
        mask = visible(kind, Q, K, dev)
        bm = create_block_mask(lambda b, h, qi, ki: mask[qi, ki], None, None, Q, K, device=dev)
        q = torch.randn(1, hq, Q, d, device=dev, dtype=torch.float16)
        k, v = (torch.randn(1, hkv, K, d, device=dev, dtype=torch.float16) for _ in range(2))
        ref = reference(q, k, v, d ** -0.5, mask)
        for template, options in template_options(Q, hq // hkv).items():
            fn = torch.compile(step, fullgraph=True, dynamic=False)
            label = (hq, hkv, d, Q, K, kind, template)
            try:
                out = fn(q, k, v, bm, options)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                rows.append((*label, f"{err:.2e}", "ok" if err < 1e-2 else "WRONG"))
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                rows.append((*label, "-", f"error {type(e).__name__}"))
            print(*rows[-1], flush=True)
    return rows


def gemv_bandwidth(dev) -> list[tuple]:
    """One decode token's matrix-vector products of a 32-layer Llama-2-7B (fp16), replayed in a CUDA graph."""
    shapes = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]
    weights = [torch.randn(o, i, device=dev, dtype=torch.float16) * 0.01 for _ in range(32) for o, i in shapes]
    nbytes = sum(w.numel() * 2 for w in weights)
    x = {i: torch.randn(1, i, device=dev, dtype=torch.float16) for i in (4096, 11008)}

    def token():
        for w in weights:
            torch.nn.functional.linear(x[w.shape[1]], w)

    token()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        token()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    ms = sorted(times)[len(times) // 2]
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        dst.copy_(src)
    b.record()
    torch.cuda.synchronize()
    copy = 2 * src.numel() * 10 / (a.elapsed_time(b) / 1e3) / 1e9
    return [("gemv 7B token", f"{nbytes / 1e9:.2f} GB", f"{ms:.3f} ms", f"{nbytes / ms / 1e6:.0f} GB/s",
             f"copy {copy:.0f} GB/s", f"{nbytes / ms / 1e6 / copy:.2f} of copy")]


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = cases(dev)
    bw = gemv_bandwidth(dev)
    print("\n| Hq | Hkv | D | Q | K | mask | template | rel. error vs float64 | verdict |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    for r in bw:
        print(" ".join(r))
    return int(any(r[-1] != "ok" for r in rows))


if __name__ == "__main__":
    sys.exit(main())
