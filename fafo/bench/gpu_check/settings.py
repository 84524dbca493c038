"""What the check runs on a device: sizes, budgets, and the compiled configuration of the runner there.

On CUDA everything is the real thing: the runner's defaults (``bench.compile=auto``: ``torch.compile`` mode
``reduce-overhead`` with CUDA graphs, inductor, compiled FlexAttention; float16), a Llama-2-7B-shaped model,
contexts 512 and 4096. On a CPU (``--device cpu``) the same code runs at toy sizes, with the compiled path CUDA
takes traced by ``aot_eager`` (FlexAttention's block masks and static plans, no code generation), so every stage
is known to work before it meets a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fafo.engine.compiled import CompileOptions

# seconds per stage on one H100 from a cold start; the sum (430 s) leaves 50 s of the 8 minutes for installing
# the wheels, importing torch and a stage's grace past its deadline (fafo.bench.gpu_check.stages)
BUDGETS = {"preflight": 20, "correctness": 150, "decode": 90, "curve": 70, "methods": 45, "cli": 55}
STAGES = tuple(BUDGETS)
# GQA groups of the correctness models, in order of value: Llama-3 (4: tree steps of more than 128 rows x group),
# Qwen2.5-7B (7: not a power of two), Llama-2 / Vicuna (1: MHA), the embedded model (3)
GROUPS = (4, 7, 1, 3)


@dataclass
class Settings:
    """Everything a stage reads (see :func:`settings_for`)."""

    device: torch.device
    dtype: str
    compile: CompileOptions
    quick: bool
    groups: tuple[int, ...] = GROUPS
    methods: tuple[str, ...] | None = None  # None: every draftless method (fafo.bench.gpu_check.methods)
    timed_methods: tuple[str, ...] | None = None  # stage 4's; None: as ``methods``
    max_new: int = 32
    # stage 2's batched cases: these methods decode every prompt as one static batch of batch_size requests
    batch_methods: tuple[str, ...] = ("vanilla", "prompt_lookup", "token_recycling", "fafo_stream")
    batch_size: int = 4
    big_shape: str = "llama2-7b"
    decode_contexts: tuple[int, ...] = (512, 4096)
    decode_new: int = 64
    rounds: int = 3
    curve_contexts: tuple[int, ...] = (512, 4096, 2048)
    # in order of value: vanilla's 1, FAFO's default 481, 64; then 16 and 2 (the draftless methods' chains of a few
    # tokens: without a multi-row point below 64 they are priced at 64's cost, fafo.bench.tools.cost_curve), the
    # shapes methods use, the grid's ends last
    curve_steps: tuple[int, ...] = (1, 481, 64, 16, 2, 128, 32, 8, 120, 256, 512, 4)
    # then forwards of several rows at once (bench.batch_size), at the first context only, after every step above
    curve_batches: tuple[int, ...] = (4, 16)
    curve_batch_steps: tuple[int, ...] = (1, 64)
    # past every FAFO preset's budget (StreamingLLM 760, Quest 1024, SnapKV 1280 entries), so that their regions
    # evict and swap as at long context; TriForce's retrieval budget (4096) still holds the whole prompt
    method_prompt: int = 2048
    method_new: int = 64
    # stage 4 on the big shape's widths with this many layers (None: all): a method's host time per step does not
    # grow with the depth (tests/test_host_work.py), its compiles shrink with it
    method_layers: int | None = None
    cli_samples: int = 2
    cli_new: int = 32
    budgets: dict[str, float] = field(default_factory=lambda: dict(BUDGETS))

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def compile_label(self) -> str:
        c = self.compile
        return f"{c.mode}/{c.backend}/{c.attention_for(self.device)}"


def settings_for(device: str, quick: bool, budget_s: float | None = None, backend: str | None = None,
                 groups=None, methods=None, method_layers: int | None = None) -> Settings:
    """The check's settings on ``device``: CUDA's full sizes, a CPU's toy ones; ``quick`` trims either further.
    ``budget_s`` scales every stage's budget so they sum to it; ``backend`` overrides the compile backend;
    ``method_layers`` times stage 4 on that many layers of the big shape."""
    dev = torch.device(device)
    if dev.type == "cuda":
        options = CompileOptions(mode="reduce-overhead", backend=backend or "inductor", attention="auto")
        s = Settings(dev, "float16", options, quick)
        if quick:
            s.groups, s.curve_contexts, s.rounds = (4, 7), (512, 4096), 2
            s.curve_steps = (1, 481, 64, 128, 512)
    else:  # toy sizes: the CUDA path traced on the CPU (inductor cannot lower FlexAttention's lse output there)
        attention = "auto" if backend == "inductor" else "flex"
        options = CompileOptions(mode="default", backend=backend or "aot_eager", attention=attention)
        s = Settings(dev, "float32", options, quick, big_shape="llama2-7b-toy", decode_contexts=(64, 256),
                     decode_new=16, rounds=2, curve_contexts=(64, 256), curve_steps=(1, 8, 64), curve_batches=(2,),
                     curve_batch_steps=(1, 8), method_prompt=1400,
                     method_new=16, max_new=24, cli_new=16)
        if quick:  # about a minute and a half on 2 CPU cores: group 4 (tree steps over 128 rows x group)
            s.rounds, s.max_new, s.decode_new, s.groups = 1, 16, 8, (4,)
            s.timed_methods = ("vanilla", "fafo_stream", "lookahead", "token_recycling")
            s.batch_methods = ("vanilla", "token_recycling")
    if groups:
        s.groups = tuple(groups)
    if methods:
        s.methods = s.timed_methods = tuple(methods)
    s.method_layers = method_layers
    if budget_s:
        total = sum(BUDGETS.values())
        s.budgets = {k: v * budget_s / total for k, v in BUDGETS.items()}
    return s
