"""Every method config, composed as a user would compose it, is token-identical to vanilla greedy on a tiny model.

Covers the presets (lookahead_13b, lookahead_specbench, triforce_official, swift_script...) on top of each method's
own test file. TriForce presets get a tiny draft (llama-68m cannot be fetched offline); lossy is lossy by design.
"""

from pathlib import Path

import pytest

from fafo.bench.setup import build, method_node
from tests.lossless import PROMPTS, assert_lossless
from tests.test_runner import make_cfg

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
METHODS = sorted(p.stem for p in CONF.glob("*.yaml") if p.stem != "lossy")
TINY_DRAFT = ["method.draft.path=null", "method.draft.tiny={family: llama, hidden_size: 32, num_hidden_layers: 1}",
              "method.budget=16", "method.chunk_size=4"]


@pytest.mark.parametrize("name", METHODS)
def test_method_config_is_token_identical_to_vanilla(name, engine, tmp_path):
    overrides = [f"method={name}"]
    if name.startswith("triforce"):
        overrides += TINY_DRAFT[2:] if name == "triforce_nodraft" else TINY_DRAFT
    if name.startswith("longspec"):  # the released drafts cannot be fetched offline: a random one
        overrides += ["method.draft.path=null", "method.draft.random_seed=0"]
    if name == "sam_decoding_published":  # its corpus is built per model (scripts/build_sam_corpus.py): a text one
        (tmp_path / "corpus.txt").write_text(PROMPTS[0] * 4 + PROMPTS[2] * 3)
        overrides += [f"method.corpus_path={tmp_path / 'corpus.txt'}"]
    method = build(method_node(make_cfg(tmp_path, *overrides).method), "method")
    eng = engine("qwen2_gqa_rep")
    method.setup(eng)
    assert_lossless(method, eng, max_new=16, prompts=[PROMPTS[0] * 3, PROMPTS[2] * 2])
