"""Bad input and faults, round 2: each numbered case of the issue, reproduced as written, ends in a clear error
and leaves nothing running or lost."""

import json
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sglperf.categories import InfraError
from sglperf.engines.llamacpp import LlamaCpp
from sglperf.engines.sglang import SGLang
from sglperf.run.launch import LaunchSpec, launch
from sglperf.store import baselines

from .conftest import assert_suite_passed, user_env
from .rundocs import result, run_doc
from .test_faults import ROOT, TAG, assert_clean, sim_processes, suite


def run_files(tmp_path):
    return sorted((tmp_path / "reports" / "runs").glob("*.json"))


# 1. a selection that selects nothing is a usage error, never a green run ------------------------------------------
@pytest.mark.parametrize("args,words", [
    (["-m", "sim", "--perf-config", "nope", "--levels", "8"], "--perf-config nope selects nothing to run"),
    (["--profile", "sim-ci", "--perf-config", "nope"], "--perf-config nope selects nothing to run"),
    (["-m", "gpu8", "--profile", "sim-ci"], "--profile sim-ci selects nothing to run (its marker is sim"),
])
def test_a_selection_that_selects_nothing_is_a_usage_error(tmp_path, args, words):
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "--reports-dir", str(tmp_path / "r"),
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
    assert p.returncode == 4, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"USAGE ERROR: {words}" in p.stdout + p.stderr


# 2. kill -9 of pytest leaves no server; the next run ends leftovers and names them -----------------------------
def test_kill_9_of_pytest_mid_run_leaves_no_server_and_the_next_run_marks_its_file_abandoned(tmp_path):
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim", "--perf-config",
           "rr24-cds4", "--levels", "8,16,24", "--reports-dir", str(tmp_path / "reports")]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=user_env(**{TAG: str(tmp_path)}))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for a state: the first level is recorded
            docs = [json.loads(f.read_text()) for f in run_files(tmp_path)]
            if docs and docs[0]["configs"].get("rr24-cds4", {}).get("levels"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never recorded a level")
        assert sim_processes(str(tmp_path)), "the server runs while its suite does"
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        p.kill()
    assert_clean(tmp_path)  # no simulator process of this run survives (PR_SET_PDEATHSIG)
    assert json.loads(run_files(tmp_path)[0].read_text())["status"] == "running", "nobody closed it"
    again, out = suite(tmp_path, "--levels", "8")
    assert_suite_passed(again.returncode, again.stdout)
    assert "marked abandoned" in out and "died while running" in out
    first = json.loads(run_files(tmp_path)[0].read_text())
    assert first["status"] == "abandoned"


def test_a_server_left_by_a_dead_run_is_ended_and_named_before_the_next_run(tmp_path):
    """Where the OS does not kill it (another OS, a server that ignores its parent), the registry still finds it."""
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    registry = tmp_path / "reports" / ".servers"
    registry.mkdir(parents=True)
    (registry / f"{leftover.pid}.json").write_text(json.dumps({
        "pid": leftover.pid, "pgid": leftover.pid, "create_time": psutil.Process(leftover.pid).create_time(),
        "owner_pid": dead.pid, "owner_create_time": 0.0, "name": "sim-ci-rr24-cds4",
        "argv": ["python", "-m", "sglperf.sim"], "log": "x.log", "started": "2026-11-30T00:00:00"}))
    try:
        p, out = suite(tmp_path, "--levels", "8")
        assert_suite_passed(p.returncode, p.stdout)
        assert f"ended server 'sim-ci-rr24-cds4' (pid {leftover.pid}" in out and f"by pid {dead.pid}, which is gone" \
            in out
        assert leftover.wait(10) is not None, "the leftover is gone"
        notes = json.loads(run_files(tmp_path)[0].read_text())["notes"]
        assert any(f"pid {leftover.pid}" in n for n in notes), "the run file says what was cleaned"
    finally:
        leftover.kill()


# 3. unwritable outputs: refused up front; a late failure does not stop the other writers -----------------------
@pytest.mark.parametrize("args,words", [
    (["--history-file", "/dev/null/history.jsonl"], "the history file's directory /dev/null is not writable"),
    (["--alluredir", "/dev/null/allure"], "the Allure results directory /dev/null/allure is not writable"),
    (["--update-baselines", "--baseline-file", "/dev/null/b.json"],
     "--baseline-file /dev/null/b.json: no such file"),
])
def test_unwritable_outputs_are_usage_errors_before_anything_runs(tmp_path, args, words):
    p, out = suite(tmp_path, "--levels", "8", *args, timeout=60)
    assert p.returncode == 4, out[-2000:]
    assert (words if words.startswith("error: argument") else f"USAGE ERROR: {words}") in out
    assert not (tmp_path / "reports" / "servers").exists(), "nothing was launched"


def test_a_late_write_failure_is_reported_and_every_other_writer_still_writes(tmp_path):
    hist = tmp_path / "history.jsonl"
    bfile = tmp_path / "baseline.json"
    shutil.copy(ROOT / "baselines" / "sim-ci" / "sim-ci.json", bfile)
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim", "--perf-config",
           "rr24-cds4", "--levels", "8,16", "--reports-dir", str(tmp_path / "reports"), "--history-file", str(hist),
           "--alluredir", str(tmp_path / "allure"), "--update-baselines", "--baseline-file", str(bfile)]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=user_env(**{TAG: str(tmp_path)}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not run_files(tmp_path):
        time.sleep(0.1)
    hist.mkdir()  # after the up-front checks: the history append at the end fails
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 1, out[-3000:]
    assert "INFRASTRUCTURE: could not write: IsADirectoryError" in out and str(hist) in out
    allure = tmp_path / "allure"
    assert (allure / "environment.properties").exists() and (allure / "categories.json").exists()
    assert list(allure.glob("*-perf.json")), "the perf metrics were still written"
    assert list(tmp_path.glob("baseline.candidate*.json")), "the candidate was still written"
    assert json.loads(run_files(tmp_path)[0].read_text())["status"] == "finished"


def test_bench_json_into_an_unwritable_directory_is_refused_before_measuring(start_sim):
    srv = start_sim()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "8",
                        "--json", "/dev/null/out.json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--json /dev/null/out.json: the directory /dev/null does not exist" in p.stderr
    assert time.monotonic() - t0 < 10 and "sustained" not in p.stdout, "refused before any level"


# 4. candidates merge the reviewed file and never drop a floor silently ------------------------------------------
def test_update_baselines_writes_the_reviewed_entries_updated_by_this_run(tmp_path):
    bfile = tmp_path / "sim-ci.json"
    shutil.copy(ROOT / "baselines" / "sim-ci" / "sim-ci.json", bfile)
    reviewed = baselines.load(bfile)
    n = sum(len(ms) for lvls in reviewed.configs.values() for ms in lvls.values())
    p, out = suite(tmp_path, "--levels", "8", "--update-baselines", "--baseline-file", str(bfile))
    assert_suite_passed(p.returncode, p.stdout)
    [cand] = tmp_path.glob("sim-ci.candidate*.json")
    merged = baselines.load(cand)
    assert sum(len(ms) for lvls in merged.configs.values() for ms in lvls.values()) == n, "no floor dropped"
    assert f"= {n - 1} entries unchanged" in out and "~ rr24-cds4 c8 sustained_output_tps" in out
    assert baselines.load(bfile) == reviewed, "the reviewed file is untouched"


def test_two_candidates_at_once_get_different_names(tmp_path):
    target = tmp_path / "b.json"
    (tmp_path / "b.candidate.json").write_text("{}")
    first = baselines.candidate_path(target)
    first.write_text("{}")
    assert baselines.candidate_path(target) != first


# 5. options are validated before anything is launched -----------------------------------------------------------
@pytest.mark.parametrize("args,words", [
    # checked by the profile key's own field: one range, one message (run/profiles.MeasurementSection.check)
    (["--level-max-seconds", "-1"], "error: argument --level-max-seconds: --level-max-seconds -1: input should be "
                                    "greater than 0 (the longest a level may run)"),
    (["--ci-target", "-1"], "error: argument --ci-target: --ci-target -1: input should be greater than 0"),
    (["--ci-target", "0.7"], "error: argument --ci-target: --ci-target 0.7: input should be less than or equal to "
                             "0.5"),
    (["--levels", "1,,2"], "--levels '1,,2' has an empty entry"),
    (["--baseline-file", "/no/such/baseline.json"], "--baseline-file /no/such/baseline.json: no such file"),
    (["--server-url", "localhost:30000"], "--server-url 'localhost:30000' must look like http://HOST[:PORT]"),
])
def test_bad_options_are_usage_errors_before_anything_runs(tmp_path, args, words):
    p, out = suite(tmp_path, *args, timeout=60)
    assert p.returncode == 4, out[-2000:]
    assert (words if words.startswith("error: argument") else f"USAGE ERROR: {words}") in out
    assert not (tmp_path / "reports" / "servers").exists()


# 6. drift reads what it can and says what it cannot judge ---------------------------------------------------------
def drift(*args):
    return subprocess.run([sys.executable, "-m", "sglperf.cli", "drift", *args], capture_output=True, text=True,
                          timeout=120)


def test_drift_on_a_directory_a_broken_line_and_a_one_run_history(tmp_path):
    p = drift(str(tmp_path))
    assert p.returncode == 2 and "is a directory; give the JSONL file" in p.stderr
    ok, out = suite(tmp_path, "--levels", "8")
    assert_suite_passed(ok.returncode, ok.stdout)
    hist = tmp_path / "reports" / "history.jsonl"
    p = drift(str(hist))
    assert p.returncode == 0 and "1 runs" in p.stdout and "1 valid run(s), too short to judge" in p.stdout
    line = json.loads(hist.read_text().splitlines()[0])
    del line["levels"][0]["config"]
    with open(hist, "a") as f:
        f.write(json.dumps(line) + "\n")
    p = drift(str(hist))
    assert p.returncode == 0 and "history.jsonl:2: levels.0.config: Field required" in p.stderr


# 7. a key given as a server flag is redacted in every copy ------------------------------------------------------
def test_an_api_key_given_through_server_arg_is_stored_nowhere_in_clear(tmp_path):
    p, out = suite(tmp_path, "--levels", "8", "--server-arg=--api-key=sk-in-a-flag-1234")
    assert "sk-in-a-flag-1234" not in out
    for f in (tmp_path / "reports").rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".log"):
            assert "sk-in-a-flag-1234" not in f.read_text(errors="replace"), f
    doc = json.loads(run_files(tmp_path)[0].read_text())
    assert doc["options"]["--server-arg"] == ["--api-key=<redacted>"]


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path):
    yield
    assert not sim_processes(str(tmp_path)), "a server of this test survived"


def test_a_profile_whose_prompt_ids_the_served_model_lacks_fails_before_any_level(tmp_path):
    profile = tmp_path / "wide.toml"
    profile.write_text((ROOT / "profiles" / "sim-ci.toml").read_text().replace("vocab_high = 32000",
                                                                               "vocab_high = 40000"))
    p, out = suite(tmp_path, "--profile", str(profile), "--levels", "8")
    assert p.returncode == 1, out[-3000:]
    assert ("USAGE ERROR: profile sim-ci: [workload] vocab_low/vocab_high: prompt ids are drawn from [100, 40000) "
            "but the served model's vocabulary has 32000 tokens; set vocab_high to at most 32000") in out
    assert not list((tmp_path / "reports" / "runs").glob("*/*.records.jsonl.gz")), "nothing was measured"
    assert_clean(tmp_path)


# Round 3 -----------------------------------------------------------------------------------------------------------
# 8. a concurrency the process cannot hold is a usage error up front; running out mid-level is counted and named
def _nofile(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def test_a_level_beyond_the_open_file_limit_is_a_usage_error_before_anything_runs(tmp_path, start_sim):
    srv = start_sim()
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "8,3000"],
                       capture_output=True, text=True, timeout=60, preexec_fn=_nofile(1024))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--levels 3000: a level of 3,000 streams needs about" in p.stderr
    assert "but this process may open at most 1,024 (ulimit -n, hard limit): raise it" in p.stderr
    assert "c8" not in p.stdout, "nothing was measured"


MID_LEVEL = """
import asyncio, resource, sys
from sglperf.measure.client import LoadGenerator, Target, Workload
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
async def go():
    async with LoadGenerator(Target(sys.argv[1]), Workload(8, 8)) as gen:
        recs = await asyncio.gather(*(gen.one_request() for _ in range(64)))
    bad = [r for r in recs if r.error]
    print(len(recs) - len(bad), sorted({r.error for r in bad}), bad[0].error_detail)
asyncio.run(go())
"""


def test_running_out_of_open_files_mid_level_is_an_error_kind_of_its_own(start_sim):
    srv = start_sim()
    p = subprocess.run([sys.executable, "-c", MID_LEVEL, srv.url], capture_output=True, text=True, timeout=60)
    ok, kinds, detail = p.stdout.split(" ", 2)
    assert int(ok) > 0 and kinds == "['open_files']", p.stdout + p.stderr
    assert "the client process is out of open files ([Errno 24] Too many open files; ulimit -n)" in detail


# 9. what a server says of itself is checked: a lie is INFRASTRUCTURE naming the field, never a ceiling
@pytest.mark.parametrize("value", ["abc", -4096, 4096.5, True])
def test_a_server_info_count_that_is_not_a_count_is_infrastructure_naming_the_field(value):
    with pytest.raises(InfraError, match=r"/server_info says max_total_num_tokens = .*: not a whole number"):
        SGLang().ceiling({"max_total_num_tokens": value, "max_running_requests": 8}, 128, 128)
    with pytest.raises(InfraError, match=r"/props says total_slots = .*: not a whole number"):
        LlamaCpp().ceiling({"total_slots": value, "default_generation_settings": {"n_ctx": 4096}}, 32, 32)


@pytest.mark.parametrize("value", ['"abc"', "-4096"])
def test_a_real_server_that_lies_in_its_server_info_is_infrastructure_naming_the_field(tmp_path, start_sim, value):
    """The suite pointed (--server-url) at a loopback proxy in front of a real simulator, /server_info rewritten."""
    sim = start_sim("--enable-metrics", "--max-running-requests", "24")
    proxy = launch(LaunchSpec(name="hostile", argv=[sys.executable, str(ROOT / "tests" / "hostile_proxy.py"),
                                                    "--upstream", sim.url, "--set", f"max_total_num_tokens={value}"],
                              log_dir=tmp_path / "logs", launch_timeout_s=30, terminate_timeout_s=5))
    try:
        p, out = suite(tmp_path, "--server-url", proxy.url, "--levels", "8")
    finally:
        proxy.stop()
    assert p.returncode == 1, out[-3000:]
    assert f"INFRASTRUCTURE: /server_info says max_total_num_tokens = {value}: not a whole number" in out
    assert "ValueError" not in out and "THROUGHPUT REGRESSION" not in out
    assert not list((tmp_path / "reports" / "runs").glob("*/*.records.jsonl.gz")), "nothing was measured"


def test_metric_samples_that_are_not_readings_are_left_out():
    text = ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{dp_rank=\"0\"} NaN\n"
            "sglang:num_running_reqs{dp_rank=\"1\"} 7\n# TYPE sglang:num_queue_reqs gauge\n"
            "sglang:num_queue_reqs{dp_rank=\"0\"} -3\n")
    sample = SGLang().parse_metrics(text, 0.0)
    assert sample.running == 7 and sample.queued is None


# 10. a run file holding a number that is not a measurement is refused by name; --file is checked up front
@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-5", "1e400"])
def test_calibrate_refuses_a_run_file_whose_number_is_not_a_measurement(tmp_path, bad):
    files = []
    for i in range(2):
        f = tmp_path / f"run{i}.json"
        f.write_text(run_doc(f"r{i}", {8: result(8)}).model_dump_json())
        files.append(f)
    files[1].write_text(files[1].read_text().replace('"sustained_output_tps":1000.0', f'"sustained_output_tps":{bad}'))
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", "--dry-run", *map(str, files)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{files[1]}: configs.rr24-cds4.levels.8" in p.stderr and "sustained_output_tps" in p.stderr


@pytest.mark.parametrize("target,words", [
    ("/nonexistent-sglperf/dir/x.json", "the directory /nonexistent-sglperf/dir does not exist"),
    ("/proc/x.json", "the directory /proc is not writable"),
    ("/tmp", "is a directory; give a file path"),
])
def test_a_baseline_file_that_cannot_be_written_is_refused_before_anything_is_read(target, words):
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", "--file", target,
                        "no-such-run.json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"--file {target}: {words}" in p.stderr, p.stderr
    assert not Path("/nonexistent-sglperf").exists()


# 11. small gaps: numbers that make no sense are refused by the option that took them
@pytest.mark.parametrize("cmd,words", [
    (["bench", "--url", "http://127.0.0.1:9", "--levels", "8", "--slo-ttft-ms", "-5"],
     "argument --slo-ttft-ms: --slo-ttft-ms takes a number > 0, e.g. 500; got '-5'"),
    (["bench", "--url", "http://127.0.0.1:9", "--levels", "8", "--slo-ttft-ms", "0"],
     "argument --slo-ttft-ms: --slo-ttft-ms takes a number > 0, e.g. 500; got '0'"),
    (["bench", "--url", "http://127.0.0.1:9", "--levels", "8", "--vocab-range", "100"],
     "argument --vocab-range: expected LOW,HIGH (two integers, e.g. 1000,30000), got '100'"),
    (["bench", "--url", "http://127.0.0.1:9", "--levels", "8", "--ci-target", "nan"], "--ci-target"),
    (["baseline", "calibrate", "--min-tolerance", "-1", "a.json", "b.json"], "--min-tolerance"),
])
def test_senseless_numbers_are_refused_by_the_option_that_took_them(cmd, words):
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", *cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
