"""The GPU self-check (``python -m fafo.bench.gpu_check``): its quick CPU run through the command line (every stage
ran, every correctness case token-identical, the device CSV readable as a cost curve), and its stage machinery
(budgets, timeouts, a failing stage recorded while the next one runs) on stand-in stages."""

import csv
import subprocess
import sys
import time

import pytest
import torch

from fafo.bench.gpu_check.methods import METHODS
from fafo.bench.gpu_check.settings import BUDGETS, settings_for
from fafo.bench.gpu_check.stages import Budget, StageResult, run_stage
from tests.helpers import ENV, REPO


@pytest.mark.slow
def test_quick_cpu_check_passes_and_writes_its_report(tmp_path):
    from fafo.bench.tools.cost_curve import CostCurve

    out = tmp_path / "check"
    # a generous budget: on a busy CI machine no stage may be cut short (this test checks content, not speed)
    proc = subprocess.run([sys.executable, "-m", "fafo.bench.gpu_check", "--device", "cpu", "--quick",
                           "--budget-s", "3000", "--out", str(out)], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout[proc.stdout.index("| stage | status"):]  # printed last
    for stage in BUDGETS:
        assert f"| {stage} | ok |" in table, table
    assert table.rstrip().splitlines()[-1].startswith("PASSED")
    report = (out / "gpu_check.md").read_text()
    assert report.startswith("# GPU self-check: PASSED") and report.count("Status: **ok**") == len(BUDGETS)
    assert "Where a 1-token forward's time goes" in report and "| matrix products |" in report  # decode's profile

    rows = list(csv.DictReader(open(out / "correctness.csv")))
    cases = [c for c in rows if c["batch"] == "1"]
    assert len(cases) == 14 and {c["group"] for c in rows} == {"4"}  # --quick on CPU: group 4, every method
    batched = [c for c in rows if c["batch"] == "4"]  # and two of them decoding four requests as one batch
    assert [c["method"] for c in batched] == ["vanilla", "token_recycling"]
    assert all(c["status"] == "ok" and c["identical"] == c["generations"] == "4" for c in batched), batched
    for c in cases:
        assert c["status"] == "ok" and c["identical"] == c["generations"] == "3", c
        assert c["recompiles"] == "0" and c["cudagraph_skips"] == "0", c
    by = {c["method"]: c for c in cases}
    assert int(by["token_recycling"]["max_rows"]) < 128 < int(by["token_recycling"]["rows_x_group"])
    assert by["fafo_stream"]["max_rows"] == "481" and by["swift"]["compiled"] == "1"
    assert by["quantspec_fp16"]["compiled"] == "1" and by["quantspec_fp16"]["graphs"] != "0"  # its INT4 drafts too
    assert by["longspec"]["compiled"] == "1" and int(by["longspec"]["graphs"]) > 1  # its draft's graphs too

    curve = CostCurve.load(out / "cpu.csv")
    assert sorted(curve.table) == [64, 256] and all(sorted(s) == [1, 8, 64] for s in curve.table.values())
    assert sorted(curve.batches) == [1, 2] and sorted(curve.batches[2][64]) == [1, 8]  # 2 rows at once, context 64
    assert set(curve.methods) == {"vanilla", "fafo_stream", "lookahead", "token_recycling"}
    assert all(m["step_ms"] > 0 and m["host_ms"] >= 0 and m["steps"] >= 1 for m in curve.methods.values())
    decode = list(csv.DictReader(open(out / "decode.csv")))
    assert [(r["context"], r["variant"]) for r in decode] == [("64", "ours"), ("64", "transformers"),
                                                              ("256", "ours"), ("256", "transformers")]
    assert all(0 < float(r["roofline_fraction"]) and r["tokens_equal_ours"] in ("", "8/8") for r in decode)
    compare = list(csv.DictReader(open(out / "cli_compare.csv")))
    assert len(compare) == 4 and all(float(r["exact_match_rate"]) == 1.0 for r in compare)


def _stand_ins(calls):
    def ok(budget, result, settings, state, out):
        calls.append(result.name)
        result.summary = "fine"

    def boom(budget, result, settings, state, out):
        calls.append(result.name)
        raise ValueError("the kernel broke")

    return {"preflight": ok, "correctness": boom, "decode": ok, "curve": ok, "methods": ok, "cli": ok}


def test_a_failing_stage_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch, capsys):
    import fafo.bench.gpu_check.run as run

    calls = []
    monkeypatch.setattr(run, "stage_functions", lambda: _stand_ins(calls))
    code = run.main(["--device", "cpu", "--out", str(tmp_path), "--stages", "preflight", "correctness", "decode"])
    assert code == 1 and calls == ["preflight", "correctness", "decode"]
    report = (tmp_path / "gpu_check.md").read_text()
    assert report.startswith("# GPU self-check: FAILED")
    assert "ValueError: the kernel broke" in report and "Traceback" in report
    printed = capsys.readouterr().out
    assert "| correctness | failed |" in printed and "| decode | ok |" in printed
    assert "| cli | not selected |" in printed


def test_the_big_model_is_released_before_the_command_line_stage(tmp_path, monkeypatch):
    """The CLI stage's child process must not find the check's own 7B model on the GPU (on an H200 it then took
    14 GB of the check's for another process's and warned that the machine was busy)."""
    import fafo.bench.gpu_check.big_model as big_model
    import fafo.bench.gpu_check.run as run

    calls = []
    stand_ins = _stand_ins(calls)
    stand_ins["correctness"] = stand_ins["preflight"]
    monkeypatch.setattr(run, "stage_functions", lambda: stand_ins)
    monkeypatch.setattr(big_model.CheckState, "release", lambda self: calls.append("release"))
    assert run.main(["--device", "cpu", "--out", str(tmp_path), "--stages", "methods", "cli"]) == 0
    assert calls == ["methods", "release", "cli", "release"]
    verdict = (tmp_path / "gpu_check.md").read_text().splitlines()[0]  # stages left out are not "skipped for time"
    assert verdict == "# GPU self-check: PASSED (stages not selected: preflight, correctness, decode, curve)"


def test_budget_skips_what_no_longer_fits():
    result = StageResult("x", "x", 1.0)
    budget = Budget(result, time.perf_counter() + 0.3)
    ran = []
    for item in budget.each(["a", "b", "c"]):
        ran.append(item)
        time.sleep(0.2)  # 0.1 s left after the first: less than the longest item so far
    assert ran == ["a"] and result.skipped == ["b", "c"]


def test_a_stage_past_its_deadline_is_interrupted():
    def slow(budget, result):
        for _ in budget.each(["first", "second"]):
            time.sleep(5)

    result = run_stage(StageResult("x", "x", 1.5), slow, time.perf_counter() + 1.5, grace=0.2)
    assert result.status == "partial" and result.seconds < 3
    assert result.skipped == ["first (interrupted)", "second"] and "out of time" in result.errors[0]


def test_budgets_fit_eight_minutes_and_scale():
    assert sum(BUDGETS.values()) <= 430  # 50 s of the 8 minutes left for start-up and a stage's grace
    s = settings_for("cpu", quick=True, budget_s=90)
    assert sum(s.budgets.values()) == pytest.approx(90)
    assert s.compile.backend == "aot_eager" and s.compile.attention_for(s.device) == "flex"


def test_cuda_without_a_gpu_is_one_clear_error(capsys, monkeypatch):
    import torch

    from fafo.bench.gpu_check.run import parse_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--device", "cuda"])
    assert "no CUDA device is visible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--device", "cpu", "--methods", "vanilla", "medusa"])
    assert "--methods: medusa not a draftless method" in capsys.readouterr().err


def test_engine_stages_import_no_hydra():
    """Stages 1-4 run on a node without hydra-core/omegaconf (only the command line stage needs them)."""
    code = ("import sys\n"
            "sys.modules.update(dict.fromkeys(['hydra', 'omegaconf', 'antlr4']))\n"  # as if not installed
            "import fafo.bench.gpu_check.run, fafo.bench.gpu_check.preflight, fafo.bench.gpu_check.correctness\n"
            "import fafo.bench.gpu_check.decode, fafo.bench.gpu_check.curve, fafo.bench.gpu_check.cli\n"
            "print(sorted(m for m in ('hydra', 'omegaconf', 'antlr4') if sys.modules[m] is not None))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_an_interrupted_methods_stage_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """On an H100 the methods stage ran out of time in its fourth method and its CSV had kept none of the three
    measured before (they were written only at the end); now each method's row is written when measured and the
    summary is made however the stage ends."""
    import fafo.bench.gpu_check.curve as curve_module
    from fafo.bench.gpu_check.big_model import CheckState
    from fafo.bench.gpu_check.stages import StageTimeout

    settings = settings_for("cpu", quick=True)
    settings.timed_methods = ("vanilla", "prompt_lookup")
    real = curve_module.build_method

    def second_times_out(name, small):
        if name == "prompt_lookup":
            raise StageTimeout()  # what the stage's alarm raises past its deadline
        return real(name, small)

    monkeypatch.setattr(curve_module, "build_method", second_times_out)
    result = run_stage(StageResult("methods", "methods", 60), curve_module.methods_stage, time.perf_counter() + 600,
                       settings, CheckState(), tmp_path)
    assert result.status == "partial" and result.skipped == ["prompt_lookup (interrupted)"]
    assert result.summary.startswith("1 methods in cpu.csv") and "| vanilla |" in result.sections[0]
    rows = list(csv.DictReader(open(tmp_path / "cpu.csv")))
    assert [(r["row"], r["method"]) for r in rows] == [("method", "vanilla")] and float(rows[0]["step_ms"]) > 0


def test_the_acceptance_script_runs_the_untimed_stages_together_then_the_timed_ones_alone(tmp_path):
    """``scripts/gpu_acceptance.sh`` with a stand-in interpreter that records its arguments: the four correctness
    groups, the command line and five compile warm-ups start together with the budgets asked for; the timed stages
    start only once all of them have ended, then every method's host time on 4 layers, and each report's summary is
    printed."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
out=$(python3 -c 'import sys; a = sys.argv[1:]; print(a[a.index("--out") + 1])' "$@")
echo "start $*" >>{log}
sleep 1
mkdir -p "$out"
printf '## Summary\\n| stage | status |\\n|---|---|\\n| x | ok |\\n| y | not selected |\\n## 1. Preflight\\n' >"$out/gpu_check.md"
echo "end $*" >>{log}
""")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_acceptance.sh"), str(tmp_path / "out"), "200", "210",
                           "60"],
                          env={**ENV, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    starts = [line for line in lines if line.startswith("start")]
    assert len(starts) == 12
    for g in (4, 7, 1, 3):
        assert sum(f"--stages correctness --groups {g} --budget-s 573" in s for s in starts) == 1  # 200 s of 150
    assert sum("--stages cli --budget-s 1563" in s for s in starts) == 1
    warm = [s for s in starts if "/warm-" in s]
    assert len(warm) == 5 and sum("--stages methods" in s for s in warm) == 3
    assert sum("--stages methods --method-layers 4" in s and "--methods" not in s for s in warm) == 1  # all, shallow
    halves = [set(s.split("--methods ")[1].split()) for s in warm if "--methods" in s]
    assert not halves[0] & halves[1] and halves[0] | halves[1] == set(METHODS)  # every method warmed, once
    timed = "--stages preflight decode curve methods --budget-s 401"  # 210 s for stages of 225 s by default
    assert timed in lines[-4] and timed in lines[-3]  # started after every process of phase 1 had ended
    host = "--stages methods --method-layers 4 --budget-s 573"  # 60 s for the methods stage's 45
    assert host in lines[-2] and host in lines[-1]  # then alone too
    assert all(line.startswith("start") for line in lines[:10])  # the first ten ran side by side
    assert proc.stdout.count("| x | ok |") == 7 and "not selected" not in proc.stdout


def test_the_big_cache_is_sized_alike_whichever_methods_are_selected():
    """Its size is part of every compiled graph: processes timing different methods must build the same graphs to
    share inductor's caches (the acceptance script warms them in two halves)."""
    from fafo.bench.gpu_check.big_model import capacity

    sizes = {capacity(settings_for("cpu", quick=False, methods=m)) for m in (None, ["vanilla"], ["lookahead"])}
    assert len(sizes) == 1


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_methods_stage_prompt_outgrows_every_fafo_budget_within_the_models_context(device):
    """On a prompt within its budget a FAFO region holds every entry and never swaps, so the stage would time FAFO
    without its bookkeeping: the prompt must exceed each preset's budget, and the cache fit the big shape (the 7B
    one on CUDA, its toy on a CPU, whose check then runs the same swaps)."""
    from fafo.bench.gpu_check.big_model import capacity
    from fafo.bench.gpu_check.methods import build_method
    from fafo.bench.tools.random_model import SHAPES

    settings = settings_for(device, quick=False)
    methods = {name: build_method(name, small=False) for name in METHODS}
    budgets = {name: m.compress.budget for name, m in methods.items() if hasattr(m, "compress")}
    assert set(budgets) == {"fafo_stream", "fafo_quest", "fafo_snapkv", "fafo_2forward"}
    assert max(budgets.values()) < settings.method_prompt
    assert capacity(settings) <= SHAPES[settings.big_shape]["max_position_embeddings"]


def test_the_flex_probe_checks_against_a_right_reference_and_needs_cuda(monkeypatch):
    """``scripts/gpu_flex_probe.py`` judges each template against its float64 reference: that reference equals
    SDPA with the same mask (both mask kinds), and without CUDA the probe refuses to run (exit 2)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_flex_probe", REPO / "scripts" / "gpu_flex_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    for kind, K in (("causal", 11), ("length", 300)):
        mask = probe.visible(kind, 11, K, "cpu")
        assert mask.shape == (11, K) and (not mask.all()) and mask.any(-1).all()
        q, k, v = torch.randn(1, 8, 11, 16), torch.randn(1, 2, K, 16), torch.randn(1, 2, K, 16)
        expected = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask, scale=0.25)
        assert torch.allclose(probe.reference(q, k, v, 0.25, mask).float(), expected, atol=1e-5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert probe.main() == 2


def test_a_batch_case_warmed_on_every_row_bucket_does_not_recompile(tmp_path):
    """Token Recycling's four requests on the group-7 model finish in another order in the compared batch than in a
    warm-up of the same four (its matrix learnt meanwhile): the batch shrinks to one row, a bucket that warm-up never
    ran, and the step compiled inside the comparison (seen on an H200 and on the CPU). Warmed as the runner warms
    (a batch per row bucket: 4, 2, 1), nothing compiles afterwards and the tokens are vanilla's."""
    from fafo.bench.gpu_check.correctness import GroupModel, run_batch_case
    from fafo.engine.batching import bucket_fillers

    assert bucket_fillers(4, 4) == [4, 2, 1] and bucket_fillers(3, 4) == [3, 2, 1]
    assert bucket_fillers(6, 6) == [6, 4, 2, 1]
    settings = settings_for("cpu", quick=False, groups=[7])
    model = GroupModel(7, settings, tmp_path, ["token_recycling"])
    row = run_batch_case(model, "token_recycling", settings)
    assert (row["recompiles"], row["divergences"], row["status"]) == (0, 0, "ok"), row


def test_the_tree_probe_runs_one_variant_per_process_and_refuses_an_unknown_one():
    """``scripts/gpu_tree_probe.py`` (the CUDA path traced on the CPU here): a variant's cases in one line each, and
    a variant it does not know is one line naming those it does, before a model is built."""
    probe = [sys.executable, str(REPO / "scripts" / "gpu_tree_probe.py"), "prompt_lookup", "token_recycling"]
    run = subprocess.run(probe, capture_output=True, text=True, cwd=REPO, env={**ENV, "VARIANT": "decoding"},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert [line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("[")] == \
        ["[decoding g4] prompt_lookup", "[decoding g4] token_recycling"]
    assert run.stdout.count(": ok identical 3/3 recompiles 0") == 2
    bad = subprocess.run(probe, capture_output=True, text=True, cwd=REPO, env={**ENV, "VARIANT": "nochunk"},
                         timeout=120)
    assert bad.returncode != 0 and "VARIANT='nochunk' is not one of control, nocg" in bad.stderr


def test_the_methods_stage_on_fewer_layers_says_so_and_its_host_times_are_read(tmp_path):
    """``--method-layers 2``: the methods stage builds the big shape's widths with 2 layers; each row says so, the
    summary says which numbers stand for the whole model, and bench.cost_curve reads the host times from the file."""
    from fafo.bench.tools.cost_curve import CostCurve, write_device_csv

    cmd = [sys.executable, "-m", "fafo.bench.gpu_check", "--device", "cpu", "--out", str(tmp_path), "--stages",
           "methods", "--methods", "vanilla", "prompt_lookup"]
    run = subprocess.run(cmd + ["--method-layers", "2"], capture_output=True, text=True, cwd=REPO, env=ENV,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "cpu.csv")))
    assert [(r["method"], r["layers"]) for r in rows] == [("vanilla", "2"), ("prompt_lookup", "2")]
    assert "on 2 layers: host times as on all, step times not" in (tmp_path / "gpu_check.md").read_text()
    merged = write_device_csv(tmp_path / "merged.csv", [{"context": 64, "step_tokens": 1, "median_ms": 1.0}], rows,
                              {})  # as such rows join a device file's curve
    assert CostCurve.load(merged).host_ms("prompt_lookup") == float(rows[1]["host_ms"]) > 0
    bad = subprocess.run(cmd + ["--method-layers", "0"], capture_output=True, text=True, cwd=REPO, env=ENV,
                         timeout=120)
    assert bad.returncode == 2 and "--method-layers must be >= 1" in bad.stderr


def test_the_tree_probes_decoding_variant_routes_short_steps_to_a_decoding_kernel_that_exists():
    """The probe's ``decoding`` variant lifts rule 2 only where torch's rule gives the decoding template a config
    (query rows x padded group <= 128); every other call keeps the engine's route, and every route has a kernel."""
    import importlib.util

    from fafo.engine.flex_routing import flex_route, lowered_kernel, next_power_of_2

    spec = importlib.util.spec_from_file_location("gpu_tree_probe", REPO / "scripts" / "gpu_tree_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    lifted = probe.decoding_route(flex_route)
    for hq, hkv in ((32, 8), (28, 4), (8, 2), (4, 4), (7, 1)):
        group = next_power_of_2(hq // hkv)
        for q in range(1, 130):
            route = lifted(q, hq, hkv)
            kernel, ok = lowered_kernel(q, route.heads, hkv, 128, route.options)
            assert ok and kernel == route.kernel, (hq, hkv, q)
            if 1 < q < 128 and q * group <= 128:
                assert route.kernel == "decoding" and route.heads == hkv * group
            else:
                assert route == flex_route(q, hq, hkv)
