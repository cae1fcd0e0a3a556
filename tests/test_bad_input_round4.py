"""Bad input, round 4. Secrets in every form a user can write them or a server can print them stay out of
everything written: a database URL's password in its userinfo (an unencoded @ in it too), in a query parameter or a
libpq keyword string, percent-encoded or not; a flag's value as a Python repr, JSON or shell quoting print it.
Infinite numbers and a history file that is a directory are usage errors before anything runs."""

import pytest

from sglperf import redact as r
from sglperf.store import fleet


@pytest.mark.parametrize("url,shown,password", [
    ("postgresql://fleet:s3cret@db:5432/sg", "postgresql://fleet:<redacted>@db:5432/sg", "s3cret"),
    ("postgresql://fleet@db:5432/sg?password=s3cret&sslmode=disable",
     "postgresql://fleet@db:5432/sg?password=<redacted>&sslmode=disable", "s3cret"),
    ("postgresql://fleet:pa@ss@db:5432/sg", "postgresql://fleet:<redacted>@db:5432/sg", "pa@ss"),
    ("postgresql://fleet:p%40ss%2Fw@db/sg", "postgresql://fleet:<redacted>@db/sg", "p@ss/w"),
    ("host=db dbname=sg user=fleet password='p w'", "host=db dbname=sg user=fleet password=<redacted>", "p w"),
])
def test_a_connection_strings_password_is_found_and_hidden_in_every_form(url, shown, password):
    assert r.url_password(url) == password
    assert r.redact_url(url) == shown


def test_a_registered_url_password_leaves_no_trace_in_any_text_decoded_or_as_written():
    fleet.check_url("postgresql://fleet:p%40ss-9a@db:5432/sg")
    text = "connect: postgresql://fleet:p%40ss-9a@db:5432/sg failed for p@ss-9a"
    assert "p@ss-9a" not in r.redact(text) and "p%40ss-9a" not in r.redact(text)


def test_the_fleet_gives_otava_the_decoded_password_as_libpq_would():
    db = fleet.check_url("postgresql://fle%40et:p%40ss@db:5432/s%2Dg")
    assert (db.user, db.password, db.database) == ("fle@et", "p@ss", "s-g")
    assert fleet.check_url("postgresql://fleet@db/sg?password=qq").password == "qq"


@pytest.mark.parametrize("printed", ["'api_key': 'KEY\\\\789-x'", '"api_key": "KEY\\\\789-x"', "--api-key 'KEY\\789-x'",
                                     "api_key=KEY\\789-x"])
def test_a_secret_with_a_backslash_is_hidden_however_the_server_escapes_it(printed):
    r.register("KEY\\789-x")
    assert "789-x" not in r.redact(printed), r.redact(printed)


def test_an_infinite_number_is_refused_in_a_baseline_a_profile_and_an_option(tmp_path):
    """Infinity reads a healthy server as -100% against a floor, and an infinite timeout never ends: refused by name."""
    import json

    from sglperf.categories import UsageError
    from sglperf.run import profiles
    from sglperf.store import baselines

    src = json.loads(sorted(baselines.BASELINE_DIR.glob("sim-ci/*.json"))[0].read_text())
    entry = src["configs"]["rr24-cds4"]["16"]["sustained_output_tps"]
    entry["value"] = float("inf")
    (tmp_path / "b.json").write_text(json.dumps(src))
    with pytest.raises(baselines.BaselineError, match=r"configs\.rr24-cds4\.16\.sustained_output_tps\.value: Input "
                                                      r"should be a finite number"):
        baselines.load(tmp_path / "b.json")
    with pytest.raises(UsageError, match="--level-max-seconds inf: input should be a finite number"):
        profiles.MeasurementSection.check("level_max_seconds", "inf", "--level-max-seconds")
    with pytest.raises(Exception, match="finite number"):
        profiles.MeasurementSection(request_timeout_s=float("inf"))


def test_a_history_file_that_is_a_directory_is_a_usage_error_before_anything_runs(tmp_path):
    from sglperf.categories import UsageError
    from sglperf.run.options import SuiteOptions
    from sglperf.run.session import Suite

    suite = Suite(SuiteOptions(reports_dir=tmp_path / "reports", history_file=str(tmp_path)))
    with pytest.raises(UsageError, match=r"--history-file .* is a directory; give the JSONL file"):
        suite.check_outputs()


def test_a_full_disk_never_stops_the_run_and_the_summary_names_every_file_it_could_not_write(tmp_path):
    """A tmpfs of 40 KB as the reports directory (root only; skipped where mounting is refused): the run measures on,
    no OSError traceback, exit 1, and the summary names each file the full disk refused."""
    import subprocess
    import sys

    from .test_faults import ROOT

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("no tmpfs mount here (not root, or not allowed): the recorder's unit test below covers the logic")
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
                            "--perf-config", "rr24-cds4", "--levels", "8,16", "--reports-dir", str(mnt / "reports"),
                            "--history-file", str(mnt / "history.jsonl")], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-2000:]
    assert "Traceback" not in out and "OSError" not in out, out[-3000:]
    assert "INFRASTRUCTURE: could not write: " in out and "No space left on device" in out, out[-2000:]


def test_a_recorder_that_cannot_write_keeps_the_run_in_memory_and_closes_it_as_failed(tmp_path, monkeypatch):
    import errno

    from sglperf.store import recorder as rec_mod

    rec = rec_mod.RunRecorder(tmp_path, "sim-ci", "sim", {})
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(rec_mod, "write_jsonl", lambda path, rows: (_ for _ in ()).throw(full))
    rec.add_problem("rr24-cds4", "a note")
    assert rec.unwritten == {}
    monkeypatch.setattr(rec_mod, "atomic_write_json", lambda path, obj: (_ for _ in ()).throw(full))
    rec.finish("finished", True)
    assert rec.doc.status == "failed" and not rec.doc.complete
    assert rec.unwritten == {str(rec.path): "No space left on device (28)"}


def test_the_shm_files_of_a_run_killed_with_9_are_removed_by_the_next_runs_clean_up(tmp_path):
    """SGLang leaves /dev/shm/sglang_loads_*.shm; a run killed with -9 cannot remove them. Its server's registry entry
    lists what the server held once ready, and the next run's clean-up removes them once that server is gone."""
    import json
    import os
    import subprocess
    import sys

    from sglperf.run import launch

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shm = f"/dev/shm/sglang_loads_sglperf-test-{os.getpid()}_{tmp_path.name[-6:]}.shm"
    open(shm, "wb").close()
    registry = tmp_path / ".servers"
    registry.mkdir()
    (registry / f"{dead.pid}.json").write_text(json.dumps({
        "pid": dead.pid, "pgid": dead.pid, "create_time": 1.0, "owner_pid": dead.pid, "owner_create_time": 1.0,
        "name": "cpu-sglang-rr4", "argv": ["sglang"], "log": "x.log", "started": "t", "shm": [shm, "/etc/passwd"]}))
    try:
        found = launch.reap_leftovers(registry)
    finally:
        if os.path.exists(shm):
            os.unlink(shm)
            pytest.fail("the dead run's shm file was left")
    assert any(f"removed what server 'cpu-sglang-rr4' of a dead run left in /dev/shm: {shm}" == x for x in found)
    assert os.path.exists("/etc/passwd") and not list(registry.iterdir())


def test_an_empty_canary_answer_is_degenerate_and_a_short_output_gets_no_ignore_eos_hint():
    from sglperf.judge.canary import CanaryRules, check_canary
    from sglperf.measure.level import explain_failures
    from sglperf.records import CanaryOutput, RequestRecord

    empty = [CanaryOutput((5, 6), None, (), None, 0.1)]
    assert check_canary(empty, CanaryRules(), vocab=100, expected=[[1, 2]]).outcome == "degenerate"
    short = RequestRecord(0, 0.0, 1.0, 16, 16, error="short_output",
                          error_detail="3 tokens generated, 16 asked (ignore_eos)")
    assert "hint" not in explain_failures([short])
    refused = RequestRecord(0, 0.0, 1.0, 16, 16, error="http_status", http_status=422,
                            error_detail="HTTP 422: {\"detail\":\"Unexpected fields in the request: {'ignore_eos'}\"}")
    assert "hint: the server refuses ignore_eos" in explain_failures([refused])


def test_a_server_launched_onto_a_full_disk_starts_all_the_same_and_never_blocks_on_its_log(tmp_path):
    """A fresh server start on a full disk (a restart a claim asked for): its registry entry and its log cannot be
    written; it starts anyway, answers, and its output is still drained (a pipe left full would hang it)."""
    import subprocess

    import requests

    from sglperf.run.launch import LaunchSpec, launch

    from .conftest import SIM

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("no tmpfs mount here (not root, or not allowed)")
    try:
        (mnt / ".servers").mkdir()
        (mnt / "logs").mkdir()
        with open(mnt / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"x" * 4096)
            except OSError:
                pass
        srv = launch(LaunchSpec(name="sim", argv=[*SIM, "--preset", "ci", "--log-level", "debug"],
                                log_dir=mnt / "logs", registry=mnt / ".servers", launch_timeout_s=30,
                                terminate_timeout_s=10))
        try:
            assert srv._registered is None
            for _ in range(50):  # enough requests for debug logging to fill a pipe many times over
                r = requests.post(srv.url + "/generate", json={"text": "hello", "sampling_params": {
                    "max_new_tokens": 4}}, timeout=10)
                assert r.status_code == 200
        finally:
            assert not srv.stop().survivors
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
