"""Every method config, composed as a user would compose it, is token-identical to vanilla greedy on a tiny model.

Covers the presets (lookahead_13b, lookahead_specbench, triforce_official, swift_script...) on top of each method's
own test file. TriForce presets get a tiny draft (llama-68m cannot be fetched offline); lossy is lossy by design.
"""


import pytest

from fafo.bench.spec import build, method_node
from tests.lossless import PROMPTS, assert_lossless
from tests.helpers import make_cfg
from tests.methods import METHODS


@pytest.mark.parametrize("name", sorted(n for n, case in METHODS.items() if case.lossless))
def test_method_config_is_token_identical_to_vanilla(name, engine, tmp_path):
    overrides = [f"method={name}", *METHODS[name].overrides]  # tests/methods.py: a tiny draft where one is needed
    method = build(method_node(make_cfg(tmp_path, *overrides).method), "method")
    eng = engine("qwen2_gqa_rep")
    method.setup(eng)
    assert_lossless(method, eng, max_new=16, prompts=[PROMPTS[0] * 3, PROMPTS[2] * 2])
