"""Projected speedups price each method's own forwards on a cost curve: the formula by hand, and on a simulated
device whose forwards cost exactly what a synthetic curve says (a virtual clock), the projection recovers every
method's measured decode speedup; the check command fails a projection that misses."""

import json
import types

import pytest

from fafo.bench import timing
from fafo.bench.tools.cost_curve import CostCurve
from fafo.bench.records import compact
from fafo.bench.tools.projection import Pricer, project, vanilla_log
from fafo.bench.tools.projection import main as check_main
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.engine.ledger import ForwardLedger, ForwardRecord
from tests.helpers import make_cfg, read_rows

A, B, C = 5.0, 0.2, 0.002  # the simulated device: ms = A + B x tokens + C x (sum over rows of slots attended)
# 2 tokens sampled: a step of several rows is priced on the multi-row points only (CostCurve.latency), so an
# exact projection of small steps needs the smallest of them
CONTEXTS, STEPS = (0, 256, 1024), (1, 2, 16, 64, 128, 512)


def device_ms(r: ForwardRecord) -> float:
    rows_attended = (r.tokens - r.region_rows) * r.prefix + r.region_rows * r.region_len
    return r.share * (A + B * r.tokens + C * rows_attended)


def write_curve(path):
    """The simulated device's cost curve, as scripts/bench_engine.py --curve writes one (all rows attend)."""
    path.write_text("context,step_tokens,median_ms,device\n" + "".join(
        f"{c},{s},{A + B * s + C * s * c},simulated\n" for c in CONTEXTS for s in STEPS))
    return path


def test_a_forward_is_priced_at_its_own_rows_attended_lengths(tmp_path):
    curve = CostCurve.load(write_curve(tmp_path / "curve.csv"))
    fused = [ForwardRecord("verify", 81, p, 40, 100) for p in (200, 201, 203)]  # 41 rows see all, 40 the region
    groups = compact([ForwardRecord("prefill", 300, 0), *fused])
    assert groups == [["verify", 81, 40, 100, 1.0, 3, 604, 200, 203]]  # prefill left out, prefixes summed
    rows = [{"sample_id": "a", "turn": 0, "status": "ok", "new_tokens": 7, "ref_new_tokens": 7, "forwards": 3,
             "prompt_tokens": 200, "decode_s": 0.5, "ref_decode_s": 0.5}]
    out = project(rows, {("a", 0): {"forward_log": groups}}, curve)
    method_ms = sum(device_ms(r) for r in fused)
    ref_ms = sum(A + B + C * p for p in range(200, 206))  # vanilla: 6 one-token forwards after 200..205 slots
    assert out["projected_speedup"] == pytest.approx(ref_ms / method_ms, rel=1e-9)
    assert out["projection_measured"] == pytest.approx(1.0) and out["projection_beyond_curve"] == 0
    assert vanilla_log(200, 7) == [["verify", 1, 0, 0, 1.0, 6, sum(range(200, 206)), 200, 205]]
    # beyond the grid: priced by extrapolation, never silently
    far = project(rows, {("a", 0): {"forward_log": compact([ForwardRecord("verify", 600, 5000)] * 3)}}, curve)
    assert far["projection_beyond_curve"] == 3 and "600 tokens at context 5000" in far["projection_note"]
    # host time per step, where the run measured it
    host = project([{**rows[0], "host_ms_per_step": 2.0}], {("a", 0): {"forward_log": groups}}, curve)
    assert host["projected_speedup"] == pytest.approx(ref_ms / (method_ms + 3 * 2.0), rel=1e-9)
    assert "measured in the run" in host["projection_host"]


def test_a_curve_of_another_device_predicts_with_its_own_host_times_and_no_error(tmp_path, monkeypatch):
    """Priced on a curve measured on another device, the projection is a prediction there: host time per step comes
    from the curve file (the method's row, else vanilla's as a floor), never from this run's device, and there is no
    error to report. The committed GPU file is found from any working directory."""
    monkeypatch.chdir(tmp_path)
    curve = CostCurve.load("results/device/h100.csv")  # the main job's
    assert curve.device == "NVIDIA H100 80GB HBM3" and curve.host_ms("fafo-stream") == curve.host_ms("fafo_stream") > 0
    groups = compact([ForwardRecord("verify", 81, p) for p in (600, 603, 606)])
    rows = [{"sample_id": "a", "turn": 0, "status": "ok", "new_tokens": 9, "ref_new_tokens": 9, "forwards": 3,
             "prompt_tokens": 600, "decode_s": 0.5, "ref_decode_s": 0.4, "host_ms_per_step": 50.0,
             "ref_host_ms_per_step": 40.0}]
    outputs = {("a", 0): {"forward_log": groups}}
    same = project(rows, outputs, curve, method="fafo-stream", run_device="nvidia h100 80gb hbm3 ")
    assert not same["projection_cross_device"] and same["projection_error"] is not None
    assert "measured in the run" in same["projection_host"]
    other = project(rows, outputs, curve, method="fafo-stream", run_device="AMD EPYC")
    assert other["projection_cross_device"] and other["projection_error"] is None
    assert same["projected_step_ms"] > 50 > 20 > other["projected_step_ms"]  # the GPU's host ms, not the run's 50
    assert "the method's, from the cost curve (NVIDIA H100 80GB HBM3)" in other["projection_host"]
    floor = project(rows, outputs, curve, method="lookahead", run_device="AMD EPYC")
    assert "vanilla's from the cost curve (NVIDIA H100 80GB HBM3), a floor" in floor["projection_host"]
    assert floor["projected_step_ms"] < other["projected_step_ms"]  # vanilla's 0.22 ms < FAFO-Stream's 1.15 ms


@pytest.fixture
def simulated_device(monkeypatch):
    """Every engine forward advances a virtual clock by what the simulated device charges for it; the runner's
    clock reads that clock, so a measured time is exactly the device's (no host time)."""
    now = [0.0]
    record = ForwardLedger.record

    def charged(self, kind, n_tokens, prefix=0, region_rows=0, region_len=0, share=1.0, batch=1):
        record(self, kind, n_tokens, prefix, region_rows, region_len, share, batch)
        now[0] += device_ms(ForwardRecord(kind, n_tokens, prefix, region_rows, region_len, share)) / 1e3

    monkeypatch.setattr(ForwardLedger, "record", charged)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(timing, "cpu_name", lambda: "simulated")  # the run is on the curve's own device


def test_a_step_of_several_rows_is_never_priced_below_the_smallest_multi_row_point(tmp_path):
    """Vanilla's 1-token step takes its own kernel path, so a curve of steps 1 and 64 (as an H100's: 8.26 and 9.19
    ms at 512) prices an 11-token step at the 64-token cost, not by a line from the 1-token point, and a
    projection counts such forwards as priced beyond the grid."""
    path = tmp_path / "gpu.csv"
    path.write_text("context,step_tokens,median_ms\n512,1,8.26\n512,64,9.19\n512,128,9.79\n"
                    "4096,1,8.96\n4096,64,12.28\n4096,128,12.30\n")
    curve = CostCurve.load(path)
    assert curve.smallest_multi_row() == 64
    assert curve.latency(1, 512) == 8.26 and curve.latency(11, 512) == curve.latency(2, 512) == 9.19
    assert curve.latency(96, 512) == pytest.approx((9.19 + 9.79) / 2)
    assert curve.latency(11, 2304) == pytest.approx((9.19 + 12.28) / 2)  # contexts still interpolate
    assert curve.break_even_tau([11], 512) == pytest.approx(9.19 / 8.26)
    pricer = Pricer(curve)  # 3 forwards of 11 tokens at context 512, then 2 of 64 (on the grid)
    assert pricer.group_ms(["verify", 11, 0, 0, 1.0, 3, 3 * 512, 512, 512]) == pytest.approx(3 * 9.19)
    pricer.group_ms(["verify", 64, 0, 0, 1.0, 2, 2 * 512, 512, 512])
    assert pricer.beyond == 3 and pricer.beyond_example.startswith("11 tokens at context 512-512")
    finer = tmp_path / "finer.csv"  # with a 2-token point, the small steps interpolate again
    finer.write_text(path.read_text() + "512,2,8.40\n4096,2,9.10\n")
    assert CostCurve.load(finer).latency(33, 512) == pytest.approx((8.40 + 9.19) / 2)


@pytest.mark.parametrize("method", [["method=fafo_stream", "method.n=6", "method.k=3", "method.compress.local=16"],
                                    ["method=lookahead", "method.window=4", "method.guess_set=4"],
                                    ["method=swift"], ["method=prompt_lookup"],
                                    ["method=fafo_2forward", "method.n=6", "method.k=3", "method.compress.local=16"],
                                    ["method=fafo_quest", "method.n=6", "method.k=3",
                                     "method.compress.token_budget=32"],
                                    ["method=triforce_nodraft", "method.budget=16"], ["method=quantspec_fp16"],
                                    ["method=token_recycling"], ["method=suffix_decoding"], ["method=sam_decoding"]],
                         ids=lambda m: m[0].split("=")[1])
def test_the_projection_recovers_the_speedup_measured_on_the_curves_device(method, simulated_device, checkpoint,
                                                                           tmp_path):
    curve = write_curve(tmp_path / "curve.csv")
    cfg = make_cfg(tmp_path, *method, f"model.path={checkpoint('llama_mha_rep')}", "bench.max_new_tokens=24",
                   "task.ids=[chat-01,code-01,multi-01]", f"bench.cost_curve={curve}", "bench.warmup=0",
                   "bench.repeats=2")
    summary = Runner().run(resolve(cfg, tmp_path / "run"), report=False)
    assert summary["tau"] > 1  # a repetitive model: the method accepts guesses
    assert summary["projection_measured"] == pytest.approx(summary["speedup_decode"], rel=1e-9)
    assert summary["projected_speedup"] == pytest.approx(summary["speedup_decode"], rel=1e-6)
    assert abs(summary["projection_error"]) < 1e-6 and summary["projection_rows"] == summary["n_turns"]
    outputs = [json.loads(x) for x in (tmp_path / "run" / "outputs.jsonl").read_text().splitlines()]
    for o in outputs:  # every decode forward of the method is in its log, and vanilla's in the reference's
        f = o["forwards"]
        assert sum(g[5] for g in o["forward_log"]) == f["verify"] + f["draft"] + f["aux"]
        assert sum(g[5] for g in o["ref_forward_log"]) == len(o["tokens"]) - 1
    rows = read_rows(tmp_path / "run")
    assert all(float(r["decode_s"]) > 0 for r in rows)


def test_the_check_command_fails_a_projection_that_misses(simulated_device, checkpoint, tmp_path, capsys):
    curve = write_curve(tmp_path / "curve.csv")
    cfg = make_cfg(tmp_path, "method=lookahead", "method.window=4", "method.guess_set=4", "bench.warmup=0",
                   f"model.path={checkpoint('llama_mha_rep')}", "bench.max_new_tokens=16", "task.ids=[chat-01,code-01]")
    Runner().run(resolve(cfg, tmp_path / "runs" / "lookahead"), report=False)  # no curve in the run: priced afterwards
    assert check_main([str(tmp_path / "runs"), "--curve", str(curve), "--within", "0.2"]) == 0
    assert "| lookahead |" in capsys.readouterr().out
    slower = tmp_path / "slower.csv"  # a wrong curve of the same device: many-token forwards three times as dear
    rows = [(c, s, (1 if s == 1 else 3) * (A + B * s + C * s * c)) for c in CONTEXTS for s in STEPS]
    slower.write_text("context,step_tokens,median_ms,device\n" + "".join(f"{c},{s},{ms},simulated\n"
                                                                        for c, s, ms in rows))
    assert check_main([str(tmp_path / "runs"), "--curve", str(slower), "--within", "0.2"]) == 1
    assert "projection off by more than 20 %" in capsys.readouterr().err
    other = tmp_path / "other.csv"  # another device's curve: a prediction there, which no check can hold
    other.write_text(slower.read_text().replace(",simulated\n", ",other GPU\n"))
    assert check_main([str(tmp_path / "runs"), "--curve", str(other)]) == 0
    assert "| n/a (timed on another device) |" in capsys.readouterr().out
    assert check_main([str(tmp_path / "runs"), "--curve", str(other), "--within", "0.2"]) == 2
    assert "the curve is from other GPU" in capsys.readouterr().err
