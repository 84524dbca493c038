"""The Decoder contract every method implements, vanilla included.

A decoder is a dataclass whose fields are its hyperparameters (they become the Hydra schema; ``__post_init__``
validates them, so a bad value fails before any model is loaded). The runner builds it from config, calls
:meth:`Decoder.setup` once with the engine, then :meth:`Decoder.generate` per prompt. Decoders never time
themselves: ``clock.mark("prefill")`` is called when the prompt is processed and the runner does the timing.

Step-based methods (all of them) implement a :class:`StepState` and share :func:`decode`, the one loop that cuts
at EOS / max_new_tokens and counts: the target's forwards come from its engine's ledger
(:mod:`fafo.engine.ledger`), so tau means the same for every method. A method whose steps are split into the
forwards' inputs (:meth:`StepState.inputs`) and what is read from their logits (:meth:`StepState.outputs`) can also
decode many requests at once, one forward for the batch (:mod:`fafo.batch`); the others say why not in
:attr:`Decoder.batch_refusal`.

Cross-request state (what a method learns from earlier requests: SuffixDecoding's global tree, Token Recycling's
matrix, SWIFT's layer-set search) is named in :attr:`Decoder.cross_request_state`; the runner snapshots it so
that warm-up leaves no trace and every timing repeat of a sample starts from the same state.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch

from fafo.engine.batching import RowLogits, StepInputs, forward_one
from fafo.engine.cache import KVCache
from fafo.engine.engine import Engine
from fafo.engine.ledger import MODEL_TIME, ForwardCounts
from fafo.engine.model import ModelArgs
from fafo.engine.torch_compat import in_inference_mode
from fafo.sampling import Sampling


class Clock(Protocol):
    def mark(self, phase: str) -> None:
        """Record that ``phase`` (e.g. ``"prefill"``) just finished."""


class NullClock:
    def mark(self, phase: str) -> None:
        pass


@dataclass
class Generation:
    """What one generate call produced, with the counters every metric is computed from.

    Attributes:
        tokens: the new token ids (prompt excluded), ending at the first EOS or at max_new_tokens.
        accept_lengths: tokens committed by each decoding step (one verification forward each; prefill
            excluded), after the EOS / max_new_tokens cut: ``sum(accept_lengths) == len(tokens) - 1``.
        forwards: the target's forwards by kind (:class:`~fafo.engine.ledger.ForwardCounts`: prefill, verify,
            self-draft, aux) as its engine's ledger recorded them.
        draft_model_forwards: forwards of a separate draft model (TriForce's llama-68m, LongSpec's draft layer).
        draft_model_params: that draft model's parameter count (0: none).
        drafted: tokens proposed for verification over all steps (None: the method does not draft).
        accepted: proposed tokens that verification accepted (before the EOS / max_new_tokens cut).
        extras: method-specific diagnostics (pool sizes, retrieval budget, extra buffer bytes under
            ``buffer_bytes``...); counters that metrics read are the fields above, never keys here.
        host_s: seconds of the decode loop (after the first token) spent outside model calls: building steps,
            reading results, moving KV, drafting on the host (:data:`fafo.engine.ledger.MODEL_TIME`).
    """

    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    forwards: ForwardCounts = field(default_factory=ForwardCounts)
    draft_model_forwards: int = 0
    draft_model_params: int = 0
    drafted: int | None = None
    accepted: int | None = None
    extras: dict = field(default_factory=dict)
    host_s: float = 0.0

    @property
    def host_ms_per_step(self) -> float:
        """Host milliseconds per decoding step (NaN without a step)."""
        return 1000 * self.host_s / len(self.accept_lengths) if self.accept_lengths else math.nan

    @property
    def n_forwards(self) -> int:
        """Verification forwards of the target with its full cache (the decoding steps)."""
        return self.forwards.verify

    @property
    def tau(self) -> float:
        """Tokens committed per decoding step, prefill excluded (the FAFO paper's tau); NaN without a step."""
        return (len(self.tokens) - 1) / self.n_forwards if self.n_forwards else math.nan

    @property
    def tau_with_prefill(self) -> float:
        """New tokens per (verification forward + 1 for the prefill): the prefill's token counted as a step, as
        Spec-Bench's vanilla and Prompt Lookup scripts count it."""
        return len(self.tokens) / (self.n_forwards + 1)

    @property
    def tau_all(self) -> float:
        """New tokens per forward of the target's weights of any kind (prefill and self-drafts included)."""
        return len(self.tokens) / max(self.forwards.total, 1)


@dataclass
class Step:
    """What one decoding step proposes to commit.

    Attributes:
        tokens: accepted guesses then the bonus (or correction) token, before any EOS / max_new_tokens cut.
        drafted: guess tokens this step verified (None: the method does not draft).
        rows: rows of the step's forward whose KV the commit keeps, in commit order (a list or a 1-D integer
            array: a tree's accepted path, FAFO's current token and accepted candidate); empty when none move.
        queries: post-RoPE queries the step's forward returned (``[L, B, H_q, R, D]``), for a commit that
            re-selects a compressed cache with them (Quest, SnapKV, TriForce's rebuild); None: none captured.
    """

    tokens: list[int]
    drafted: int | None = None
    rows: Sequence[int] = ()
    queries: torch.Tensor | None = None

    @property
    def accepted(self) -> int:
        """Proposed tokens this step accepted: every token but the bonus (or correction)."""
        return len(self.tokens) - 1


class StepState(ABC):
    """One generation of a step-based method: prefill, then steps (propose + verify) and commits.

    :func:`decode` drives it and owns everything the methods share: the EOS / max_new_tokens cut, accept
    lengths, drafted / accepted counts and the forward ledger.

    A step is either :meth:`step` itself, or its two halves: :meth:`inputs` (the step's forwards, built on the
    host) and :meth:`outputs` (the step read from their logits), which :func:`fafo.batch.decode_batch` runs for
    every request of a batch around one forward per kind. A state of the latter kind reads and writes the cache
    only through ``self.cache`` (its own request's row) and knows where its committed KV ends
    (:meth:`live_slots`).
    """

    engine: Engine
    cache: KVCache

    @abstractmethod
    def prefill(self) -> int:
        """Process the prompt; return the first new token."""

    def step(self, remaining: int) -> Step:
        """One decoding step; ``remaining`` tokens may still be committed (the step's own token included)."""
        return self.outputs(remaining, forward_one(self.engine, self.cache, self.inputs(remaining)).row(0))

    def inputs(self, remaining: int) -> list[StepInputs]:
        """The step's forwards, in order (one; or a draft, then a verification)."""
        raise NotImplementedError(f"{type(self).__name__} implements step() whole")

    def outputs(self, remaining: int, logits: list[RowLogits]) -> Step:
        """The step, from its forwards' logits (``logits[i]``: the rows :meth:`inputs`'s i-th forward asked for)."""
        raise NotImplementedError(f"{type(self).__name__} implements step() whole")

    def live_slots(self) -> int:
        """Cache slots ``[0, n)`` holding KV this generation reads again (what moves with it to another row)."""
        return self.cache.max_len

    def commit(self, step: Step) -> None:
        """Keep ``step``'s committed tokens (only called when the generation goes on after it)."""

    def finish(self, tokens: list[int]) -> None:
        """Called once with the final tokens (e.g. to cache the output for later requests)."""

    def extras(self) -> dict:
        return {}

    def draft_model(self) -> tuple[int, int]:
        """(forwards, parameters) of a separate draft model used in this generation."""
        return 0, 0


#: callables run after each decoding step (its commit included): host-work probes (fafo.bench.tools.host_probe)
STEP_HOOKS: list = []


def decode(engine: Engine, state: StepState, max_new_tokens: int, eos_ids=(), clock: Clock | None = None) -> Generation:
    """The decode loop every step-based method shares (vanilla included); see :class:`StepState`.

    Host time: the loop's wall time after the first token minus the time inside model calls
    (:data:`~fafo.engine.ledger.MODEL_TIME`), read once the loop has ended."""
    clock = clock or NullClock()
    start = engine.ledger.mark()
    tokens, finished = truncate_at_stop([state.prefill()], max_new_tokens, eos_ids)
    clock.mark("prefill")
    wall0, model0 = time.perf_counter(), MODEL_TIME.seconds
    accept_lengths: list[int] = []
    drafted = accepted = None
    while not finished:
        step = state.step(max_new_tokens - len(tokens))
        if step.drafted is not None:
            drafted = (drafted or 0) + step.drafted
            accepted = (accepted or 0) + len(step.tokens) - 1
        new, finished = truncate_at_stop(step.tokens, max_new_tokens - len(tokens), eos_ids)
        tokens += new
        accept_lengths.append(len(new))
        if not finished:
            state.commit(step)
        for hook in STEP_HOOKS:
            hook()
    state.finish(tokens)
    host_s = time.perf_counter() - wall0 - (MODEL_TIME.seconds - model0)
    n_draft, params = state.draft_model()
    return Generation(tokens, accept_lengths, engine.ledger.mark() - start, n_draft, params, drafted, accepted,
                      state.extras(), host_s)


@dataclass(frozen=True)
class Buffers:
    """What a decoder holds on the device besides the weights, estimated from the target's config alone
    (``bench.plan``): ``kept`` across generations (draft models, 4-bit weights, retrieval caches, adjacency
    matrices), ``transient`` only while it generates; and whether it ``uses_engine_cache`` (the shared static cache)
    or ``releases_engine_cache`` when it starts (QuantSpec's INT8 verifier, eager)."""

    kept: int = 0
    transient: int = 0
    uses_engine_cache: bool = True
    releases_engine_cache: bool = False


@dataclass
class Decoder(ABC):
    """Base class of all decoding methods."""

    #: attributes holding what the method learns across requests (restored by :meth:`restore`)
    cross_request_state: ClassVar[tuple[str, ...]] = ()
    #: why the method's forwards cannot run as compiled steps ("" when they can; forwards that skip layers run
    #: eagerly regardless); with ``bench.compile`` the runner then times the method eagerly against the compiled
    #: vanilla every method races, an eager vanilla timed beside it, and the summary says why
    eager_forwards: ClassVar[str] = ""
    #: why the method cannot decode several requests at once ("" when it can: it implements :meth:`new_state`
    #: with a :class:`StepState` split into inputs and outputs); checked before a model loads (fafo.batch)
    batch_refusal: ClassVar[str] = "its steps are not split into a batched forward's inputs and outputs"

    def __init_subclass__(cls, **kwargs):
        """Every method's :meth:`generate` runs in inference mode, its prefill, steps, drafts and commits as its
        forwards do (:meth:`Engine.forward`): torch then skips autograd's dispatch and the views' version tracking
        on every op outside the forwards too (on a CPU, 3-14 % of most methods' host time per step). What a
        generation leaves for later ones stays writable: the engine allocates caches as normal tensors
        (:meth:`Engine.new_cache`), and a restored snapshot is a copy made outside the mode."""
        super().__init_subclass__(**kwargs)
        if "generate" in cls.__dict__:
            cls.generate = in_inference_mode(cls.__dict__["generate"])

    def snapshot(self) -> dict:
        """A copy of the cross-request state (cheap when the method has none)."""
        return {name: copy.deepcopy(getattr(self, name, None)) for name in self.cross_request_state}

    def restore(self, snapshot: dict) -> None:
        """Return to a :meth:`snapshot` (which stays reusable)."""
        for name, value in snapshot.items():
            setattr(self, name, copy.deepcopy(value))

    def release(self) -> None:
        """Forget everything loaded or learnt since construction (draft models, caches, cross-request state):
        the decoder is as :meth:`__init__` left it. The runner calls it when a run ends, so the next method of a
        comparison or the next job of a sweep starts on a clean device."""
        fresh = dataclasses.replace(self)
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    def setup(self, engine: Engine) -> None:
        """Called once per run, before any generate (state that persists across samples lives here)."""

    def warm_shapes(self, engine: Engine) -> None:
        """Called after each warm-up generation on a compiled engine: run a forward of every step shape this method
        can take under ``engine.static_shapes`` that a generation may not reach (its graphs then compile and record
        before any timed sample). None beyond what generations take by default."""

    def held_bytes(self) -> int:
        """Device bytes this decoder keeps allocated between its generations (draft weights, caches it reuses):
        the runner leaves them out of the *other* decoder's CUDA peak memory, which decodes while they sit there
        (:class:`fafo.bench.timing.PeakMemory`). None by default."""
        return 0

    def engines(self, engine: Engine) -> list[Engine]:
        """The engines this method runs forwards on after :meth:`setup` with ``engine``: the target, then any
        draft model's (what a probe of the whole method must watch)."""
        return [engine]

    def check_sampling(self, sampling: Sampling) -> None:
        """Raise ConfigError if this method cannot decode with ``sampling`` (checked before loading a model)."""

    def check_target(self, hf_config, tokenizer, weights: bool = True) -> None:
        """Raise ConfigError if this method cannot run on the target model (e.g. a draft model with another
        vocabulary). Called with the target's transformers config and tokenizer before any weights are loaded;
        ``weights=False`` (``bench.plan`` on config-only checkpoints): check a draft's config, not its weight files."""

    def forward_tokens(self) -> tuple[int, ...] | None:
        """Tokens in each target forward of one decode step ((1,) for vanilla), or None where it varies (drafts).
        The run summary reports their sum as ``tokens_per_forward`` and, given ``bench.cost_curve``, the
        break-even tau (:mod:`fafo.bench.tools.cost_curve`)."""
        return None

    def extra_slots(self, max_new_tokens: int) -> int:
        """Cache slots this method needs beyond ``prompt + max_new_tokens`` (scratch for drafts, windows...)."""
        return 0

    def plan_bytes(self, args: ModelArgs, slots: int, nbytes: int, compiled: bool) -> Buffers:
        """The device memory this method adds to a target of architecture ``args`` whose shared cache has
        ``slots`` slots, at ``nbytes`` per value (``compiled``: steps compiled, the shared cache allocated up
        front); what ``bench.plan`` adds up before any weight loads. None beyond the shared cache by default."""
        return Buffers()

    def new_state(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = (),
                  sampling: Sampling | None = None, generator=None, cache: KVCache | None = None) -> StepState:
        """One generation's state, on ``cache`` (a batch row: :meth:`KVCache.row`) or the engine's shared cache."""
        raise NotImplementedError(f"{type(self).__name__}: {self.batch_refusal}")

    @abstractmethod
    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = (),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after any of ``eos_ids``."""


def truncate_at_stop(tokens: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], bool]:
    """Cut a committed run at the first EOS (kept) or at max_new_tokens; returns (tokens, finished)."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens
