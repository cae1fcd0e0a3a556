"""`sglperf bench` against a simulator started by hand prints the table and writes valid JSON."""

import gzip
import json
import signal
import subprocess
import sys
import time

import pytest

from sglperf.store.rundoc import load_run

from .rundocs import bench_engine, bench_levels
from .conftest import as_background_job


def test_bench_prints_a_table_and_writes_run_json(start_sim, tmp_path):
    srv = start_sim("--enable-metrics")
    out_json, records = tmp_path / "run.json", tmp_path / "records.jsonl.gz"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "4,16", "--isl",
                        "32", "--osl", "32", "--ci-target", "0.02", "--max-seconds", "40", "--json", str(out_json),
                        "--records", str(records), "--slo-ttft-ms", "100", "--slo-tpot-ms", "15"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "sustained out tok/s" in p.stdout and "c16" in p.stdout
    assert "goodput tok/s (met)" in p.stdout, "goodput beside throughput when an SLO is given"
    assert "[c4]" in p.stderr, "live progress lines"
    doc = json.loads(out_json.read_text())
    assert doc["schema_version"] == 1 and doc["options"]["levels"] == [4, 16] and doc["status"] == "finished"
    load_run(out_json)  # the suite's own typed document: every reader validates it
    assert bench_engine(doc) == {"engine": "sim", "wire": "sglang", "new_connection_per_request": False,
                                 "detected": True, "prompt_format": "ids", "negotiated": [],
                                 "vocab_range": [1000, 32000]}
    assert "engine: sim (detected), wire sglang, ids prompts" in p.stdout
    for lvl in bench_levels(doc):
        for key in ["concurrency", "sustained_output_tps", "sustained_output_tps_ci95", "sustained_total_tps",
                    "whole_run_output_tps", "peak_output_tps", "achieved_concurrency", "server_output_tps",
                    "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "errors", "valid", "invalid_reasons", "window_s",
                    "completed"]:
            assert key in lvl, key
        assert set(lvl["ttft_ms"]) >= {"mean", "median", "p90", "p99"}
        assert lvl["valid"] is True
        assert 0 < lvl["goodput_tps"] <= lvl["sustained_output_tps"] * 1.1 and 0 < lvl["slo_met_share"] <= 1
    rows = [json.loads(x) for x in gzip.decompress(records.read_bytes()).splitlines()]
    assert {r["level"] for r in rows} == {4, 16} and all(r["error"] is None for r in rows)


def test_bench_exits_non_zero_when_a_level_is_invalid(start_sim):
    srv = start_sim("--fault-error-rate", "0.2")
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "4", "--isl",
                        "32", "--osl", "32", "--max-seconds", "5"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "NO:" in p.stdout and ("abort" in p.stdout or "stream_error" in p.stdout)


def test_bench_refuses_bad_input_clearly():
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", "http://127.0.0.1:9", "--levels",
                        "a,b"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "comma-separated integers" in p.stderr
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "INFRASTRUCTURE: connection refused at 127.0.0.1:9: nothing listens there" in p.stderr
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", "http://127.0.0.1:99999"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--url 'http://127.0.0.1:99999': Port out of range" in p.stderr


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background-job"])
def test_ctrl_c_during_the_second_level_stops_at_once_and_keeps_the_first(start_sim, tmp_path, background):
    srv = start_sim("--enable-metrics")
    out_json = tmp_path / "out.json"
    # --ci-target 0.0001: no level converges, so each runs its full 20 s and the signal lands inside the second one
    p = subprocess.Popen([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "8,16,24",
                          "--isl", "32", "--osl", "32", "--ci-target", "0.0001", "--max-seconds", "20",
                          "--json", str(out_json)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=as_background_job if background else None)
    try:
        for line in p.stderr:  # progress lines, one per second; wait for a state, not a duration
            if line.startswith("[c16]"):
                break
        p.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        p.kill()
    assert took < 5, f"Ctrl-C took {took:.1f} s to stop the sweep"
    assert p.returncode == 130, out + err
    assert "interrupted during c16: 1 finished level(s) above" in err
    assert "c8" in out and "c16" not in out.split("sustained = steady-state")[0].split("\n", 2)[-1]
    doc = json.loads(out_json.read_text())
    assert doc["status"] == "interrupted" and [lv["concurrency"] for lv in bench_levels(doc)] == [8]


def test_prompt_ids_outside_the_served_vocabulary_are_refused_before_any_level(start_sim):
    srv = start_sim("--enable-metrics")  # the ci preset serves a 32,000-token vocabulary
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "4",
                        "--vocab-range", "1000,40000"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--vocab-range 1000,40000: the served model's vocabulary has 32000 tokens; give HIGH <= 32000" in p.stderr
    assert "[c4]" not in p.stderr, "nothing was measured"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "4",
                        "--vocab-range", "100"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "expected LOW,HIGH (two integers, e.g. 1000,30000), got '100'" in p.stderr
