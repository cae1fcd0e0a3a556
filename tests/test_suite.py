"""The run's orchestration without pytest (sglperf.suite): servers and locks are released on every path, and the
fingerprint's args hash is the same in every checkout."""

import dataclasses
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from filelock import FileLock

from sglperf.run import launch as launcher
from sglperf.categories import UsageError
from sglperf.run.session import Suite
from sglperf.run.options import SuiteOptions

ROOT = Path(__file__).resolve().parent.parent


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def test_a_failure_after_launch_stops_the_server_and_frees_the_gpu_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLPERF_FINGERPRINT_OVERRIDES", "{not json")
    started = []
    real_launch = launcher.launch

    def launch_and_remember(spec):
        started.append(real_launch(spec))
        return started[-1]

    monkeypatch.setattr(launcher, "launch", launch_and_remember)
    suite = Suite(SuiteOptions(reports_dir=tmp_path / "reports", profiles=("sim-ci",), levels=(8,)))
    with pytest.raises(UsageError, match="SGLPERF_FINGERPRINT_OVERRIDES is not valid JSON"):
        suite.open_config("sim-ci", "rr24-cds4")
    [srv] = started
    assert srv.proc.poll() is not None, "the server was launched and then stopped"
    assert group_members(srv.pid) == [], "nothing of the server's process group is left"
    [lock_file] = (tmp_path / "reports" / ".locks").glob("gpu-set-*.lock")
    lock = FileLock(str(lock_file))
    lock.acquire(timeout=0)  # raises Timeout if the suite still held it
    lock.release()


def test_a_config_started_again_after_another_opened_stops_that_one_instead_of_waiting_on_its_lock(tmp_path):
    """The A/B re-measures the base config after the tuned config's tests, while the tuned server still holds the
    GPU-set lock: the tuned server is stopped first (configs never run side by side), and whatever was started
    after its tests ended is stopped when the run finishes."""
    suite = Suite(SuiteOptions(reports_dir=tmp_path / "reports", profiles=("sim-ci",), levels=(8,),
                               gpu_lock_timeout=5))
    base = suite.open_config("sim-ci", "rr24-cds4")
    tuned = suite.open_config("sim-ci", "rr64-cds8")
    assert base.server.teardown is not None and tuned.server.teardown is None
    suite.restart(base)  # would wait 5 s on the lock, then fail
    assert tuned.server.teardown is not None and base.server.teardown is None and base.starts == 2
    pid = base.server.pid
    suite.finish(interrupted=False)
    assert base.server.teardown is not None and group_members(pid) == [] and not suite.late_problems


def test_a_failure_during_launch_frees_the_gpu_lock(tmp_path):
    suite = Suite(SuiteOptions(reports_dir=tmp_path / "reports", profiles=("sim-ci",),
                               server_args=("--no-such-flag",)))
    with pytest.raises(launcher.LaunchError, match="unrecognized arguments: --no-such-flag"):
        suite.open_config("sim-ci", "rr24-cds4")
    [lock_file] = (tmp_path / "reports" / ".locks").glob("gpu-set-*.lock")
    lock = FileLock(str(lock_file))
    lock.acquire(timeout=0)
    lock.release()


HASH = ("from sglperf.run import profiles\nfrom sglperf.environment import fingerprint\n"
        "for name, config in (('sim-ci', 'rr24-cds4'), ('cpu-llamacpp', 'p4'), ('glm5-nvfp4-tp8', 'rr1024-cds4')):\n"
        "    p = profiles.load(name)\n"
        "    print(name, fingerprint.args_hash(p.launch_argv(config, resolve=False)), p.launch_argv(config)[0])\n")


def test_two_checkouts_at_different_paths_hash_the_same_config_the_same(tmp_path):
    outs = []
    for where in ("a/deep/checkout", "b"):
        co = tmp_path / where
        shutil.copytree(ROOT / "sglperf", co / "sglperf", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "profiles", co / "profiles")
        (co / "bin").mkdir()
        (co / "bin" / "python").symlink_to(sys.executable)  # another interpreter path, as in a fresh venv
        path = os.pathsep.join([str(co), *site.getsitepackages()])  # this checkout first, then the venv's packages
        env = {**os.environ, "PYTHONPATH": path, "SGLPERF_CACHE": str(co / "cache")}
        p = subprocess.run([str(co / "bin" / "python"), "-c", HASH], cwd=co, env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        outs.append([line.split() for line in p.stdout.splitlines()])
    a, b = outs
    assert [(n, h) for n, h, _ in a] == [(n, h) for n, h, _ in b], "same config, same hash"
    assert a[0][2] != b[0][2] and a[1][2] != b[1][2], "while the resolved commands differ (interpreter, cache)"


def test_a_counter_that_moves_at_completion_is_allowed_one_cohort_at_each_window_edge_plus_the_scrapes_timing():

    from sglperf.judge.count import server_agreement

    from .rundocs import result

    r = dataclasses.replace(result(32, value=680.0), osl=32, window_s=13.0, server_output_tps=695.0)
    tol, why = server_agreement(dataclasses.replace(r, server_count_at_completion=True), tolerance=0.02, cap=8)
    assert tol == pytest.approx(2 * 8 * 32 / (695.0 * 13.0)) and "uncertain by up to 256 tokens" in why
    sim = dict(tolerance=0.02, cap=8)
    r = dataclasses.replace(r, server_count_at_completion=False)  # per-token counters (SGLang not drafting)
    assert server_agreement(r, **sim) == (0.02, "±2%")  # the profile's bound

    # scrapes answered in 240 ms round trips at both edges: the counter is known to +/-120 ms at each
    # ... and a client whose loop ran 10 ms late (p99): its token times at each edge are that late
    slow = dataclasses.replace(r, server_edges_uncertainty_s=0.24, client_lag_p99_ms=10.0)
    tol, why = server_agreement(slow, **sim)
    assert tol == pytest.approx(0.02 + (0.24 + 0.02) / 13.0)
    assert "+ 2.0% for timing at the window's edges (240 ms of scrape round trip, 2 x 10 ms of client loop lag" in why


def test_a_per_token_counter_is_known_to_one_decode_step_at_each_edge():
    """Real SGLang 0.5.23 on this CPU, cpu-sglang rr32 c16 (a CI run): 16 running, the server's counter read 348.4
    tok/s over a 4.6 s window against the client's 337.3 (ratio 0.968), and was called a disagreement at ±3.1%.
    Its counter moves 16 tokens a step: each window edge is known to a step, 2.0% of the window's tokens."""
    from sglperf.judge.count import server_agreement

    from .rundocs import result

    r = dataclasses.replace(result(16, value=337.3), window_s=4.6, server_output_tps=348.4, server_ratio=0.9682,
                            server_mean_running=16.0, server_count_at_completion=False)
    tol, why = server_agreement(r, tolerance=0.02, cap=32)
    assert tol == pytest.approx(0.02 + 2 * 16 / (348.4 * 4.6))
    assert abs(r.server_ratio - 1) <= tol and "one decode step at each edge (16 tokens a step" in why
    fast = dataclasses.replace(r, window_s=8.0, server_output_tps=4400.0)  # the GLM MoE on an H100: nothing to add
    assert server_agreement(fast, tolerance=0.02, cap=16)[0] == pytest.approx(0.02 + 2 * 16 / (4400.0 * 8.0))
    assert 2 * 16 / (4400.0 * 8.0) < 0.001


def test_levels_of_several_starts_are_compared_only_with_the_baselines_between_start_noise_in_their_intervals(
        tmp_path):
    """What an undecided plateau falls back on when no start may measure its levels together (test_plateau): each
    level over its starts as the floor judged them, each interval widened by the committed baseline's between-start
    noise; nothing while every level has one start."""
    suite = Suite(SuiteOptions(reports_dir=tmp_path / "reports", profiles=("sim-ci",), levels=(32, 64)))
    try:
        run = suite.open_config("sim-ci", "rr24-cds4")
        first = {lv: suite.measure(run, lv).result for lv in (32, 64)}
        assert run.over_starts([32, 64]) is None, "one start each: the plateau compares them as they are"
        starts = run.replicate(64, "a test's second start")
        assert starts is not None and len(starts) == 2
        over = run.over_starts([32, 64])
        values = [m.result.sustained_output_tps for m in starts]
        assert min(values) <= over[64].sustained_output_tps <= max(values)
        for lv in (32, 64):
            assert over[lv].sustained_output_tps_ci95 > first[lv].sustained_output_tps_ci95 / (2 if lv == 64 else 1)
        assert over[32].sustained_output_tps == first[32].sustained_output_tps
    finally:
        suite.finish(interrupted=False)
