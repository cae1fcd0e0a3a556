"""Fault matrix: each fault is driven through the real code paths (pytest perf_tests in a subprocess, against the
simulator's fault flags), and each case checks the outcome category, a message naming the cause, the server log
path, no surviving server process, no half-written file, and nothing invalid in baselines or history."""

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sglperf.store import baselines
from sglperf.run.launch import LaunchError, LaunchSpec, launch

from .conftest import as_background_job, assert_suite_passed, user_env

ROOT = Path(__file__).resolve().parent.parent
SIM = [sys.executable, "-m", "sglperf.sim"]


TAG = "SGLPERF_TEST_TAG"  # inherited by every server a suite run launches: finds exactly this test's servers


def suite(tmp_path, *args, timeout=300, env=None):
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
           "--perf-config", "rr24-cds4", "--reports-dir", str(tmp_path / "reports"), *args]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=user_env(**{TAG: str(tmp_path)}, **(env or {})))
    return p, p.stdout + p.stderr


def sim_processes(tag: str) -> list[psutil.Process]:
    """Simulator processes still alive that a suite run of this test started."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = p.info["cmdline"] or []
            if "sglperf.sim" in cmd and p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(TAG) == tag:
                out.append(p)
        except psutil.Error:
            continue
    return out


def assert_clean(tmp_path):
    """No server of this run left, no temp file left half-written, history holds no invalid value."""
    tag = str(tmp_path)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sim_processes(tag):
        time.sleep(0.2)
    left = [p.pid for p in sim_processes(tag)]
    assert not left, f"server processes survived: {left}"
    reports = tmp_path / "reports"
    assert not list(reports.rglob("*.tmp")), "a half-written file was left"
    for run in (reports / "runs").glob("*.json"):
        json.loads(run.read_text())  # every run file parses
    hist = reports / "history.jsonl"
    if hist.exists():
        for line in hist.read_text().splitlines():
            for lv in json.loads(line)["levels"]:
                if not lv["valid"]:
                    assert lv["sustained_output_tps"] is None, "an invalid level entered history as a value"


def run_doc(tmp_path) -> dict:
    return json.loads(next((tmp_path / "reports" / "runs").glob("*.json")).read_text())


# 1. start-up errors carry the server's own error line ------------------------------------------------------------
@pytest.mark.parametrize("flag,code,line", [
    ("--server-arg=--no-such-flag", 2, "unrecognized arguments: --no-such-flag"),
    ("--server-arg=--num-continuous-decode-steps=0", 1, "--num-continuous-decode-steps must be >= 1"),
])
def test_startup_errors_are_infrastructure_failures_with_the_servers_words(tmp_path, flag, code, line):
    p, out = suite(tmp_path, "--levels", "8", flag)
    assert p.returncode == 1
    assert "INFRASTRUCTURE" in out and f"exited during start-up with code {code}" in out and line in out
    assert "Log: " in out and str(tmp_path / "reports" / "servers") in out
    assert_clean(tmp_path)
    assert not (tmp_path / "reports" / "history.jsonl").exists(), "no level measured, nothing in history"


# 2. start-up slower than the launch timeout -------------------------------------------------------------------------
def test_slow_startup_hits_the_launch_timeout(tmp_path):
    t0 = time.monotonic()
    p, out = suite(tmp_path, "--levels", "8", "--server-arg=--fault-slow-start=60", "--launch-timeout", "3")
    assert p.returncode == 1 and time.monotonic() - t0 < 60
    assert "INFRASTRUCTURE" in out and "was not ready (/health 200) within 3 s" in out
    assert_clean(tmp_path)


def test_a_server_that_hangs_right_after_saying_ready_fails_in_its_grace_not_its_launch_timeout(tmp_path):
    """The log said "ready to roll", then /health waited out its 20-s check: the launch waited the whole launch
    timeout (120 s on sim-seed, an hour on glm5). Now it fails ready_grace_s after the line, saying so."""
    from sglperf.engines.sim import Sim

    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch(LaunchSpec("sim", [*SIM, "--preset", "ci", "--fault-hang-after", "0"], tmp_path / "logs",
                          launch_timeout_s=300, ready_line=Sim.ready_line, ready_grace_s=3))
    assert time.monotonic() - t0 < 60
    assert "its log said 'The server is fired up and ready to roll!'" in str(e.value), str(e.value)[-1500:]
    assert "has not answered 200 since (last: " in str(e.value) and "it hung once started" in str(e.value)
    assert_clean(tmp_path)


# 3. port already taken ---------------------------------------------------------------------------------------------
def test_a_taken_port_is_a_clear_error_and_an_auto_port_is_retried(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError) as e:
            launch(LaunchSpec("sim", [*SIM, "--preset", "ci"], tmp_path / "logs", port=port, launch_timeout_s=30))
        assert e.value.exit_code == 1 and "address already in use" in str(e.value)
    assert_clean(tmp_path)


LOSES_ITS_FIRST_PORT = """
import argparse, http.server, pathlib, sys, time
a = argparse.ArgumentParser(); a.add_argument("--host"); a.add_argument("--port", type=int); a.add_argument("marker")
args = a.parse_args()
if not pathlib.Path(args.marker).exists():  # as SGLang: uvicorn's bind fails, its processes stay
    pathlib.Path(args.marker).write_text("x")
    print(f"ERROR:    [Errno 98] error while attempting to bind on address ({args.host!r}, {args.port}): address "
          "already in use", flush=True)
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
http.server.HTTPServer((args.host, args.port), H).serve_forever()
"""


def test_a_server_that_stays_up_after_losing_its_auto_port_is_restarted_on_another_at_once(tmp_path):
    """SGLang whose chosen port another process took before uvicorn bound it logs "address already in use" and
    lives on, so /health never answers: CI waited out a 240-s launch timeout. The launch now retries at once."""
    script = tmp_path / "server.py"
    script.write_text(LOSES_ITS_FIRST_PORT)
    t0 = time.monotonic()
    server = launch(LaunchSpec("lost-port", [sys.executable, str(script), str(tmp_path / "marker")], tmp_path / "logs",
                               launch_timeout_s=120))
    try:
        assert time.monotonic() - t0 < 30
        assert len(list((tmp_path / "logs").glob("*.log"))) == 2, "the first start, then one on another port"
    finally:
        server.stop()


# 4. crash mid-level ------------------------------------------------------------------------------------------------
def test_a_crash_mid_level_ends_it_as_infrastructure_within_seconds(tmp_path):
    t0 = time.monotonic()
    p, out = suite(tmp_path, "--levels", "8,16", "--server-arg=--fault-crash-after=2")
    assert p.returncode == 1 and time.monotonic() - t0 < 90
    assert "INFRASTRUCTURE" in out and "exit code -9" in out and "crashed with exit code -9" in out
    doc = run_doc(tmp_path)
    c8 = doc["configs"]["rr24-cds4"]["levels"]["8"]
    assert c8["incomplete"] and not c8["valid"]
    assert_clean(tmp_path)


# 5. hang mid-level -------------------------------------------------------------------------------------------------
def test_a_hang_is_caught_by_the_stall_timeout_not_a_global_timeout(tmp_path):
    t0 = time.monotonic()
    p, out = suite(tmp_path, "--levels", "8", "--server-arg=--fault-hang-after=2")
    assert p.returncode == 1 and time.monotonic() - t0 < 90
    assert "INFRASTRUCTURE" in out and "server stalled: no token" in out and "stall timeout 10 s" in out
    assert_clean(tmp_path)


def test_a_hang_right_after_start_is_found_by_the_canary_within_the_stall_timeout_and_nothing_more_is_asked(tmp_path):
    """The server stops answering 0.3 s after /health is ready: the canary's request gets the stall timeout (10 s on
    sim-ci), not the request timeout (120 s), and every level fails at once naming the hang (was 262 s)."""
    t0 = time.monotonic()
    p, out = suite(tmp_path, "--levels", "8,16", "--server-arg=--fault-hang-after=0.3")
    took = time.monotonic() - t0
    assert p.returncode == 1 and took < 45, (took, out[-2000:])
    assert out.count("INFRASTRUCTURE: server stalled: no answer to the output canary's 16 greedy tokens within the "
                     "stall timeout (10 s); nothing more is asked of it") >= 3, out[-3000:]
    assert "PASSED" not in out
    assert_clean(tmp_path)


def test_a_level_that_stalls_leaves_the_next_level_unasked_of_that_server_start(tmp_path):
    """sim-rate's server hangs 8 s after start, inside r20: r40 is not measured on the hung server (each level had
    waited out its own stall timeout: 93 s for the two), its tests fail naming the stall and where it happened."""
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "--profile", "sim-rate",
           "--server-arg=--fault-hang-after=8", "--reports-dir", str(tmp_path / "reports")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=user_env(**{TAG: str(tmp_path)}))
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "INFRASTRUCTURE: sim-rate/rr24 r20: server stalled: no token" in out, out[-3000:]
    assert "INFRASTRUCTURE: sim-rate/rr24: server stalled during r20 (no token from any of" in out
    assert "nothing more is asked of this server start" in out
    assert set(run_doc(tmp_path)["configs"]["rr24"]["levels"]) == {"20"}
    assert_clean(tmp_path)


def test_a_hang_near_the_level_end_is_infrastructure_never_a_throughput_number(tmp_path):
    """The level's time limit fires before the stall timeout: the drain still watches for the stall, so the level
    ends INFRASTRUCTURE with the server log, no floor decided on the window before the hang, no history value (and,
    invalid, no baseline entry: candidates and calibration take valid levels only)."""
    p, out = suite(tmp_path, "--levels", "8", "--level-max-seconds", "9", "--server-arg=--fault-hang-after=4")
    assert p.returncode == 1
    assert "INFRASTRUCTURE: sim-ci/rr24-cds4 c8: server stalled" in out and "(while the level drained)" in out
    assert "THROUGHPUT REGRESSION" not in out and "Server log: " in out
    lv = run_doc(tmp_path)["configs"]["rr24-cds4"]["levels"]["8"]
    assert not lv["valid"] and lv["incomplete"]
    assert_clean(tmp_path)


def test_bench_against_a_server_that_hangs_mid_level_exits_nonzero_with_the_level_invalid(tmp_path):
    srv = launch(LaunchSpec("sim", [*SIM, "--preset", "ci", "--fault-hang-after", "6"], tmp_path / "logs",
                            launch_timeout_s=30, terminate_timeout_s=10))
    try:
        p = subprocess.run([sys.executable, "-m", "sglperf", "bench", "--url", srv.url, "--levels", "8",
                            "--max-seconds", "8", "--stall-timeout", "20", "--json", str(tmp_path / "b.json")],
                           capture_output=True, text=True, timeout=120, env=user_env())
    finally:
        srv.stop()
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "level incomplete: server stalled" in p.stdout
    lv = json.loads((tmp_path / "b.json").read_text())["configs"]["bench"]["levels"]["8"]
    assert not lv["valid"] and lv["incomplete"]


def test_an_open_loop_level_that_stalls_ends_at_its_stall_not_at_every_requests_timeout(tmp_path):
    """The level sets its load's stop and cancels it at once; the open loop's requests are tasks of their own and
    must be cancelled with it (measure/client.sent_and_settled), else it waits out the request timeout (300 s here;
    a stall known after 5). The bound is the request timeout's, not a speed claim."""
    srv = launch(LaunchSpec("sim", [*SIM, "--preset", "ci", "--fault-hang-after", "4"], tmp_path / "logs",
                            launch_timeout_s=30, terminate_timeout_s=10))
    try:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "sglperf", "bench", "--url", srv.url, "--rates", "20",
                            "--max-seconds", "8", "--stall-timeout", "5", "--request-timeout", "300",
                            "--json", str(tmp_path / "b.json")],
                           capture_output=True, text=True, timeout=600, env=user_env())
        took = time.monotonic() - t0
    finally:
        srv.stop()
    assert p.returncode == 1 and "level incomplete: server stalled" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert took < 150, f"{took:.0f} s: the stalled level waited for its requests' timeout"


def test_a_history_the_disk_refuses_is_left_as_it_was_named_and_not_announced(tmp_path):
    """A history file at the process's size limit (RLIMIT_FSIZE: the kernel refuses the write past it, as a full disk
    does, after taking what fits): no torn half line is left, the error names the file, and the summary does not
    point at a history this run is not in."""
    import resource

    hist = tmp_path / "history.jsonl"
    hist.write_bytes(b"\n" * 1_000_000)  # blank lines: read as no records
    limit = hist.stat().st_size + 200  # a history line is kilobytes: 200 bytes of it fit, then the write fails

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim", "--perf-config",
           "rr24-cds4", "--reports-dir", str(tmp_path / "reports"), "--levels", "8", "--level-max-seconds", "4",
           "--history-file", str(hist)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=small_disk,
                       env=user_env(**{TAG: str(tmp_path)}))
    out = p.stdout + p.stderr
    assert f"history file {hist}: this run's line was not appended" in out, out[-3000:]
    assert f"history: {hist}" not in out
    assert hist.read_bytes() == b"\n" * 1_000_000
    assert p.returncode != 0


# 6-9. wrong answers inside HTTP-200 streams, short outputs, queue-full 503s --------------------------------------
@pytest.mark.parametrize("flag,kinds", [
    ("--server-arg=--fault-error-rate=0.05", ("abort", "stream_error")),
    ("--server-arg=--fault-truncate-rate=0.05", ("no_finish",)),
    ("--server-arg=--fault-short-rate=0.05", ("short_output",)),
    ("--server-arg=--max-queued-requests=4", ("http_status", "abort")),
])
def test_bad_answers_make_the_level_invalid_never_a_pass(tmp_path, flag, kinds):
    p, out = suite(tmp_path, "--levels", "64", flag, "--level-max-seconds", "8")
    assert p.returncode == 1
    assert "INVALID MEASUREMENT" in out and "requests failed" in out
    assert any(k in out for k in kinds), out[-2000:]
    assert "Server log: " in out
    lv = run_doc(tmp_path)["configs"]["rr24-cds4"]["levels"]["64"]
    assert not lv["valid"] and set(lv["errors"]) & set(kinds)
    assert_clean(tmp_path)


PRESSES = """
import os, signal

import pytest


def pytest_runtest_logreport(report):  # the user's first Ctrl-C: after a test, where pytest itself catches it
    if report.when == "teardown":
        raise KeyboardInterrupt


@pytest.hookimpl(trylast=True)
def pytest_keyboard_interrupt(excinfo):  # the second, while pytest formats the first
    os.kill(os.getpid(), signal.SIGINT)
"""


def test_a_second_ctrl_c_while_pytest_reports_the_first_still_ends_the_run_interrupted(tmp_path):
    """A Ctrl-C that pytest catches itself (not inside a measurement) is formatted by pytest, a second of reading
    source; a second Ctrl-C then cut the formatting short, and pytest ended the session as if nothing had happened:
    its own traceback and a run file "finished", complete. The two presses come from a plugin of this test's, at
    those two moments (by hand: 0.1-0.2 s apart, early in a run). Now the second is noted and the run is saved as
    interrupted."""
    (tmp_path / "two_presses.py").write_text(PRESSES)
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-p", "two_presses", "-m", "sim",
           "--perf-config", "rr24-cds4", "--levels", "8", "--level-max-seconds", "4",
           "--reports-dir", str(tmp_path / "reports")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=user_env(**{TAG: str(tmp_path)}, PYTHONPATH=str(tmp_path)))
    out = p.stdout + p.stderr
    assert p.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "Traceback" not in out and 'File "' not in out, out[-3000:]
    doc = run_doc(tmp_path)
    assert (doc["status"], doc["complete"]) == ("interrupted", False), out[-3000:]
    assert_clean(tmp_path)


# 10. interrupted mid-level (SIGINT, SIGTERM) -------------------------------------------------------------------------
@pytest.mark.parametrize("sig,background,repeat", [(signal.SIGINT, False, 1), (signal.SIGTERM, False, 1),
                                                   (signal.SIGTERM, True, 1), (signal.SIGINT, False, 5)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-background", "SIGINT-five-times"])
def test_an_interrupted_run_tears_down_and_saves_partial_results_marked_incomplete(tmp_path, sig, background, repeat):
    # No floor to decide and an unreachable CI target: the first level runs until it is interrupted.
    empty = tmp_path / "empty-baseline.json"
    empty.write_text(json.dumps({"schema_version": 1, "profile": "sim-ci", "hardware_class": "sim:ci", "isl": 32,
                                 "osl": 32, "configs": {}}))
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-m", "sim", "--perf-config", "rr24-cds4",
           "--levels", "8,16", "--level-max-seconds", "60", "--ci-target", "0.0001", "--baseline-file", str(empty),
           "--reports-dir", str(tmp_path / "reports"), "--benchmark-json", str(tmp_path / "bench.json")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=user_env(**{TAG: str(tmp_path)}), preexec_fn=as_background_job if background else None)
    runs = tmp_path / "reports" / "runs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for a state: the level's requests reach the server
        logs = list((tmp_path / "reports" / "servers").glob("*.log"))
        # the warmup and the output canary's 3 requests come first: the level's own are past the 4th prefill
        if logs and logs[0].read_text(errors="replace").count("Prefill batch") >= 7:
            break
        time.sleep(0.2)
    proc.send_signal(sig)
    # an impatient user: Ctrl-C again, spread so that some land while the partial level is saved and some after it,
    # while the servers are torn down and the run file written (its status stayed `running` where one raised there)
    for gap in (0.02, 0.1, 0.3, 0.6)[:repeat - 1]:
        time.sleep(gap)
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    doc = json.loads(next(runs.glob("*.json")).read_text())
    assert doc["status"] == "interrupted" and doc["complete"] is False
    c8 = doc["configs"]["rr24-cds4"]["levels"]["8"]
    assert c8["incomplete"] and not c8["valid"] and c8["requests_sent"] > 0, "partial result saved"
    # the interrupted level's benchmark round has no time: pytest-benchmark's JSON leaves it out instead of crashing
    # the session's end (an H200 run cut by its call's limit: `ValueError: min() iterable argument is empty`)
    assert "Traceback" not in out, out[-3000:]
    assert_clean(tmp_path)


# 11. xdist: never two servers on one GPU set -------------------------------------------------------------------------
def test_under_xdist_servers_never_overlap(tmp_path):
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-m", "sim", "-n", "4", "--levels", "8",
           "--reports-dir", str(tmp_path / "reports")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=user_env(**{TAG: str(tmp_path)}))
    assert_suite_passed(p.returncode, p.stdout)
    spans, logs = [], sorted((tmp_path / "reports" / "servers").glob("*.log"))
    for log in logs:
        text = log.read_text()
        stamps = [ln[1:20] for ln in text.splitlines() if ln.startswith("[20")]
        spans.append((stamps[0], stamps[-1]))
    spans.sort()
    # one start per config at least; a level left undecided is measured again after a restart (4 workers on 2 CI
    # cores: rr64-cds8 started three times once), and no start may overlap another
    assert all(any(f"-{c}-" in log.name for log in logs) for c in ("rr24-cds4", "rr64-cds8")), logs
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"server lifetimes overlap: {spans}"
    assert_clean(tmp_path)


# 12. bad input: usage errors naming file and field --------------------------------------------------------------------
def test_malformed_profile_is_a_usage_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [\n")
    p, out = suite(tmp_path, "--profile", str(bad))
    assert p.returncode == 4 and "USAGE ERROR" in out and "bad.toml: not valid TOML" in out


def test_unknown_profile_key_is_a_usage_error_naming_the_field(tmp_path):
    src = (ROOT / "profiles" / "sim-ci.toml").read_text()
    bad = tmp_path / "typo.toml"
    bad.write_text(src.replace("[measurement]", "[measurement]\nci_targett = 0.1"))
    p, out = suite(tmp_path, "--profile", str(bad))
    assert p.returncode == 4 and "typo.toml: measurement.ci_targett: unknown key" in out


SIM_CI_BASELINE = (ROOT / "baselines" / "sim-ci" / "sim-ci.json").read_text()


@pytest.mark.parametrize("content,expect", [
    ('{"schema_version": 1, "profile": ', "not valid JSON"),
    ('{"schema_version": 0, "profile": "sim-ci"}', "schema_version: 0 is not supported"),
    (SIM_CI_BASELINE.replace('"8": {', '"8.0": {', 1), "level key '8.0' is not a level"),
    (SIM_CI_BASELINE.replace('"8": {', '"08": {', 1), "level key '08' is not a level"),
    (SIM_CI_BASELINE.replace('"8": {', '"c8": {', 1), "level key 'c8' is not a level"),
])
def test_malformed_or_old_baseline_is_a_usage_error_before_launch_and_nothing_is_overwritten(tmp_path, content,
                                                                                          expect):
    """Refused before any server starts (pytest exit 4), once, naming the file: a level key the suite never
    writes ("8.0", "08", "c8") would match no level, and its floor would silently judge nothing."""
    bfile = tmp_path / "baseline.json"
    bfile.write_text(content)
    p, out = suite(tmp_path, "--levels", "8", "--baseline-file", str(bfile))
    assert p.returncode == 4 and "USAGE ERROR" in out and expect in out and "baseline.json" in out, out[-2000:]
    assert out.count(expect) == 1, out[-3000:]
    assert not (tmp_path / "reports" / "servers").exists(), "nothing was launched"
    assert bfile.read_text() == content, "the user's file is untouched"
    assert_clean(tmp_path)


def test_unwritable_reports_directory_is_a_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-m", "sim", "--reports-dir", str(blocker / "sub")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
    assert p.returncode == 4
    assert "USAGE ERROR: the reports directory" in p.stdout + p.stderr and "not writable" in p.stdout + p.stderr


def test_the_shipped_baselines_are_untouched_by_the_fault_runs():
    for f in baselines.BASELINE_DIR.glob("*/*.json"):
        assert ".candidate" not in f.name, f"a candidate was left in the repo: {f}"
        baselines.load(f)


# Security -------------------------------------------------------------------------------------------------------
def test_the_api_key_appears_nowhere_in_reports_or_allure_results(tmp_path):
    key = "sk-sglperf-test-7f3a9c1e5b"
    allure = tmp_path / "allure"
    p, out = suite(tmp_path, "--levels", "8", "--alluredir", str(allure), env={"SGLPERF_API_KEY": key})
    assert p.returncode in (0, 1), out[-2000:]
    doc = run_doc(tmp_path)
    assert doc["configs"]["rr24-cds4"]["levels"]["8"]["valid"], "the key reached server and client"
    leaks = [str(f) for d in (tmp_path / "reports", allure) for f in d.rglob("*") if f.is_file()
             and key.encode() in (f.read_bytes() if not f.name.endswith(".gz") else __import__("gzip").open(f).read())]
    assert not leaks, f"the API key leaked into {leaks}"
    assert key not in out
    log = next((tmp_path / "reports" / "servers").glob("*.log")).read_text()
    assert "--api-key <redacted>" in log
    assert_clean(tmp_path)


SECRETS = {"--api-key": "KEY-7f3a-sglperf", "--admin-api-key": "ADMIN-456-sglperf",
           "--ssl-keyfile-password": "PW-789-sglperf"}


def leaked(dirs, values) -> list[str]:
    """Every file under `dirs` (gzip read through) holding any of `values`, with the value."""
    import gzip

    out = []
    for d in dirs:
        for f in Path(d).rglob("*"):
            if f.is_file():
                data = gzip.open(f).read() if f.name.endswith(".gz") else f.read_bytes()
                out += [f"{f}: {v}" for v in values if v.encode() in data]
    return out


def test_every_secret_flag_is_redacted_from_every_file_the_run_writes(tmp_path):
    """The secret flags (redact.SECRET_FLAGS) given through --server-arg, and a secret variable in the suite's
    environment: the server logs its args in clear as SGLang does; no file of the run holds a value, and the
    client authenticates with the --api-key the server was given."""
    allure = tmp_path / "allure"
    args = [f"--server-arg={f}={v}" for f, v in SECRETS.items()]
    p, out = suite(tmp_path, "--levels", "8", "--alluredir", str(allure), *args,
                   "--benchmark-json", str(tmp_path / "reports" / "bench.json"), env={"HF_TOKEN": "hf-TOKEN-sglperf"})
    assert p.returncode in (0, 1), out[-2000:]
    assert run_doc(tmp_path)["configs"]["rr24-cds4"]["levels"]["8"]["valid"], "the key reached server and client"
    values = [*SECRETS.values(), "hf-TOKEN-sglperf"]
    assert leaked([tmp_path / "reports", allure], values) == []
    assert not [v for v in values if v in out]
    log = next((tmp_path / "reports" / "servers").glob("*.log")).read_text()
    assert '"admin_api_key": "<redacted>"' in log and "--admin-api-key=<redacted>" in log


def test_the_server_log_lands_in_the_reports_dir_when_the_profile_is_a_path(tmp_path):
    prof = tmp_path / "elsewhere" / "my.toml"
    prof.parent.mkdir()
    prof.write_text((ROOT / "profiles" / "sim-ci.toml").read_text())
    p, out = suite(tmp_path, "--profile", str(prof), "--levels", "8")
    assert p.returncode in (0, 1), out[-2000:]
    assert [f.name.startswith("sim-ci-rr24-cds4-") for f in (tmp_path / "reports" / "servers").glob("*.log")] == [True]
    assert not list(prof.parent.glob("*.log"))


def test_a_profile_name_that_is_not_one_path_segment_is_a_usage_error(tmp_path):
    prof = tmp_path / "bad.toml"
    prof.write_text((ROOT / "profiles" / "sim-ci.toml").read_text().replace('name = "sim-ci"', 'name = "../sim-ci"'))
    p, out = suite(tmp_path, "--profile", str(prof), "--levels", "8")
    assert p.returncode == 4 and str(prof) in out and "name" in out, out[-2000:]


def test_servers_bind_loopback_by_default_and_nothing_starts_through_a_shell():
    from sglperf.run import profiles

    for name in profiles.available():
        assert profiles.load(name).server.host == "127.0.0.1"
    src = "".join(p.read_text() for p in (ROOT / "sglperf").rglob("*.py"))
    assert "shell=True" not in src and "os.system(" not in src


def test_output_that_goes_wrong_under_load_is_output_degenerate_never_a_pass_history_or_a_candidate(tmp_path):
    """The simulator returns all-zero ids from its 37th request on, after a clean canary: the levels' sampled outputs
    (one request in 8 keeps its ids) are judged by the canary's rules, every floor fails OUTPUT DEGENERATE, and the
    run makes no history point and no candidate baseline."""
    p, out = suite(tmp_path, "--levels", "8,16", "--server-arg=--fault-degenerate-output=37", "--update-baselines")
    assert p.returncode == 1, out[-3000:]
    assert "PASSED" not in out and "test_output_canary" not in out.split("short test summary")[-1], out[-3000:]
    assert out.count("OUTPUT DEGENERATE: sim-ci/rr24-cds4 c16: output degenerate under load: ") >= 1, out[-3000:]
    assert "OUTPUT CANARY FAILED: sim-ci: output canary failed (rr24-cds4 c8: degenerate under load" in out
    assert not (tmp_path / "reports" / "history.jsonl").exists()
    assert not list((ROOT / "baselines" / "sim-ci").glob("*.candidate*.json"))
    assert_clean(tmp_path)


def test_a_plateau_that_is_not_one_still_fails_kv_plateau_violated_after_a_fresh_start(tmp_path):
    """A violation must now repeat on a fresh server start before it is called one (a drifting host cannot turn a
    plateau red); the test keeps its power. The simulator's --fault-plateau-drop=0.25 makes each step 1 / (1 - 0.25)
    as long once as many requests wait as run: past rr24's cap, c48 (24 waiting) reads about 20% under c24 (none
    waiting), where a plateau stays flat. Both starts show it: KV PLATEAU VIOLATED. (0.15 read -10.6% to -12.5%,
    straddling the ±10% band on every start of one run in three: undecided, rightly.)"""
    p, out = suite(tmp_path, "--levels", "24,48", "-k", "plateau", "--server-arg=--fault-plateau-drop=0.25")
    assert p.returncode == 1, out[-3000:]
    assert "KV PLATEAU VIOLATED: sim-ci/rr24-cds4" in out, out[-3000:]
    assert "measured again on server start 2" in out, out[-3000:]
    assert "outside the plateau band ±10%" in out, out[-3000:]
    assert_clean(tmp_path)


def test_the_levels_sampled_outputs_are_judged_like_the_canary_and_one_stray_output_is_no_broken_server():
    from sglperf.judge.canary import CanaryRules, check_under_load

    healthy = [tuple(range(i, i + 16)) for i in range(20)]
    assert check_under_load(healthy + [(7,) * 16], CanaryRules(), 16) is None, "one stray repetitive output"
    # real SGLang on the CPU, its tiny random-weight Llama: 2 of 17 sampled outputs looped, each on its own id
    looped = healthy[:15] + [(4350,) * 16, (911,) * 16]
    assert check_under_load(looped, CanaryRules(), 16) is None, "a healthy model loops now and then"
    why = check_under_load(healthy[:4] + [(0,) * 128] * 6, CanaryRules(), 16)
    assert why.startswith("output degenerate under load: 6 of 10 sampled outputs (their first 16 ids), e.g. all one id")
