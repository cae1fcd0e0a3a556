"""Baseline files: validation with clear errors, the shipped seed numbers, atomic/locked writes, calibration."""

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest

from sglperf.store import baselines
from sglperf.judge import calibration
from sglperf.store.baselines import BaselineError

from .rundocs import result, run_doc

SEED = Path(baselines.BASELINE_DIR) / "glm5-nvfp4-tp8" / "8-x-nvidia-rtx-pro-6000-blackwell.json"
SIM_CI = Path(baselines.BASELINE_DIR) / "sim-ci" / "sim-ci.json"


def test_the_shipped_seed_baseline_holds_the_articles_numbers_exactly():
    bf = baselines.load(SEED)
    assert bf.hardware_class == "8 x NVIDIA RTX PRO 6000 Blackwell" and (bf.isl, bf.osl) == (128, 128)
    out = {c: {int(lv): m["whole_run_output_tps"].value for lv, m in lvls.items()} for c, lvls in bf.configs.items()}
    tot = {c: {int(lv): m["whole_run_total_tps"].value for lv, m in lvls.items() if "whole_run_total_tps" in m}
           for c, lvls in bf.configs.items()}
    assert out == {"rr1024-cds4": {256: 705, 512: 1106, 1024: 1601, 2048: 1640},
                   "rr2048-cds8": {256: 705, 512: 1111, 1024: 1631, 2048: 2095, 3072: 2062}}
    assert tot == {"rr1024-cds4": {256: 1383, 512: 2205, 1024: 3190, 2048: 3249},
                   "rr2048-cds8": {256: 1384, 512: 2216, 1024: 3250, 2048: 4151}}
    for lvls in bf.configs.values():
        for metrics in lvls.values():
            assert all("bench_serving whole-run" in e.source for e in metrics.values())


def test_every_shipped_baseline_validates():
    files = sorted(baselines.BASELINE_DIR.glob("*/*.json"))
    assert len(files) >= 4, f"the shipped baselines are missing from {baselines.BASELINE_DIR}: {files}"
    for f in files:
        baselines.load(f)


def test_malformed_json_names_the_file(tmp_path):
    f = tmp_path / "b.json"
    f.write_text('{"schema_version": 1,')
    with pytest.raises(BaselineError, match=r"b\.json: not valid JSON"):
        baselines.load(f)


def test_missing_field_and_unknown_field_name_the_path(tmp_path):
    doc = json.loads(SIM_CI.read_text())
    del doc["configs"]["rr24-cds4"]["8"]["sustained_output_tps"]["tolerance"]
    doc["configs"]["rr24-cds4"]["16"]["sustained_output_tps"]["tolerence"] = 0.1
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(BaselineError) as e:
        baselines.load(f)
    assert "configs.rr24-cds4.8.sustained_output_tps.tolerance: Field required" in str(e.value)
    assert "configs.rr24-cds4.16.sustained_output_tps.tolerence: unknown field" in str(e.value)


def test_old_or_unknown_schema_version_is_refused(tmp_path):
    doc = json.loads(SIM_CI.read_text())
    doc["schema_version"] = 0
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"b\.json: schema_version: 0 is not supported"):
        baselines.load(f)


def test_a_baseline_for_another_hardware_class_is_refused():
    bf = baselines.load(SEED)
    with pytest.raises(BaselineError, match="is for hardware class '8 x NVIDIA RTX PRO 6000 Blackwell', but this run "
                                            "is on 'sim:ci'"):
        baselines.check_hardware(bf, SEED, "sim:ci")


def test_tolerance_comes_from_a_one_sided_99_percent_prediction_bound():
    from scipy import stats

    vals = [1000, 1010, 990, 1005, 995, 1000, 1002, 998]
    mean, cv, tol = calibration.calibrated_tolerance(vals, floor=0.0)
    sd = (sum((v - mean) ** 2 for v in vals) / 7) ** 0.5
    assert tol == pytest.approx(stats.t.ppf(0.99, 7) * sd * (1 + 1 / 8) ** 0.5 / mean)
    assert calibration.calibrated_tolerance(vals)[2] == calibration.MIN_TOLERANCE, "never below the floor"


def test_calibrated_tolerance_keeps_false_alarms_at_or_below_one_percent():
    import numpy as np

    rng = np.random.default_rng(0)
    alarms = trials = 0
    for _ in range(4000):
        runs = rng.normal(1000, 30, 5)  # 3% CV
        mean, _, tol = calibration.calibrated_tolerance(list(runs), floor=0.0)
        alarms += rng.normal(1000, 30) < mean * (1 - tol)
        trials += 1
    print(f"false-alarm rate with calibrated tolerances: {alarms / trials:.2%} (target <= 1%)")
    assert alarms / trials <= 0.015


def _run(run_id, values, valid=True):
    return json.loads(run_doc(run_id, {lv: result(lv, valid=valid, value=v) for lv, v in values.items()},
                              fingerprint={"driver": "1"}).model_dump_json())


def test_update_writes_the_diff_and_never_takes_invalid_levels(tmp_path):
    run = json.loads(run_doc("r1", {8: result(8, value=900.0), 16: result(16, value=1500.0),
                                    32: result(32, valid=False, value=5.0)}).model_dump_json())
    (tmp_path / "run.json").write_text(json.dumps(run))
    target = tmp_path / "base.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "update", "--from", str(tmp_path / "run.json"),
                        "--file", str(target)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "+ rr24-cds4 c8 sustained_output_tps: 900.0" in p.stdout
    bf = baselines.load(target)
    assert set(bf.configs["rr24-cds4"]) == {"8", "16"}, "the invalid level stays out"
    run2 = _run("r2", {8: 950.0})
    (tmp_path / "run2.json").write_text(json.dumps(run2))
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "update", "--from",
                        str(tmp_path / "run2.json"), "--file", str(target)], capture_output=True, text=True, timeout=60)
    assert "~ rr24-cds4 c8 sustained_output_tps: 900.0 → 950.0 (+5.6%)" in p.stdout
    assert baselines.load(target).configs["rr24-cds4"]["16"]["sustained_output_tps"].value == 1500.0, "kept"


def test_calibrate_from_run_files(tmp_path):
    files = []
    for i, v in enumerate([1000, 1020, 980, 1010]):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps(_run(f"r{i}", {8: float(v)})))
        files.append(str(f))
    target = tmp_path / "base.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", *files, "--file", str(target)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    e = baselines.load(target).configs["rr24-cds4"]["8"]["sustained_output_tps"]
    assert e.runs == 4 and e.value == pytest.approx(1002.5) and e.noise_cv == pytest.approx(0.01708, abs=1e-4)
    assert e.tolerance > calibration.MIN_TOLERANCE


def test_a_run_file_of_another_version_or_shape_is_a_clear_error(tmp_path):
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"schema_version": 0, "configs": {}}))
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "update", "--from", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "old.json: schema_version: 0 is not supported" in p.stderr
    doc = _run("r1", {8: 900.0})
    del doc["configs"]["rr24-cds4"]["levels"]["8"]["valid"]
    f.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "update", "--from", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "old.json: configs.rr24-cds4.levels.8.valid: Field required" in p.stderr


def _writer(path, i):
    bf = baselines.BaselineFile(schema_version=1, profile="p", hardware_class="h", isl=1, osl=1, configs={
        f"c{i}": {"8": {"sustained_output_tps": baselines.Entry(metric="sustained_output_tps", value=100.0 + i,
                                                                tolerance=0.05, taken_at="x", source="s",
                                                                sglperf_version="0")}}})
    for _ in range(20):
        with baselines.lock_for(path):
            old = baselines.load(path) if Path(path).exists() else None
            merged = baselines.merge(old, bf)
            from sglperf.fileio import atomic_write_json

            atomic_write_json(path, merged.model_dump(mode="json", exclude_none=True))


def test_two_processes_updating_one_baseline_both_land_intact(tmp_path):
    path = tmp_path / "b.json"
    procs = [mp.get_context("spawn").Process(target=_writer, args=(str(path), i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    bf = baselines.load(path)
    assert set(bf.configs) == {"c0", "c1"}
    assert not list(tmp_path.glob(".b.json.*.tmp")), "no half-written temp file is left"


def test_each_configs_entries_keep_that_configs_server_args():
    """A run opens one server per config; a baseline entry must not carry another config's arguments (else every
    floor message but the last config's would say its arguments changed)."""
    doc = run_doc("r1", {8: result(8, value=1000.0)}, fingerprint={"driver": "580", "server_args": "--parallel 64"})
    doc.configs["rr24-cds4"].fingerprint = {"driver": "580", "server_args": "--parallel 32"}
    doc.configs["rr64-cds8"] = doc.configs["rr24-cds4"].model_copy(update={"fingerprint": None})
    assert doc.config_fingerprint("rr24-cds4")["server_args"] == "--parallel 32"
    # a file from before configs had their own: the run's server args belong to its last config, so none are kept
    assert doc.config_fingerprint("rr64-cds8") == {"driver": "580"}
    bf = baselines.from_run(doc, tolerance=0.05, isl=32, osl=32)
    assert bf.configs["rr24-cds4"]["8"]["sustained_output_tps"].fingerprint["server_args"] == "--parallel 32"
    assert "server_args" not in bf.configs["rr64-cds8"]["8"]["sustained_output_tps"].fingerprint


def test_the_h200_run_file_validates_and_holds_real_gpu_telemetry():
    """The run file ci/gpu-proof.sh wrote on the lent H200 (tests/data/gpu): today's parser reads it, and what it
    recorded of the GPU is what the GPU path produces."""
    from sglperf.store.rundoc import load_run

    run = load_run(Path(__file__).parent / "data" / "gpu" / "h200-gpu1-llamacpp-run.json")
    fp = run.fingerprint
    assert (fp["hardware_class"], fp["gpu_name"], fp["driver"], fp["cuda"], fp["gpu_indices"]) == \
        ("1 x NVIDIA H200", "NVIDIA H200", "580.159.04", "13.0", [0])
    for cname, c in run.configs.items():
        assert c.teardown["gpu_release_s"] is not None and c.teardown["gpu_held_by"] == []
        for lv, level in c.levels.items():
            g = level.gpu["0"]
            assert g["samples"] >= 5 and g["sm_mhz_mean"] == 1980.0 and 0 < g["power_w_mean"] < g["power_limit_w"]
            assert level.disturbances == ()
            # the running count from llama.cpp's busy slots per decode step: the slot count past the cap
            assert level.server_running_source == "per decode step"
            if int(lv) > c.plateau.ceiling["cap"]:
                assert level.server_max_running == pytest.approx(c.plateau.ceiling["cap"], abs=0.1)
        assert c.plateau.passed and c.plateau.attributed_to == "cap"
    assert run.ab.passed and run.ab.gains["64"] > 0.3


def test_the_seeds_tpot_is_information_not_a_ceiling():
    bf = baselines.load(SEED)
    assert not any(e.is_latency for lvls in bf.configs.values() for m in lvls.values() for e in m.values())
    note = bf.configs["rr2048-cds8"]["3072"]["whole_run_output_tps"].note
    assert "mean TPOT of 905 ms" in note and "information, not a ceiling" in note


def test_latency_entries_are_calibrated_beside_the_throughput_ones(tmp_path):
    import dataclasses

    from sglperf.records import Summary

    files = []
    for i, (v, ttft) in enumerate([(1000, 100.0), (1020, 104.0), (980, 98.0), (1010, 101.0)]):
        r = dataclasses.replace(result(8, value=float(v)), ttft_ms=Summary(ttft, ttft, ttft, ttft * 3, 800))
        f = tmp_path / f"r{i}.json"
        f.write_text(run_doc(f"r{i}", {8: r}).model_dump_json())
        files.append(str(f))
    target = tmp_path / "base.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", *files, "--file", str(target),
                        "--metric", "sustained_output_tps", "--metric", "latency"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    m = baselines.load(target).configs["rr24-cds4"]["8"]
    assert m["sustained_output_tps"].floor < m["sustained_output_tps"].value
    t = m["ttft_p50_ms"]
    assert t.is_latency and t.value == pytest.approx(100.75) and t.ceiling > t.value
    assert m["ttft_p99_ms"].value == pytest.approx(302.25)
    noisy = tmp_path / "noisy.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", *files, "--file", str(noisy),
                        "--metric", "ttft_p50_ms", "--max-tolerance", "0.05"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "too noisy to judge in one run" in p.stdout, p.stdout + p.stderr
    assert "calibrate kept no level of 4 runs" in p.stderr and "nothing written" in p.stderr
    assert not noisy.exists(), "an entry too noisy to judge is left out, never written; a baseline of none is no file"
