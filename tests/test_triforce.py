"""TriForce (method configs triforce*): lossless, the retrieval cache equals a brute-force recomputation of the
official selection, the draft's StreamingLLM cache holds what it should, extras and memory are reported."""

import pytest
import torch

from baselines.triforce import TriForceDecoder, TriForceState
from baselines.triforce_cache import StreamingDraft
from baselines.vanilla import VanillaDecoder
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.engine.attention import causal_plan
from fafo.engine.tiny import tiny_checkpoint
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from tests.lossless import LONG_PROMPTS as LONG, PROMPTS, assert_lossless
from tests.helpers import DRAFT_SPEC, ReadsOnTheHost, make_cfg
from tests.methods import TRIFORCE_SMALL

SMALL = TRIFORCE_SMALL  # draft window: 24 - 4 - gamma2 tokens


@pytest.fixture(scope="session")
def draft_path(ckpt_root):
    return str(tiny_checkpoint(DRAFT_SPEC, cache_dir=ckpt_root))


CASES = {  # name: (target, prompts, decoder kwargs without the draft, with a draft)
    "mha-g1": ("llama_mha", LONG, dict(SMALL, gamma1=1), True),
    "gqa-g2": ("llama_gqa", LONG, dict(SMALL, gamma1=2), True),
    "qwen2-g2-max": ("qwen2_gqa", LONG, dict(SMALL, gamma1=2, gqa_reduce="max"), True),
    "short-prompts-g1": ("llama_gqa", PROMPTS, dict(SMALL, budget=64, gamma1=1), True),  # budget > prompt: clamped
    "fewer-than-2-chunks": ("llama_mha", PROMPTS, dict(SMALL, budget=32, chunk_size=16), True),  # 2nd: full cache
    "nodraft": ("llama_mha_rep", LONG, dict(SMALL, gamma2=4), False),
    "rebuild": ("qwen2_gqa_rep", LONG, dict(SMALL, gamma1=2, rebuild_interval=2), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_token_identical_to_vanilla_greedy(case, engine, draft_path):
    name, prompts, kw, with_draft = CASES[case]
    method = TriForceDecoder(**kw, draft={"path": draft_path} if with_draft else None)
    assert_lossless(method, engine(name), prompts=prompts)


def fresh_queries(eng, tokens):
    """Post-RoPE query of the last token per layer, from an independent forward on a fresh cache."""
    plan = causal_plan(0)
    plan.capture_rows = torch.tensor([len(tokens) - 1])
    idx = torch.arange(len(tokens))
    _, queries = eng.model(torch.tensor([tokens]), idx, eng.model.new_cache(len(tokens)), idx, plan, "sdpa", "last")
    return queries


def brute_force_check(state, queries, reduce):
    """C_r[:budget] = the ranked chunks (chunk 0, then by q . mean key, GQA group combined) with the lowest-ranked
    slots overwritten by the newest committed tokens' full-cache KV (official update_graph_cache)."""
    r_cache, full, budget, cs = state.retrieval.kv, state.cache, state.retrieval.budget, state.cfg.chunk_size
    aligned, n = state.aligned, state.N
    recent = min(n - aligned, budget - cs)
    for layer in range(len(full.keys)):
        keys, q = full.keys[layer][0].double(), queries[layer][0, :, 0].double()  # [H_kv, S, D], [H_q, D]
        group = q.shape[0] // keys.shape[0]
        for h in range(keys.shape[0]):
            means = [keys[h, c * cs : (c + 1) * cs].mean(0) for c in range(aligned // cs)]
            per_q = [[float(q[h * group + g] @ m) for m in means] for g in range(group)]
            score = [max(col) if reduce == "max" else sum(col) for col in zip(*per_q)]
            ranked = [0] + sorted(range(1, len(means)), key=lambda c: -score[c])[: budget // cs - 1]
            for buf_r, buf_f in ((r_cache.keys, full.keys), (r_cache.values, full.values)):
                rows = torch.cat([buf_f[layer][0, h, c * cs : (c + 1) * cs] for c in ranked])
                got = buf_r[layer][0, h, :budget]
                assert torch.equal(got[: budget - recent], rows[: budget - recent])
                want = buf_f[layer][0, h, n - recent : n]  # the recent region, in any slot order
                match = (got[budget - recent :, None] == want[None]).all(-1)
                assert match.any(1).all() and match.any(0).all()


@pytest.mark.parametrize("name,reduce,rebuild", [("llama_mha", "mean", None), ("llama_gqa", "mean", None),
                                                 ("qwen2_gqa", "max", 1)])
def test_retrieval_cache_equals_brute_force(name, reduce, rebuild, engine):
    eng = engine(name)
    method = TriForceDecoder(**dict(SMALL, budget=24), draft=None, gamma2=3, gqa_reduce=reduce,
                             rebuild_interval=rebuild)
    ids = eng.tokenizer(LONG[2]).input_ids
    state = TriForceState(method, eng, ids, 60)
    state.prefill()
    assert state.aligned == len(ids) // 4 * 4 and state.retrieval.budget == 24
    query = fresh_queries(eng, ids)
    brute_force_check(state, query, reduce)  # the prompt tail (T mod chunk tokens) is already recent
    rounds = 0
    while state.N - state.aligned <= 24 + 4:  # until the recent region outgrew budget - chunk and wrapped
        rounds += 1
        step = state.step(60)
        state.commit(step)
        if rebuild:  # re-selected with the newest committed token's query
            query = fresh_queries(eng, state.hist[: state.N])
        brute_force_check(state, query, reduce)
    assert state.stats["rebuilds"] == (rounds if rebuild else 0)


def layer0_keys(eng, tokens, positions):
    """Layer-0 keys depend only on token and position: [H_kv, len, D]."""
    cache = eng.model.new_cache(len(tokens))
    idx = torch.arange(len(tokens))
    eng.model(torch.tensor([tokens]), torch.as_tensor(positions), cache, idx, causal_plan(0), "sdpa", "none")
    return cache.keys[0][0]


def test_draft_streaming_cache_slots_and_sink_positions(engine, draft_path):
    eng = engine("llama_gqa")
    method = TriForceDecoder(**SMALL, draft={"path": draft_path}, gamma1=2)
    ids = eng.tokenizer(LONG[0]).input_ids
    method.setup(eng)
    state = TriForceState(method, eng, ids, 40)
    state.prefill()
    draft, start, window = state.draft, 4, 24 - 4 - 6
    for _ in range(6):
        for step in range(2):
            d = draft.D
            assert d > start + window and draft.delta == d - start - window
            keys = draft.kv.keys[0][0]
            want = layer0_keys(draft.engine, state.hist[:d], torch.arange(d))
            for p in range(d - window, d):  # the window: the last `window` committed tokens at their positions
                assert torch.allclose(keys[:, draft._slot(p)], want[:, p], atol=1e-5)
            sinks = layer0_keys(draft.engine, state.hist[:start], draft.delta + torch.arange(start))
            assert torch.allclose(keys[:, :start], sinks, atol=1e-5)  # re-rotated right before the window
            if step == 0:
                state.commit(state.step(40))


def test_draft_without_eviction_is_the_draft_models_greedy_chain(engine):
    eng = engine("llama_mha")  # the target as its own draft, window larger than the text: exact
    from baselines.triforce_cache import StreamingDraft

    ids = eng.tokenizer(PROMPTS[0]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 12).tokens
    draft = StreamingDraft(eng, start=4, window=64, scratch=16)
    draft.prefill(ids)
    assert draft.propose(ids + ref[:1], 0, 5) == ref[1:6]  # feeds the current token, then 4 of its own
    draft.commit(ids + ref[:4], 0, len(ids) + 3)  # 3 of the fed tokens are committed: their KV is kept
    assert draft.D == len(ids) + 3 and draft.propose(ids + ref[:6], 0, 4) == ref[6:10]


def test_a_greedy_proposal_on_a_device_is_read_once_and_drafts_the_host_chain(engine):
    """On a device each drafted token feeds the next forward where it lies and the chain is read at its end: the
    same tokens as the host path's (a read per token), with one read per proposal instead of one per token."""
    eng = engine("llama_mha")
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 12).tokens
    host, device = (StreamingDraft(eng, start=4, window=64, scratch=16) for _ in range(2))
    host.prefill(ids)
    device.prefill(ids)
    for fed, n in ((ref[:1], 5), (ref[:6], 4)):  # the second reuses the first's KV for 4 of its fed tokens
        want = host.propose(ids + fed, 0, n)
        with ReadsOnTheHost() as reads:
            got = device.propose(ids + fed, 0, n)
        assert got == want == ref[len(fed) : len(fed) + n] and reads.n == 1
        assert device.spec == host.spec


def test_extras_and_tau_on_repetitive_text(engine, checkpoint):
    eng = engine("llama_mha_rep")  # the target as its own draft: the middle level accepts drafts
    method = TriForceDecoder(**dict(SMALL, budget=32), draft={"path": str(checkpoint("llama_mha_rep"))})
    ids = eng.tokenizer(LONG[2]).input_ids
    gen = method.generate(eng, ids, 120)
    assert gen.tokens == VanillaDecoder().generate(eng, ids, 120).tokens
    assert gen.tau > 1.5 and max(gen.accept_lengths) > 2
    x = gen.extras
    draft_prefill = method._loaded[1].engine.ledger.counts["prefill"]  # a fresh draft: this generation's only
    assert gen.forwards.draft >= gen.n_forwards and gen.draft_model_forwards == draft_prefill + 2 * gen.forwards.draft
    assert gen.draft_model_params == sum(p.numel() for p in method._loaded[1].engine.model.parameters())
    assert x["middle_accept_rate"] > 0.3 and x["budget_used"] == 32
    assert x["buffer_bytes"] == x["retrieval_bytes"] + x["draft_bytes"] > eng.weights_nbytes


def test_runner_exact_and_peak_memory_above_vanilla(tmp_path):
    common = ["bench.max_new_tokens=12", "bench.max_samples=2"]
    tf = ["method=triforce", "method.budget=16", "method.chunk_size=4", "method.draft_budget=32",
          "method.draft.path=null", "method.draft.tiny={family: llama, hidden_size: 32, num_hidden_layers: 1}"]
    vanilla = Runner().run(resolve(make_cfg(tmp_path, *common), tmp_path / "vanilla"))
    triforce = Runner().run(resolve(make_cfg(tmp_path, *common, *tf), tmp_path / "triforce"))
    assert triforce["exact_match_rate"] == 1.0 and triforce["method"] == "triforce"
    assert triforce["peak_mem_mb"] > vanilla["peak_mem_mb"]


BAD = [("gamma1", {"gamma1": 0}), ("gamma2", {"gamma2": -1}), ("chunk_size", {"chunk_size": 0}),
       ("budget", {"budget": 20, "chunk_size": 8}), ("budget", {"budget": 8, "chunk_size": 8}),
       ("rebuild_interval", {"rebuild_interval": 0}), ("gqa_reduce", {"gqa_reduce": "sum"}),
       ("draft", {"draft": {"path": None, "tiny": None}}), ("draft", {"draft": {"path": "a/b", "size": 1}}),
       ("draft_budget", {"draft_budget": 20})]


@pytest.mark.parametrize("setting,kw", BAD, ids=[f"{s}-{i}" for i, (s, _) in enumerate(BAD)])
def test_bad_hyperparameters_name_the_setting(setting, kw):
    with pytest.raises(ConfigError, match=rf"method\.{setting}"):
        TriForceDecoder(**kw)


def test_vocab_mismatch_and_sampling_are_refused(engine, checkpoint, ckpt_root):
    eng = engine("llama_mha")
    other = tiny_checkpoint(dict(DRAFT_SPEC, vocab_size=512), cache_dir=ckpt_root)
    method = TriForceDecoder(draft={"path": str(other)})
    with pytest.raises(ConfigError, match=r"method\.draft.*vocabulary size 512"):
        method.check_target(eng.model.hf_config, eng.tokenizer)
    with pytest.raises(ConfigError, match=r"method\.draft"):
        method.setup(eng)
    with pytest.raises(ConfigError, match=r"method\.draft\.path"):
        TriForceDecoder(draft={"path": str(ckpt_root / "missing")}).check_target(eng.model.hf_config, None)
    TriForceDecoder().check_sampling(Sampling(temperature=0.7))  # sampling is supported (tests/test_sampling.py)


# ---------------------------------------------------------------------------- engine.static_shapes
STATIC_CASES = {  # name: (target, prompts, decoder kwargs, draft: None, "tiny" (DRAFT_SPEC) or "self" (the target))
    "rep-self-g2": ("llama_mha_rep", LONG, dict(SMALL, gamma1=2), "self"),  # high acceptance at both levels
    "qwen2-rep-g1-rebuild": ("qwen2_gqa_rep", LONG, dict(SMALL, gamma1=1, rebuild_interval=2), "tiny"),
    "gqa-g3-short": ("llama_gqa", PROMPTS, dict(SMALL, budget=64, gamma1=3, gamma2=4), "tiny"),
    "full-cache-middle": ("llama_mha_rep", PROMPTS, dict(SMALL, budget=64, chunk_size=32), "self"),  # < 2 chunks
    "nodraft": ("llama_mha_rep", LONG, dict(SMALL, gamma2=4), None),
}
STATIC_SAMPLING = Sampling(temperature=0.8, top_k=16, seed=5)


@pytest.fixture
def static(engine, checkpoint, draft_path):
    """static(case) -> (engine with ``static_shapes`` on, switched off again afterwards; decoder; prompts)."""
    used = []

    def get(case: str):
        name, prompts, kw, draft = STATIC_CASES[case]
        eng = engine(name)
        used.append(eng)
        eng.static_shapes = True
        path = {None: None, "tiny": draft_path, "self": str(checkpoint(name))}[draft]
        return eng, TriForceDecoder(**kw, draft=path and {"path": path}), prompts

    yield get
    for eng in used:
        eng.static_shapes = False


def run_both(eng, method, ids, max_new, sampling=None, seed=0):
    """(static-shape generation, plain generation) of one prompt, each with a fresh generator of the same seed."""
    gens = []
    for flag in (True, False):
        eng.static_shapes = flag
        gens.append(method.generate(eng, ids, max_new, (), sampling, sampling and sampling.generator(seed)))
    eng.static_shapes = True
    return gens


@pytest.mark.parametrize("case", list(STATIC_CASES))
def test_static_shapes_are_token_identical_to_vanilla_and_unpadded(case, static):
    eng, method, prompts = static(case)
    assert_lossless(method, eng, prompts=prompts)  # vs vanilla greedy, across EOS and max_new_tokens cuts
    for text in prompts:  # the padding changes nothing but the shapes: same tokens, steps and stats
        ids = eng.tokenizer(text).input_ids
        for max_new in (40, 9):
            padded, plain = run_both(eng, method, ids, max_new)
            assert padded.tokens == plain.tokens and padded.accept_lengths == plain.accept_lengths
            assert padded.extras == plain.extras
    if case.startswith("rep"):
        assert max(padded.accept_lengths) > 2 and padded.extras["middle_accept_rate"] > 0.3


@pytest.mark.parametrize("case", ["rep-self-g2", "gqa-g3-short", "nodraft"])
def test_static_shapes_sampling_draws_the_same_tokens(case, static):
    eng, method, prompts = static(case)
    for i, text in enumerate(prompts):
        padded, plain = run_both(eng, method, eng.tokenizer(text).input_ids, 30, STATIC_SAMPLING, seed=i)
        assert padded.tokens == plain.tokens and padded.accept_lengths == plain.accept_lengths
        assert padded.extras == plain.extras


class StepShapes:
    """Records the shapes of every decode-step forward (``plan.prefix > 0``) after the prefill, per forward kind
    (by the cache it runs on): (Q, len(positions), len(slots), logits rows). Doubles as the generation's clock:
    recording starts at its ``prefill`` mark (the draft's chunked prefill has prefix > 0 and any shape)."""

    def __init__(self, eng, method, monkeypatch):
        self.on, self.seen = False, {}
        self.method = method
        method.setup(eng)  # loads the draft engine, wrapped below too
        engines = [eng] + ([method._loaded[1].engine] if method.draft is not None else [])
        for e in engines:
            monkeypatch.setattr(e, "forward", self.wrap(e.forward))

    def kind(self, cache) -> str:
        if self.method.draft is not None and cache is self.method._loaded[1].kv:
            return "draft"
        return "retrieval" if self.method._rkv is not None and cache is self.method._rkv[1] else "full"

    def wrap(self, forward):
        def record(cache, tokens, positions, slots, plan, logits="all", skip=None, eager=False, kind="verify",
                   queries=False, greedy=False, into=None):
            if self.on and plan.prefix > 0 and not eager:  # eager: the draft's chunked prefill
                rows = {"all": len(tokens), "last": 1}[logits] if isinstance(logits, str) else len(logits)
                shape = (len(tokens), len(positions), len(slots), rows)
                self.seen.setdefault(self.kind(cache), set()).add(shape)
            return forward(cache, tokens, positions, slots, plan, logits, skip, eager, kind, queries=queries,
                           greedy=greedy, into=into)

        return record

    def mark(self, phase: str) -> None:
        self.on = phase == "prefill"

    def generate(self, eng, text, max_new, sampling=None):
        self.on = False
        gen = self.method.generate(eng, eng.tokenizer(text).input_ids, max_new, (), sampling,
                                   sampling and sampling.generator(0), clock=self)
        self.on = False
        return gen


@pytest.mark.parametrize("sampling", [None, STATIC_SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", ["rep-self-g2", "gqa-g3-short", "full-cache-middle", "nodraft"])
def test_static_shapes_give_each_forward_kind_one_shape(case, sampling, static, monkeypatch):
    eng, method, prompts = static(case)
    runs = [(prompts[2], 37), (prompts[0], 23)]  # repetitive / varied text, different lengths and max_new_tokens
    assert len({len(eng.tokenizer(t).input_ids) for t, _ in runs}) == 2
    P, M, C = method.max_proposal + 1, 1 + method.gamma1 * (method.draft is not None), StreamingDraft.CATCH_UP
    want = {"full": {(P, P, P, P)}, "retrieval": {(M, M, M, M)}, "draft": {(C, C, C, 1), (1, 1, 1, 1)}}
    if method.draft is None:
        del want["draft"]
    if case == "full-cache-middle":  # fewer than 2 whole chunks: the middle level runs on the full cache
        want["full"].add(want.pop("retrieval").pop())
    for static_shapes in (True, False):
        eng.static_shapes = static_shapes
        per_prompt = []
        for text, max_new in runs:
            rec = StepShapes(eng, method, monkeypatch)
            gen = rec.generate(eng, text, max_new, sampling)
            monkeypatch.undo()
            assert gen.n_forwards >= 3 and min(gen.accept_lengths) < max(gen.accept_lengths)
            per_prompt.append(rec.seen)
        if static_shapes:
            assert per_prompt == [want, want]
        else:  # the control: unpadded verifications and draft catch-ups vary with the data
            assert len(per_prompt[0]["full"] | per_prompt[1]["full"]) > len(want["full"])
            if method.draft is not None:
                drafts = per_prompt[0]["draft"] | per_prompt[1]["draft"]
                assert drafts != want["draft"]
                if case == "rep-self-g2" and sampling is None:  # full matches: catch-ups reach CATCH_UP tokens
                    assert (C, C, C, 1) in drafts
    eng.static_shapes = True


def test_sink_rotations_from_the_table_are_the_direct_rotation_exactly(engine):
    """The sinks' cos/sin come from a table of ROTATIONS rotations, rebuilt when a rotation falls outside it (and
    at every reset): each rotation equals the direct one, delta * inv_freq turned by cos and sin, bit for bit."""
    eng = engine("llama_mha")
    draft = StreamingDraft(eng, start=4, window=8, scratch=16)
    for generation in range(2):
        draft.prefill(eng.tokenizer(PROMPTS[generation]).input_ids)
        assert draft.delta > 0 and draft.pristine is not None  # the prompt filled the window: rotated once
        keys, half = draft.pristine
        for delta in (1, 63, 64, 65, 64 + 63, 200, 3):
            draft._rotate_sinks(delta)
            freqs = delta * eng.model.rotary.inv_freq
            emb = torch.cat((freqs, freqs))
            want = (keys * emb.cos() + half * emb.sin()).to(draft.kv.kv.dtype)
            assert torch.equal(draft.kv.kv[0, :, :, :, : draft.start], want), delta
            assert draft.rotations[0] <= delta < draft.rotations[0] + StreamingDraft.ROTATIONS


@pytest.mark.parametrize("n", [3, 12])  # within the window, and more tokens than it holds (later ones win a slot)
def test_a_commit_puts_the_last_window_of_tokens_in_their_ring_slots(engine, n):
    """The committed entries move from scratch into the ring by slice copies: afterwards every window slot holds
    the key of its newest position, and the sinks sit right before the window."""
    eng = engine("llama_mha")  # the target as its own draft
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    start, window = 4, 8
    draft = StreamingDraft(eng, start=start, window=window, scratch=16)
    draft.prefill(ids)
    d, current = draft.D, ids[:1]  # any next token: fed, then n drafted whose first n - 1 are fed too
    text = ids + current + draft.propose(ids + current, 0, n)
    draft.commit(text, 0, d + n)
    keys, want = draft.kv.keys[0][0], layer0_keys(eng, text[: d + n], torch.arange(d + n))
    assert draft.D == d + n and draft.delta == d + n - start - window
    for p in range(d + n - window, d + n):
        assert torch.allclose(keys[:, draft._slot(p)], want[:, p], atol=1e-5), p
    sinks = layer0_keys(eng, text[:start], draft.delta + torch.arange(start))
    assert torch.allclose(keys[:, :start], sinks, atol=1e-5)
