"""Drift: a 5% step in 2%-CV noise is found, a flat series is not, over many seeds; the step is attributed to the
fingerprint field that changed there."""

import json
import subprocess
import sys

import numpy as np

from sglperf.report import drift
from sglperf.store import history
from sglperf.store.rundoc import HistoryRecord


def records(values, fingerprints):
    return [{"schema_version": 1, "run_id": f"r{i:03d}", "time": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}",
             "profile": "glm5-nvfp4-tp8", "hardware_class": "8 x B", "fingerprint": fp, "complete": True,
             "levels": [{"config": "rr2048-cds8", "level": 2048, "valid": True, "sustained_output_tps": float(v)}]}
            for i, (v, fp) in enumerate(zip(values, fingerprints))]


def step_series(seed, step):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(2000, 40, 30), rng.normal(2000 * (1 - step), 40, 30)])


def test_detection_and_false_alarm_rates_over_many_seeds():
    seeds = 200
    fps = [{"driver": "575.51"}] * 60
    hits = misplaced = false_alarms = 0
    for s in range(seeds):
        cps = drift.detect(records(step_series(s, 0.05), fps))
        hits += any(abs(c.index - 30) <= 2 for c in cps)
        misplaced += any(abs(c.index - 30) > 2 for c in cps)
        false_alarms += bool(drift.detect(records(step_series(10_000 + s, 0.0), fps)))
    print(f"5% step, 2% CV, 30+30 runs: detected within ±2 runs in {hits / seeds:.1%} of {seeds} series, "
          f"extra change points in {misplaced / seeds:.1%}; flat series with a change point: "
          f"{false_alarms / seeds:.1%}")
    assert hits / seeds >= 0.90
    assert false_alarms / seeds <= 0.05


def test_the_step_is_attributed_to_the_fingerprint_field_that_changed_there():
    fps = [{"driver": "575.51", "flashinfer": "0.7.1", "sglang": "0.5.23"}] * 30 + \
          [{"driver": "580.65", "flashinfer": "0.7.2", "sglang": "0.5.23"}] * 30
    cps = drift.detect(records(step_series(1, 0.08), fps))
    assert len(cps) == 1
    c = cps[0]
    assert abs(c.index - 30) <= 2 and c.change < -0.06
    assert ("driver", "575.51", "580.65") in c.environment_changes
    assert ("flashinfer", "0.7.1", "0.7.2") in c.environment_changes
    assert "driver 575.51 → 580.65" in c.describe() and "flashinfer 0.7.1 → 0.7.2" in c.describe()


def test_drift_command_prints_and_writes_json(tmp_path):
    fps = [{"driver": "575.51"}] * 30 + [{"driver": "580.65"}] * 30
    path = tmp_path / "history.jsonl"
    for r in records(step_series(2, 0.08), fps):
        history.append(path, HistoryRecord.model_validate(r))
    out = tmp_path / "drift.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "drift", str(path), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 change point(s)" in p.stdout and "driver 575.51 → 580.65" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["change_points"][0]["config"] == "rr2048-cds8" and doc["change_points"][0]["level"] == 2048


def test_invalid_levels_do_not_enter_the_series():
    recs = records([2000] * 10, [{}] * 10)
    recs[3]["levels"][0].update(valid=False, sustained_output_tps=None)
    assert len(history.series(recs)[("glm5-nvfp4-tp8", "8 x B", "rr2048-cds8", 2048)]) == 9


def test_an_open_loop_series_is_named_by_its_offered_rate_from_the_history_line(tmp_path):
    """A history line keeps its ladder's kind: drift names a rate level r40, never c40 (an open-loop run's levels are
    offered req/s, and the history's level is a bare number)."""
    recs = records(step_series(3, 0.10), [{"driver": "575.51"}] * 30 + [{"driver": "580.65"}] * 30)
    for r in recs:
        r.update(profile="sim-rate", open_loop=True)
        r["levels"][0].update(config="rr24-cds4", level=40)
    path = tmp_path / "history.jsonl"
    for r in recs:
        history.append(path, HistoryRecord.model_validate(r))
    (cp,) = drift.detect(history.read(path))
    assert "sim-rate/rr24-cds4 r40 sustained_output_tps" in cp.describe() and cp.level == 40
    short = drift.short_series(history.read(path)[:3], "sustained_output_tps", None, None)
    assert short and short[0].startswith("sim-rate/rr24-cds4 r40 ")
    closed = records([2000.0] * 3, [{}] * 3)
    assert drift.short_series(closed, "sustained_output_tps", None, None)[0].startswith("glm5-nvfp4-tp8/rr2048-cds8 "
                                                                                          "c2048 ")
