"""Allure results from the suite, the offline HTML report (pinned npm allure), its metrics history, the
pytest-benchmark JSON, and the CI workflow files."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import assert_suite_passed, user_env

ROOT = Path(__file__).resolve().parent.parent
needs_node = pytest.mark.skipif(not shutil.which("npm"), reason="Node.js/npm not installed")


def suite(tmp_path, alluredir, *extra):
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-m", "sim", "--levels", "8,32",
           "--perf-config", "rr24-cds4", "--alluredir", str(alluredir), "--reports-dir", str(tmp_path / "reports"),
           *extra]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=user_env())
    assert_suite_passed(p.returncode, p.stdout)
    return p


def report(results, out, hist, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "sglperf.cli", "report", "--results", str(results), "--output",
                           str(out), "--history", str(hist), *extra], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("allure")
    bench = tmp / "benchmark.json"
    suite(tmp / "a", tmp / "results1", "--benchmark-json", str(bench))
    suite(tmp / "b", tmp / "results2")
    return tmp, bench


def test_results_carry_labels_excluded_parameters_and_plots(two_runs):
    tmp, _ = two_runs
    results = [json.loads(f.read_text()) for f in (tmp / "results1").glob("*-result.json")]
    floor = [r for r in results if "sustained throughput floor" in r["name"]]
    assert len(floor) == 2
    for r in floor:
        labels = {(x["name"], x["value"]) for x in r["labels"]}
        assert ("epic", "sim-ci") in labels and ("feature", "rr24-cds4") in labels
        assert any(n == "story" and v in ("c8", "c32") for n, v in labels)
        params = {p["name"]: p for p in r["parameters"]}
        assert params["sustained output tok/s"]["excluded"] is True
        names = {a["name"] for a in r["attachments"]}
        assert {"level result.json", "throughput over time.png", "TTFT and ITL distributions.png"} <= names
        # the records go gzipped past 1 MB (a level that ran to its maximum: a fresh-clone CI read c32 for 32 s)
        assert any(n.startswith("server samples") for n in names) and names & {"requests.jsonl", "requests.jsonl.gz"}
    plateau = [r for r in results if "KV plateau" in r["name"]][0]
    assert {"throughput vs concurrency.png", "server command line", "server_info.json"} <= \
        {a["name"] for a in plateau["attachments"]}
    env = (tmp / "results1" / "environment.properties").read_text()
    assert "hardware_class=sim:ci" in env
    assert json.loads((tmp / "results1" / "executor.json").read_text())["name"]
    perf = json.loads(next((tmp / "results1").glob("*-perf.json")).read_text())
    # throughput, latency and goodput (sim-ci has an [slo]) per level
    assert {e["key"] for e in perf} == {f"{kind}.sim-ci.rr24-cds4.c{lv}" for lv in (8, 32)
                                        for kind in ("throughput", "ttft_mean", "ttft_p99", "tpot_p99", "goodput_tps",
                                                     "goodput_rps")}


def test_benchmark_json_has_every_level_with_its_metrics(two_runs):
    _, bench = two_runs
    doc = json.loads(bench.read_text())
    by_name = {b["name"]: b for b in doc["benchmarks"]}
    assert set(by_name) == {"test_sustained_throughput_floor[sim-ci/rr24-cds4/c8]",
                            "test_sustained_throughput_floor[sim-ci/rr24-cds4/c32]"}
    for b in by_name.values():
        info = b["extra_info"]
        assert info["valid"] is True and info["sustained_output_tps"] > 0
        assert info["sustained_output_tps_ci95"] is not None
        assert {"whole_run_output_tps", "peak_output_tps", "ttft_p99_ms", "errors"} <= set(info)
        assert b["stats"]["rounds"] == 1


@needs_node
def test_the_html_report_has_every_metric_history_and_no_analytics(two_runs):
    tmp, _ = two_runs
    hist = tmp / "allure-history.jsonl"
    for i in (1, 2):
        out = tmp / f"report{i}"
        p = report(tmp / f"results{i}", out, hist)
        assert p.returncode == 0, p.stderr
    index = tmp / "report2" / "index.html"
    assert index.exists() and f"report: {index.resolve()}" in p.stdout
    assert (tmp / "report2" / "awesome" / "index.html").exists()
    pages = list((tmp / "report2").rglob("*.html"))
    assert pages and not any("googletagmanager" in x.read_text(errors="replace") for x in pages)
    metrics = json.loads((tmp / "report2" / "awesome" / "widgets" / "metrics.json").read_text())
    keys = {m["key"] for m in metrics["current"]}
    assert keys == {f"{kind}.sim-ci.rr24-cds4.c{lv}" for lv in (8, 32)
                    for kind in ("throughput", "ttft_mean", "ttft_p99", "tpot_p99", "goodput_tps", "goodput_rps")}
    for m in metrics["current"]:
        assert m["unit"] in ("tok/s", "ms", "req/s") and m["better"] in ("higher", "lower"), "every key declared"
    assert len(metrics["history"]) == 1 and set(metrics["history"][0]["metrics"]) == keys, \
        "the second report shows the first run as history: two points per key"
    pngs = list((tmp / "report2" / "awesome" / "data" / "attachments").glob("*.png"))
    assert len(pngs) >= 5, "timeline and latency plots per level, the curve per config"


@needs_node
def test_single_file_report(two_runs, tmp_path):
    tmp, _ = two_runs
    p = report(tmp / "results1", tmp_path / "single", tmp_path / "h.jsonl", "--single-file")
    assert p.returncode == 0, p.stderr
    assert "single file" in p.stdout
    assert [x.name for x in (tmp_path / "single").rglob("*.html")] == ["index.html"]
    assert (tmp_path / "single" / "index.html").exists()


def test_missing_node_is_a_clear_error_not_a_traceback(two_runs, tmp_path):
    tmp, _ = two_runs
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    p = report(tmp / "results1", tmp_path / "out", tmp_path / "h.jsonl", env=env)
    assert p.returncode == 2
    assert "needs Node.js" in p.stderr and "apt-get install" in p.stderr and "Traceback" not in p.stderr


def test_no_results_is_a_clear_error(tmp_path):
    p = report(tmp_path / "nothing", tmp_path / "out", tmp_path / "h.jsonl")
    assert p.returncode == 2 and "no Allure results" in p.stderr


def test_workflow_files_are_valid_github_actions():
    files = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    assert len(files) == 2
    p = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                        *files], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_blackwell_workflow_runs_the_gpu_suite_on_the_right_runner():
    text = (ROOT / ".github" / "workflows" / "perf-blackwell.yml").read_text()
    for needle in ["[self-hosted, linux, x64, blackwell, gpu8]", "schedule:", "workflow_dispatch:", "concurrency:",
                   "timeout-minutes:", "sglang_version", "ci/run-perf.sh", "upload-artifact"]:
        assert needle in text, needle
    script = (ROOT / "ci" / "run-perf.sh").read_text()
    assert "MARKER=${MARKER:-gpu8}" in script and 'sglang==${SGLANG_VERSION}' in script


def test_the_nightly_script_itself_runs_the_suite_and_exits_with_its_code(tmp_path):
    """ci/run-perf.sh end to end against the simulator (the environment as prepared here), one config, one level:
    the same script the Blackwell runner and the GPU proof run."""
    env = user_env(PROFILE="sim-ci", MARKER="sim", LEVELS="8", SGLPERF_SKIP_INSTALL="1", PYTHON=sys.executable,
                   SGLPERF_PERSIST_DIR=str(tmp_path / "persist"), REPORTS_DIR=str(tmp_path / "reports"),
                   EXTRA_PYTEST_ARGS="--perf-config rr24-cds4 -p no:randomly")
    p = subprocess.run(["bash", str(ROOT / "ci" / "run-perf.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=env)
    assert_suite_passed(p.returncode, p.stdout + p.stderr)
    assert list((tmp_path / "reports" / "runs").glob("*.json")), "the run file"
    assert any((tmp_path / "reports" / "allure-results").glob("*-result.json")), "Allure results"
    assert (tmp_path / "persist" / "history.jsonl").read_text().count("\n") == 1, "one history record"
    assert (tmp_path / "reports" / "drift.json").exists() or "drift" in p.stdout + p.stderr
    bad = subprocess.run(["bash", str(ROOT / "ci" / "run-perf.sh")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env={**env, "PROFILE": "no-such-profile"})
    assert bad.returncode not in (0, 5) and "no-such-profile" in bad.stdout + bad.stderr
