"""Both sides of every torch-version switch in :mod:`fafo.engine.torch_compat`: the path this torch takes, and the
older one, forced, give the same results (each CI stack runs both)."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.attention.flex_attention as fa

from fafo.engine import torch_compat
from fafo.engine.block_masks import causal_block_mask
from fafo.engine.flex_routing import lowered_kernel

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile",
                                        "ignore:.*return_lse is deprecated")


def test_both_lse_requests_agree(monkeypatch):
    q, k, v = torch.randn(1, 4, 70, 16), torch.randn(1, 2, 70, 16), torch.randn(1, 2, 70, 16)
    bm = causal_block_mask(70, "cpu")
    assert torch_compat.HAS_AUX_REQUEST == hasattr(fa, "AuxRequest")
    out, lse = torch_compat.flex_attention_lse(fa.flex_attention, q, k, v, bm, 0.25)
    monkeypatch.setattr(torch_compat, "HAS_AUX_REQUEST", False)  # the return_lse path of torch < 2.9
    old_out, old_lse = torch_compat.flex_attention_lse(fa.flex_attention, q, k, v, bm, 0.25)
    assert out.shape == (1, 4, 70, 16) and lse.shape == (1, 4, 70) and lse.dtype == torch.float32
    assert torch.equal(out, old_out) and torch.equal(lse, old_lse)


@pytest.mark.parametrize("has_backend", [True, False])
def test_main_template_option_is_accepted_and_selects_the_main_template(has_backend, monkeypatch):
    monkeypatch.setattr(torch_compat, "HAS_BACKEND_OPTION", has_backend)
    options = torch_compat.main_template_option()
    assert options == ({"BACKEND": "TRITON"} if has_backend else {"FORCE_USE_FLEX_ATTENTION": True})
    q = torch.randn(1, 32, 81, 16)
    k = torch.randn(1, 8, 300, 16)
    checked = fa._apply_kernel_options(q, k, k, True, options)  # torch's own validation of the options
    assert {key: checked[key] for key in options} == options
    assert lowered_kernel(81, 32, 8, 128, options) == ("attention", True)


def test_recompile_limit_under_either_name():
    new = SimpleNamespace(recompile_limit=8, fail_on_recompile_limit_hit=False)
    old = SimpleNamespace(cache_size_limit=8)
    torch_compat.raise_recompile_limit(32, new)
    torch_compat.raise_recompile_limit(32, old)
    assert new.recompile_limit == 32 and new.fail_on_recompile_limit_hit and old.cache_size_limit == 32
    torch_compat.raise_recompile_limit(16, new)
    assert new.recompile_limit == 32  # never lowered


def test_the_apis_used_directly_exist_with_the_arguments_used():
    """What :mod:`fafo.engine.torch_compat` lists as version-independent, checked on this torch."""
    import inspect

    assert "seq_lengths" in inspect.signature(fa.BlockMask.from_kv_blocks).parameters
    schema = str(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default._schema)
    assert "float dropout_p=0., bool is_causal=False, *, Tensor? attn_mask=None, float? scale=None" in schema
    assert {"min", "max"} <= set(inspect.signature(torch._dynamo.mark_dynamic).parameters)
    assert callable(torch.compiler.cudagraph_mark_step_begin)
    assert hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit")
    import torch.fx.experimental._config as fx_config

    assert hasattr(fx_config, "use_duck_shape")
    assert torch_compat._INFERENCE_MODE is torch._C._InferenceMode  # the guard torch.inference_mode enters
