"""The kernel profile of the GPU self-check's decode stage (``fafo.bench.tools.kernel_profile``): kernel names as
CUDA reports them sorted into kinds, and a profile on the CPU that accounts for the time it measured."""

import pytest
import torch

from fafo.bench.tools.kernel_profile import kind_of, profile_forward, profile_rows


@pytest.mark.parametrize("name, kind", [
    ("nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NNT", "matrix products"),  # cuBLAS on Hopper
    ("void gemv2T_kernel_val<int, int, __half, __half, float, 128, 16, 4, 4, false>(...)", "matrix products"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64", "matrix products"),
    ("triton_tem_fused_flex_attention_0", "attention"),
    ("triton_poi_fused_add_mul_rsqrt_3", "fused element-wise and reductions"),
    ("triton_red_fused__to_copy_mean_pow_1", "fused element-wise and reductions"),  # not a copy: a reduction
    ("Memcpy DtoD (Device -> Device)", "copies and fills"),
    ("Memset (Device)", "copies and fills"),
    ("aten::mm", "matrix products"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::copy_", "copies and fills"),
    ("aten::mul", "fused element-wise and reductions"),
    ("some_custom_kernel", "other"),
])
def test_kernels_are_sorted_by_kind(name, kind):
    assert kind_of(name) == kind


def test_a_cpu_profile_accounts_for_its_time():
    w, x = torch.randn(256, 256), torch.randn(8, 256)

    def forward():
        return torch.nn.functional.silu(x @ w) * 2.0

    forward()
    profile = profile_forward(forward, 5, torch.device("cpu"))
    kinds = profile["kinds"]
    assert kinds["matrix products"]["events"] == pytest.approx(1.0)  # one mm per call
    assert kinds["matrix products"]["ms"] > 0 and "fused element-wise and reductions" in kinds
    assert 0 < profile["busy_ms"] and profile["idle_ms"] == pytest.approx(max(0.0, profile["wall_ms"]
                                                                             - profile["busy_ms"]))
    rows = profile_rows(profile, weight_bytes=w.numel() * 4)
    assert rows[0]["kind"] == "matrix products" and rows[0]["note"].endswith("GB/s of weights")
    assert rows[-1]["kind"].startswith("idle") and rows[-1]["note"].startswith("wall ")


def test_a_profile_warns_of_no_lost_events_on_any_torch(monkeypatch):
    """torch 2.11 warns on a profile's first cycle that earlier cycles' events are dropped (its prepare_trace checks
    for a profiler after creating one); a single-cycle profile loses none, so the GPU self-check must not say so."""
    import warnings

    import torch.profiler.profiler as torch_profiler

    monkeypatch.setattr(torch_profiler, "_WARNINGS_SHOWN", set())  # the warning is shown once per process
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = profile_forward(lambda: torch.ones(4) * 2.0, 2, torch.device("cpu"))
    assert profile["kinds"]["fused element-wise and reductions"]["events"] >= 1


def test_a_profile_that_saw_no_kernel_says_so():
    rows = profile_rows({"wall_ms": 7.0, "busy_ms": 0.0, "idle_ms": 7.0, "kinds": {}}, weight_bytes=1)
    assert len(rows) == 1 and rows[0]["kind"] == "no device event recorded"
