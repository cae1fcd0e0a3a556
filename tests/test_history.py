"""Run history: one line per run, invalid levels never as values, locked appends, torn lines skipped."""

import json
import multiprocessing as mp
import warnings

import pytest

from sglperf.store import history

from .rundocs import result, run_doc


def run(run_id, valid=True, value=1000.0):
    return run_doc(run_id, {8: result(8, valid=valid, value=value)})


def test_invalid_levels_are_recorded_as_invalid_never_as_values():
    rec = history.record_from_run(run("a", valid=False, value=123.0))
    lv = rec.levels[0]
    assert lv.valid is False and lv.sustained_output_tps is None and lv.invalid_reasons == ["x"]


def test_append_and_read(tmp_path):
    path = tmp_path / "h.jsonl"
    for i in range(3):
        history.append(path, history.record_from_run(run(f"r{i}", value=1000.0 + i)))
    recs = history.read(path)
    assert [r["run_id"] for r in recs] == ["r0", "r1", "r2"]
    s = history.series(recs)
    assert [v for _, v in s[("sim-ci", "sim:ci", "rr24-cds4", 8)]] == [1000.0, 1001.0, 1002.0]


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_append_starts_clean(tmp_path):
    path = tmp_path / "h.jsonl"
    history.append(path, history.record_from_run(run("r0")))
    full = history.record_from_run(run("r1")).model_dump_json()
    with open(path, "a") as f:
        f.write(full[: len(full) // 2])  # a run killed mid-write
    with pytest.warns(history.TornLineWarning, match=r"h\.jsonl:2: skipped a torn"):
        assert [r["run_id"] for r in history.read(path)] == ["r0"]
    history.append(path, history.record_from_run(run("r2")))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert [r["run_id"] for r in history.read(path)] == ["r0", "r2"]


def test_a_record_missing_a_field_is_skipped_with_a_warning_naming_line_and_field(tmp_path):
    path = tmp_path / "h.jsonl"
    history.append(path, history.record_from_run(run("r0")))
    broken = json.loads(history.record_from_run(run("r1")).model_dump_json())
    del broken["levels"][0]["config"]
    with open(path, "a") as f:
        f.write(json.dumps(broken) + "\n")
    with pytest.warns(history.TornLineWarning, match=r"h\.jsonl:2: levels\.0\.config: Field required"):
        assert [r["run_id"] for r in history.read(path)] == ["r0"]


def test_a_missing_history_is_a_clear_error(tmp_path):
    with pytest.raises(history.HistoryError, match="does not exist"):
        history.read(tmp_path / "nope.jsonl")


def _appender(path, who):
    for i in range(50):
        history.append(path, history.record_from_run(run(f"{who}-{i}")))


def test_two_processes_appending_at_once_both_land_intact(tmp_path):
    path = tmp_path / "h.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(str(path), w)) for w in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line at all
        recs = history.read(path)
    assert len(recs) == 100 and {r["run_id"].split("-")[0] for r in recs} == {"a", "b"}


def test_latency_percentiles_and_goodput_go_into_history_and_drift_can_follow_them(tmp_path):
    import dataclasses

    from sglperf.report import drift
    from sglperf.records import Summary

    path = tmp_path / "h.jsonl"
    for i, ttft in enumerate([100.0] * 6 + [150.0] * 6):
        r = dataclasses.replace(result(8, value=1000.0), ttft_ms=Summary(ttft, ttft, ttft, ttft * 2, 500),
                                goodput_tps=900.0 if ttft < 120 else 600.0, goodput_rps=9.0)
        history.append(path, history.record_from_run(run_doc(f"r{i:02d}", {8: r})))
    rec = history.read(path)[0]["levels"][0]
    assert (rec["ttft_p50_ms"], rec["ttft_p99_ms"], rec["goodput_tps"]) == (100.0, 200.0, 900.0)
    cps = drift.detect(history.read(path), metric="ttft_p50_ms")
    assert len(cps) == 1 and cps[0].change == pytest.approx(0.5) and cps[0].index == 6
    assert drift.detect(history.read(path), metric="goodput_tps")[0].change == pytest.approx(-1 / 3)
