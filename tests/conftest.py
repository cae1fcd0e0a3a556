"""Helpers for the suite's own tests: start simulator processes through the real launcher, and check that no
process started by a test outlives it."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from sglperf.run.launch import LaunchSpec, Server, launch

SIM = [sys.executable, "-m", "sglperf.sim"]
# The tests that took 2 s or more on a 2-core host (setup, call and teardown together): they start servers, suites or
# builds. `pytest tests -m "not slow"` is the edit loop; ci/list-slow-tests.py remakes the list from a --durations=0
# log of the whole suite.
SLOW = Path(__file__).with_name("slow.txt")


def pytest_collection_modifyitems(config, items):
    slow = {ln.strip() for ln in SLOW.read_text().splitlines() if ln.strip() and not ln.startswith("#")} \
        if SLOW.exists() else set()
    for item in items:
        if item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def start_sim(tmp_path):
    """start_sim(*flags, timeout=30, env=None) -> Server; every server is stopped after the test."""
    servers: list[Server] = []

    def start(*flags: str, timeout: float = 30.0, env: dict | None = None, name: str = "sim") -> Server:
        spec = LaunchSpec(name=name, argv=[*SIM, "--preset", "ci", "--random-seed", "1", *flags],
                          log_dir=tmp_path / "logs", launch_timeout_s=timeout, env=env or {},
                          terminate_timeout_s=10)
        srv = launch(spec)
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        report = s.stop()
        assert not report.survivors, f"processes of {s.spec.name} survived teardown: {report.survivors}"


@pytest.fixture(autouse=True, scope="session")
def no_leftover_processes():
    """After the whole session, nothing this test process started is still running."""
    yield
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    # xdist workers and their helpers are not ours to judge; our servers run python -m sglperf.sim / llama-server
    ours = [p for p in left if any("sglperf" in part or "llama-server" in part for part in _cmdline(p))]
    assert not ours, f"processes left running after the tests: {[(p.pid, _cmdline(p)) for p in ours]}"


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: without the xdist worker's variables, which a child pytest would
    otherwise take as its own (pytest-benchmark then thinks it is a worker and writes no JSON)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env.update(extra)
    return env


def as_background_job() -> None:
    """preexec_fn: what a non-interactive shell does to `cmd &` (and what its children inherit): SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


DISTURBED = re.compile(r"^INVALID MEASUREMENT: \S+ c\d+ cannot be judged against its (floor|latency ceilings): ", re.M)


def assert_suite_passed(returncode: int, stdout: str) -> int:
    """An inner suite passed, or failed only with levels that a busy machine made INVALID (the disturbance named),
    never a REGRESSION: a self-test whose subject is not the measurement tolerates a busy machine by design.
    Returns how many tests were disturbed (to subtract from an expected pass count)."""
    if returncode == 0:
        return 0
    summary = [ln for ln in stdout.splitlines() if re.search(r"\d+ (passed|failed).* in [\d.]+s", ln)]
    failed = re.findall(r"(\d+) failed", summary[-1] if summary else "")
    disturbed = len(DISTURBED.findall(stdout))
    assert returncode == 1 and failed and int(failed[0]) == disturbed, stdout[-3000:]
    return disturbed
