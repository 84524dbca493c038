"""Sweeps through ``hydra/launcher=slurm`` on a real one-node SLURM (scripts/slurm_local.sh), and the clean stop
on a scheduler's signals (fafo.bench.tools.preempt) on its own.

The SLURM tests need root and either SLURM + munge or apt-get to install them (CI runs as root); otherwise they
skip with the reason. One scheduler serves the module; it is stopped at the end.
"""

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fafo.bench.tools import preempt
from fafo.bench.records import RecordWriter, row_crc

pytestmark = pytest.mark.slow  # sweeps on a local SLURM cluster: the full tier (make test), not make test-fast

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
METHODS = ["vanilla", "lookahead", "fafo_stream"]
# 14 rows per job (12 built-in prompts, one with 3 turns), each of exactly 24 tokens
BENCH = ["model=tiny_llama", "bench.max_new_tokens=24", "bench.ignore_eos=true", "bench.warmup=0",
         "bench.progress=false", "wandb.mode=disabled"]
ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=local", "hydra.launcher.gpus_per_node=0",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=20",
            "hydra.launcher.poll_s=1", "hydra.launcher.result_grace_s=2", "hydra.launcher.preempt_grace_s=10"]


def _why_no_slurm() -> str | None:
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        return "hydra-submitit-launcher is not installed (pip install -c constraints.txt -e '.[slurm]')"
    if os.geteuid() != 0:
        return "a local SLURM needs root (slurmd starts jobs as their users)"
    have = all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "sbatch"))
    if not have and not shutil.which("apt-get"):
        return "SLURM (slurm-wlm, munge) is not installed and apt-get is not available to install it"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm():
    """Environment of a running one-node SLURM (its own state directory and ports), stopped after the module."""
    reason = _why_no_slurm()
    if reason:
        print(f"SKIPPED tests/test_slurm.py SLURM tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    state = tempfile.mkdtemp(prefix="fafo-slurm-")  # short: munge's socket path must stay under 108 bytes
    env = {**os.environ, "FAFO_SLURM_DIR": state, "FAFO_SLURM_PORT": str(_free_port()),
           "FAFO_SLURMD_PORT": str(_free_port())}
    up = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    env = {**env, "SLURM_CONF": f"{state}/slurm.conf", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    yield env
    down = subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "SLURM down" in down.stdout
    shutil.rmtree(state, ignore_errors=True)


def sweep(out: Path, env: dict, *extra: str, wait: bool = True):
    cmd = [sys.executable, "-m", "fafo.bench", "-m", f"method={','.join(METHODS)}", *BENCH,
           f"bench.output_dir={out}", *extra]
    if not wait:
        return subprocess.Popen(cmd, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=900)


def run_dir(out: Path, method: str) -> Path:
    found = [p.parent for p in out.glob(f"tiny_llama/builtin/{method}/*/.hydra")]
    assert len(found) == 1, f"{method}: run directories {found}"
    return found[0]


def records(path: Path) -> tuple[list[dict], dict]:
    """(rows of samples.csv, {(sample, turn): tokens}) after checking every line is whole and its crc valid."""
    text = (path / "samples.csv").read_text()
    assert text.endswith("\n"), "torn last row"
    rows = list(csv.DictReader(text.splitlines(keepends=True)))
    assert all(r["crc"] == row_crc(r) and r["status"] == "ok" for r in rows), "a torn, garbled or failed row"
    outputs = {}
    for line in (path / "outputs.jsonl").read_text().splitlines():
        o = json.loads(line)
        assert (o["sample_id"], o["turn"]) not in outputs, "a duplicated output"
        outputs[(o["sample_id"], o["turn"])] = o["tokens"]
    return rows, outputs


def keys(rows: list[dict]) -> list[tuple]:
    return [(r["sample_id"], int(r["turn"]), int(r["repeat"])) for r in rows]


@pytest.fixture(scope="module")
def local_sweep(slurm, tmp_path_factory):
    """The same sweep run by the local launcher: {method: (rows, outputs)} of an undisturbed run."""
    out = tmp_path_factory.mktemp("local") / "runs"
    done = sweep(out, slurm)
    assert done.returncode == 0, done.stderr[-3000:]
    return {m: records(run_dir(out, m)) for m in METHODS}


def assert_same_records(got: tuple, local: tuple, method: str) -> None:
    rows, outputs = got
    assert sorted(keys(rows)) == sorted(keys(local[0])), f"{method}: rows differ from the local run's"
    assert len(set(keys(rows))) == len(rows) == 14, f"{method}: duplicated rows"
    assert outputs == local[1], f"{method}: token ids differ from the local run's"


def test_a_slurm_sweep_has_the_rows_and_tokens_of_the_same_sweep_run_locally(slurm, local_sweep, tmp_path):
    out = tmp_path / "runs"
    done = sweep(out, slurm, *ON_SLURM)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== fafo-bench sweep: 3 jobs, 0 failed ==" in done.stdout
    assert sum(line.startswith("ok ") for line in done.stdout.splitlines()) == 3
    for method in METHODS:
        assert_same_records(records(run_dir(out, method)), local_sweep[method], method)
    # every job ran as a task of one SLURM array; sbatch script and logs under the sweep directory
    assert len(list(out.glob(".submitit/*/*_submission.sh"))) == 1
    logs = list(out.glob(".submitit/*_*/*_0_log.out"))
    assert len(logs) == 3 and all("Job completed successfully" in p.read_text() for p in logs)


def _wait_for_rows(out: Path, method: str, at_least: int, proc, deadline: float) -> list[str]:
    """Whole lines of a job's samples.csv (header first) once it has ``at_least`` rows and is not done."""
    while time.time() < deadline:
        assert proc.poll() is None, "the sweep ended before its job could be disturbed"
        for path in out.glob(f"tiny_llama/builtin/{method}/*/samples.csv"):
            lines = path.read_text().splitlines(keepends=True)
            lines = [ln for ln in lines if ln.endswith("\n")]
            if len(lines) - 1 >= at_least:
                assert len(lines) - 1 < 14, f"{method}: finished before it could be disturbed"
                return lines
        time.sleep(0.05)
    raise AssertionError(f"{method}: no {at_least} rows in time")


def _job_id(out: Path, index: int) -> str:
    ids = [p.name for p in out.glob(f".submitit/*_{index}")]
    assert len(ids) == 1, ids
    return ids[0]


def _sigkill(job_id: str, env: dict) -> None:
    """SIGKILL the job's process itself, as the kernel's OOM killer would: no handler runs. (``scancel
    --signal=KILL`` is a cancel in SLURM: SIGTERM first, SIGKILL after KillWait; the guard stops cleanly then.)"""
    raw = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%A"], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()  # scontrol listpids wants the array task's own job id
    listing = subprocess.run(["scontrol", "listpids", raw], env=env, capture_output=True, text=True, check=True)
    pids = [int(f[0]) for f in (ln.split() for ln in listing.stdout.splitlines()[1:]) if f[2:4] == ["0", "0"]]
    assert pids, listing.stdout
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def test_preempted_and_killed_jobs_end_with_exactly_the_rows_of_an_undisturbed_run(slurm, local_sweep, tmp_path):
    """Preemption by ``scancel --signal=TERM`` (the job stops cleanly and requeues itself), by ``scontrol requeue``
    (SLURM requeues it) and a SIGKILL of the job's process (the sweep names the job; re-running the sweep resubmits
    it): each job ends with every row once, none torn, and the rows written before the disturbance unchanged (not
    recomputed)."""
    out = tmp_path / "runs"
    out.mkdir()
    procs = []
    try:
        _disturb_and_resubmit(out, slurm, local_sweep, procs)
    finally:  # a failed check leaves no sweep process waiting on the scheduler
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def _disturb_and_resubmit(out: Path, slurm: dict, local_sweep: dict, procs: list) -> None:
    proc = sweep(out, slurm, *ON_SLURM, wait=False)
    procs.append(proc)
    deadline = time.time() + 600
    term_before = _wait_for_rows(out, "lookahead", 2, proc, deadline)
    subprocess.run(["scancel", "--signal=TERM", _job_id(out, 1)], env=slurm, check=True)
    kill_before = _wait_for_rows(out, "fafo_stream", 1, proc, deadline)
    _sigkill(_job_id(out, 2), slurm)
    stdout, stderr = proc.communicate(timeout=600)
    # the killed job is named, the sweep exits non-zero; the preempted one was requeued and finished
    assert proc.returncode == 1, stderr[-3000:]
    failed = [ln for ln in stdout.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 1 and "method=fafo_stream" in failed[0] and "without a result" in failed[0], stdout
    lookahead = records(run_dir(out, "lookahead"))
    assert_same_records(lookahead, local_sweep["lookahead"], "lookahead")
    log = next(out.glob(f".submitit/{_job_id(out, 1)}/*_0_log.err")).read_text()
    assert "SIGTERM: stopped cleanly" in log and "requeueing SLURM job" in log
    killed = (run_dir(out, "fafo_stream") / "samples.csv").read_text().splitlines(keepends=True)
    assert len(killed) - 1 < 14
    finished = {m: (run_dir(out, m) / "samples.csv").read_text() for m in ("vanilla", "lookahead")}

    # resubmission: the same sweep again; the finished jobs compute nothing, the killed one resumes, and is
    # requeued by SLURM itself (scontrol requeue) on the way
    proc = sweep(out, slurm, *ON_SLURM, wait=False)
    procs.append(proc)
    requeue_before = _wait_for_rows(out, "fafo_stream", len(killed), proc, time.time() + 600)
    requeue_id = max((p.name for p in out.glob(".submitit/*_2")), key=lambda n: int(n.split("_")[0]))  # newest
    subprocess.run(["scontrol", "requeue", requeue_id], env=slurm, check=True)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert "== fafo-bench sweep: 3 jobs, 0 failed ==" in stdout
    for method in METHODS:
        assert_same_records(records(run_dir(out, method)), local_sweep[method], method)
    final = {m: (run_dir(out, m) / "samples.csv").read_text().splitlines(keepends=True) for m in METHODS}
    for method, before in (("lookahead", term_before), ("fafo_stream", kill_before), ("fafo_stream", killed),
                           ("fafo_stream", requeue_before)):
        assert final[method][: len(before)] == before, f"{method}: rows written before the disturbance changed"
    for method, text in finished.items():  # finished jobs were resubmitted and computed nothing
        assert (run_dir(out, method) / "samples.csv").read_text() == text, f"{method}: rows recomputed"
    assert "Restarts=1" in subprocess.run(["scontrol", "show", "job", requeue_id], env=slurm, capture_output=True,
                                          text=True).stdout


def test_a_failing_job_makes_the_slurm_sweep_exit_non_zero_and_is_named(slurm, tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "fafo.bench", "-m", "method=vanilla", "bench.max_samples=2,-1", *BENCH,
           f"bench.output_dir={out}", *ON_SLURM]
    done = subprocess.run(cmd, cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "== fafo-bench sweep: 2 jobs, 1 failed ==" in done.stdout
    failed = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 1 and "bench.max_samples=-1" in failed[0] and "error:" in failed[0], done.stdout
    assert "1 of 2 sweep jobs failed" in done.stderr
    ok_dir = next(out.glob("tiny_llama/builtin/vanilla/*max_samples=2*"))
    assert len(records(ok_dir)[0]) == 2  # the other job's rows are all there
    assert "bench.max_samples=-1 must be null or an integer >= 1" in next(out.glob("tiny_llama/builtin/vanilla/*max_samples=-1*/error.txt")
                                                 ).read_text()


# ------------------------------------------------------------------ the clean stop itself (no SLURM needed)
def test_a_stop_signal_lets_the_sample_finish_then_stops_at_the_boundary():
    guard = preempt.PreemptGuard(default_s=30).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the sample in progress goes on
        assert guard.stopping
        with pytest.raises(preempt.Preempted) as stop:
            preempt.sample_done()
        assert stop.value.signum == signal.SIGTERM and not stop.value.abandoned
    finally:
        guard.uninstall()
    preempt.sample_done()  # no guard: nothing happens


def test_a_sample_past_its_grace_is_abandoned_but_a_record_write_completes_first(tmp_path, monkeypatch):
    writer = RecordWriter(tmp_path)
    row = {"sample_id": "a", "turn": 0, "repeat": 0, "status": "ok"}
    slow_fsync = os.fsync

    def fsync(fd):  # a record write that outlasts the grace
        time.sleep(0.3)
        slow_fsync(fd)

    guard = preempt.PreemptGuard({signal.SIGUSR2: 0.05}).install()
    try:
        with pytest.raises(preempt.Preempted) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            monkeypatch.setattr(os, "fsync", fsync)
            writer.write(row, {"sample_id": "a", "turn": 0, "tokens": [1, 2], "text": "x"})
            monkeypatch.setattr(os, "fsync", slow_fsync)
            while True:  # the sample in progress: abandoned at the deadline
                time.sleep(0.01)
        assert stop.value.abandoned and stop.value.signum == signal.SIGUSR2
    finally:
        guard.uninstall()
        monkeypatch.setattr(os, "fsync", slow_fsync)
    writer.close()
    again = RecordWriter(tmp_path)
    assert again.repairs == [] and again.check({("a", 0, 0)}) == []
    again.close()


def test_slurm_time_limits_follow_the_presets_estimates():
    from tests.helpers import compose_with

    assert compose_with("experiment=table9", "hydra/launcher=slurm").hydra.launcher.timeout_min == 60
    assert compose_with("experiment=table2", "hydra/launcher=slurm").hydra.launcher.timeout_min == 1140
    assert compose_with("experiment=table6", "hydra/launcher=slurm").hydra.launcher.timeout_min == 1440
    assert compose_with("hydra/launcher=slurm").hydra.launcher.timeout_min == 1440  # no preset: 24 h


def test_without_sbatch_a_slurm_sweep_stops_with_one_error_line(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:/nonexistent"}
    cmd = [sys.executable, "-m", "fafo.bench", "-m", "method=vanilla", *BENCH, f"bench.output_dir={tmp_path}",
           "hydra/launcher=slurm"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: hydra/launcher=slurm")


def test_a_submission_sbatch_refuses_stops_the_sweep_with_one_error_line(tmp_path):
    """sbatch exits non-zero (a wrong partition, no controller): its reason in one line, not submitit's trace."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition "
                                    "name specified' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "fafo.bench", "-m", "method=vanilla", *BENCH, f"bench.output_dir={tmp_path / 'out'}",
           "hydra/launcher=slurm"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert last.startswith("error: sbatch refused the sweep's job array: sbatch: error: Batch job submission failed: "
                           "Invalid partition name specified; fix"), last


def test_slurm_local_needs_root_and_says_so_in_one_line(tmp_path):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to run the script as another user")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SCRIPT), "up"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FAFO_SLURM_DIR": str(tmp_path / "slurm")})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "must run as root" in done.stderr

