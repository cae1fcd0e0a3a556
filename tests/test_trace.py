"""Trace replay (`sglperf replay`, measure/trace.py): a Mooncake-layout trace of our own (profiles/traces) read,
its shared blocks made equal token blocks, sent on its timestamps against the simulator, with each request's send
lateness and the prefix cache's share against what the shared blocks allow; bad traces refused naming the line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglperf.measure import trace as tr

TRACE = Path(__file__).parents[1] / "profiles" / "traces" / "agent-sessions.jsonl"


def test_equal_hash_ids_are_equal_token_blocks_and_nothing_else_is_shared():
    reqs = tr.read_mooncake(TRACE, 16)
    a, b = reqs[0], next(r for r in reqs if r.hash_ids[:1] == reqs[0].hash_ids[:1] and len(r.hash_ids) == 3)
    pa, pb = (tr.prompt(r, seed=0, low=100, high=32000, block=16) for r in (a, b))
    assert len(pb.ids) == b.isl and pb.max_tokens == b.osl
    assert pb.ids[:min(a.isl, 16)] == pa.ids[:min(a.isl, 16)]  # the block they share
    other = next(r for r in reqs if r.hash_ids[0] != a.hash_ids[0])
    assert tr.prompt(other, seed=0, low=100, high=32000, block=16).ids[:8] != pa.ids[:8]


def test_what_a_prefix_cache_may_serve_is_the_leading_blocks_an_earlier_request_sent():
    reqs = [tr.TraceRequest(0, 40, 4, (1, 2, 3)), tr.TraceRequest(1, 48, 4, (1, 2, 9)),
            tr.TraceRequest(2, 30, 4, (7, 2)), tr.TraceRequest(3, 16, 4, (1,)),
            tr.TraceRequest(4, 48, 4, (1, 2, 3))]
    # block 3 of the first request held 8 of its 16 tokens: the fifth shares those 8 and no more
    assert tr.shared_tokens(reqs, 16) == [0, 32, 0, 15, 40]  # a whole-prompt hit still computes its last token


@pytest.mark.parametrize("line, said", [
    ('{"timestamp": -5, "input_length": 10, "output_length": 4, "hash_ids": [1]}', "timestamp -5"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 4}', "input_length 0"),
    ('{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}', "1 hash_ids of 16 tokens"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": ["a"]}', "hash_ids"),
    ("not json", "not JSON"),
])
def test_a_trace_line_that_is_not_a_request_is_refused_naming_the_line(tmp_path, line, said):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(tr.TraceError, match=f"{f}:2: .*{said}".replace("[", r"\[")):
        tr.read_mooncake(f, 16)


def test_a_trace_replayed_on_its_timestamps_says_how_late_it_sent_and_how_much_the_cache_served(start_sim,
                                                                                                  tmp_path):
    def replay(srv, name):
        out = tmp_path / f"{name}.json"
        p = subprocess.run([sys.executable, "-m", "sglperf.cli", "replay", "--url", srv.url, "--trace", str(TRACE),
                            "--block-tokens", "16", "--json", str(out)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(out.read_text())

    on = replay(start_sim("--enable-metrics"), "on")
    assert on["requests"] == 48 and on["failed"] == 0
    assert on["send_late_ms"]["p99"] < 50, on["send_late_ms"]  # loopback, an idle client: sent on time
    assert on["cache_allowed"] > 0.6 and on["cache_share"] >= 0.9 * on["cache_allowed"], on
    off = replay(start_sim("--enable-metrics", "--disable-radix-cache", name="off"), "off")
    assert off["cache_share"] == 0.0 and off["cache_allowed"] == on["cache_allowed"]


def test_a_looped_trace_keeps_its_shared_blocks_inside_each_pass_and_shares_nothing_across_passes():
    """Pass p renames every hash_id, so a prefix cache serves in each pass what the trace's shared blocks allow and no
    more; pass 1 is due one period after pass 0, at the speed-up's pace."""
    trace = tr.load(TRACE, 16)
    n = len(trace.requests)
    make = lambda k: trace.prompt(k, seed=0, low=100, high=32000).ids  # noqa: E731
    first, again = trace.requests[0], next(i for i, r in enumerate(trace.requests)
                                           if i and r.hash_ids[:1] == trace.requests[0].hash_ids[:1])
    block = min(first.isl, 16)
    assert make(again)[:block] == make(0)[:block], "inside a pass: equal hash_ids, equal blocks"
    assert make(n + again)[:block] == make(n)[:block] != make(0)[:block], "pass 1 shares within itself, not with 0"
    assert trace.due_s(n, 2.0) == pytest.approx(trace.period_s / 2) and trace.due_s(1, 1.0) == trace.requests[1].at_s
    assert trace.rate == pytest.approx(n / trace.period_s) and trace.allowed == tuple(tr.shared_tokens(
        list(trace.requests), 16))


def _profile(tmp_path, **workload) -> Path:
    """sim-trace's file with its workload keys changed (None: removed), beside a copy of its trace."""
    from sglperf.run import profiles

    (tmp_path / "traces").mkdir(exist_ok=True)
    (tmp_path / "traces" / TRACE.name).write_bytes(TRACE.read_bytes())
    lines = (profiles.PROFILE_DIR / "sim-trace.toml").read_text().splitlines()
    out, section = [], None
    for ln in lines:
        if ln.startswith("["):
            section = ln
        key = ln.split("=")[0].strip()
        if section == "[workload]" and key in workload:
            value = workload.pop(key)
            if value is not None:
                out.append(f"{key} = {json.dumps(value)}")
            continue
        out.append(ln)
    text = "\n".join(out) + "\n"
    if workload:  # keys the profile did not have, or a ladder to swap
        text = text.replace("[workload]\n", "[workload]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                                                     for k, v in workload.items()))
    f = tmp_path / "p.toml"
    f.write_text(text)
    return f


@pytest.mark.parametrize("change, said", [
    (dict(trace=None), "needs trace"),
    (dict(trace="traces/missing.jsonl"), "missing.jsonl: No such file"),
    (dict(isl=100), "the trace sends up to 182 tokens in and 16 out: isl (100)"),
    (dict(prompt_format="text"), "prompt_format \"ids\""),
    (dict(kind="random"), "trace and block_tokens are for kind = \"trace\""),
])
def test_a_trace_profile_that_cannot_be_replayed_is_refused_naming_the_key(tmp_path, change, said):
    from sglperf.run import profiles

    with pytest.raises(profiles.ProfileError, match=re.escape(said)):
        profiles.load(str(_profile(tmp_path, **change)))


def test_a_trace_profile_reads_its_trace_beside_it_and_replays_it_at_offered_rates(tmp_path):
    from sglperf.run import profiles

    prof = profiles.load(str(_profile(tmp_path)))
    w = prof.workload
    assert w.describe().startswith("trace agent-sessions.jsonl (") and "48 requests over 3.73 s" in w.describe()
    assert w.client_workload().trace.requests == tr.load(TRACE, 16).requests
    bad = tmp_path / "traces" / TRACE.name
    bad.write_text(bad.read_text() + '{"timestamp": 5000, "input_length": 0, "output_length": 4}\n')
    with pytest.raises(profiles.ProfileError, match=r"workload: .*agent-sessions.jsonl:49: input_length 0"):
        profiles.load(str(tmp_path / "p.toml"))
    ladder = tmp_path / "p.toml"
    ladder.write_text(ladder.read_text().replace("rates = [20, 40]", "levels = [4, 8]"))
    bad.write_bytes(TRACE.read_bytes())
    with pytest.raises(profiles.ProfileError, match="a trace is replayed at offered rates"):
        profiles.load(str(ladder))


def test_a_trace_profile_is_judged_like_the_others_and_a_disabled_radix_cache_fails_as_a_prefix_cache_regression(
        tmp_path):
    """sim-trace replays the trace at 10 and 20 req/s against its committed baseline (throughput, latency and the
    cache's share): green, each level saying how late it sent and what the cache served, in the summary, the run
    file, the history and Allure. With the radix cache off the shared blocks are recomputed: PREFIX CACHE REGRESSION."""
    from .conftest import user_env
    from .test_faults import ROOT

    def suite(where, *args):
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
                            "--profile", "sim-trace", "--reports-dir", str(where), *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=user_env())
        return p, p.stdout + p.stderr

    p, out = suite(tmp_path / "on", "--alluredir", str(tmp_path / "allure"))
    assert p.returncode == 0, out[-3000:]
    # what the blocks allow depends on which requests a window holds (tests/data/sim-trace: 0.756-0.762)
    assert "    trace sent late by p50 " in out and re.search(r"the shared blocks allow 0\.7[5-7]\d", out), out[-3000:]
    run = json.loads(next((tmp_path / "on" / "runs").glob("*.json")).read_text())
    assert run["fingerprint"]["workload"].startswith("trace agent-sessions.jsonl (")
    for rate, level in run["configs"]["rr24"]["levels"].items():
        assert level["valid"] and level["send_late_p99_ms"] < 0.25 * level["trace_gap_p50_ms"], (rate, level)
        assert level["prefix_cache_share"] == pytest.approx(level["prefix_cache_allowed"], abs=0.02), level
    (line,) = [json.loads(x) for x in (tmp_path / "on" / "history.jsonl").read_text().splitlines()]
    assert all(lv["send_late_p99_ms"] is not None for lv in line["levels"]), "the history keeps the lateness"
    params = [prm for f in (tmp_path / "allure").glob("*-result.json")
              for prm in json.loads(f.read_text()).get("parameters", [])]
    assert any(prm["name"] == "trace replay" and "trace sent late by" in prm["value"] for prm in params)

    # the latency ceilings left out: TPOT moves 2-4% with the cache off, and an undecided ceiling takes fresh starts
    p, out = suite(tmp_path / "off", "--levels", "20", "--server-arg=--disable-radix-cache", "-k", "not latency")
    assert p.returncode == 1, out[-3000:]
    assert "PREFIX CACHE REGRESSION: sim-trace/rr24 r20: 0.000 ± 0.000 of prompt tokens served" in out, out[-3000:]
    assert "shared prefixes are recomputed" in out


def test_an_open_loops_window_spans_the_lulls_between_its_bursts_and_a_closed_loops_breaks_at_a_gap():
    """A trace at a low rate is idle between bursts (here 3 requests 20 ms apart, then 400 ms of nothing): its
    traffic, so the window runs from the warm-up to the last token. A closed loop with nothing in flight for as
    long has broken its loop: its window is the longest busy run."""
    from sglperf.measure.metrics import level_result
    from sglperf.measure.validity import MeasurementPolicy
    from sglperf.records import RequestRecord

    recs = []
    for burst in range(60):
        for j in range(3):
            t = burst * 0.5 + j * 0.02
            recs.append(RequestRecord(len(recs), t, t + 0.06, 32, 4, tuple(t + 0.015 * (k + 1) for k in range(4)),
                                      (1, 1, 1, 1), 32, 4, "length", due_time=t))
    policy = MeasurementPolicy(min_completions=20)
    opened = level_result(recs, concurrency=None, rate=6.0, isl=32, osl=4, policy=policy)
    assert opened.window_s > 25 and opened.completed_in_window > 150, (opened.window_s, opened.invalid_reasons)
    closed = level_result(recs, concurrency=3, rate=None, isl=32, osl=4, policy=policy)
    assert closed.window_s < 0.2, closed.window_s
    assert opened.send_late_p50_ms == 0.0 and opened.trace_gap_p50_ms == pytest.approx(20.0)


def test_the_committed_sim_trace_baseline_is_calibrate_over_its_five_runs():
    """tests/data/sim-trace holds the five runs the baseline was calibrated from (docs/measurement.md, "A trace as a
    judged workload"); calibrating them again makes the committed entries, value for value."""
    from sglperf.judge import calibration
    from sglperf.run import profiles
    from sglperf.store import baselines
    from sglperf.store.rundoc import load_run

    runs = [load_run(p) for p in sorted((Path(__file__).parent / "data" / "sim-trace").glob("*.json"))]
    prof = profiles.load("sim-trace")
    committed = baselines.load(profiles.PROFILE_DIR.parent / "baselines" / "sim-trace" / "sim-ci.json")
    for metric in ("sustained_output_tps", "prefix_cache_share", "tpot_p99_ms"):
        made, _ = calibration.calibrate(runs, metric=metric, isl=prof.workload.isl, osl=prof.workload.osl,
                                        floor=prof.measurement.min_tolerance, starts=prof.measurement.max_starts)
        for lv in ("20", "40"):
            kept, again = committed.configs["rr24"][lv][metric], made.configs["rr24"][lv][metric]
            assert (kept.value, kept.tolerance, kept.runs) == (again.value, again.tolerance, 5), (metric, lv)


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:47.0000000,879,20
"""


def test_azures_llm_inference_layout_is_read_in_time_order_each_prompt_its_own(tmp_path):
    """Azure's public LLM inference traces (TIMESTAMP, ContextTokens, GeneratedTokens; this file is of our making):
    times from the first row, in order; no blocks, so nothing a prefix cache may serve."""
    f = tmp_path / "azure.csv"
    f.write_text(AZURE)
    trace = tr.load(f)
    assert [(r.at_s, r.isl, r.osl) for r in trace.requests] == [(0.0, 374, 44), (pytest.approx(0.31941), 879, 20),
                                                               (pytest.approx(4.314579), 396, 109)]
    assert trace.allowed == (0, 0, 0) and trace.describe().endswith("every prompt its own")


@pytest.mark.parametrize("text, said", [
    ("time,in,out\n1,2,3\n", ":1: a .csv trace starts with the header TIMESTAMP,ContextTokens,GeneratedTokens"),
    (AZURE + "yesterday,10,10\n", ":5: TIMESTAMP 'yesterday' is not a date and time"),
    (AZURE + "2023-11-16 18:16:00,-4,10\n", ":5: ContextTokens '-4' is not a whole number"),
    (AZURE + "2023-11-16 18:16:00,10\n", ":5: GeneratedTokens '' is not a whole number"),
])
def test_an_azure_row_that_is_not_a_request_is_refused_naming_the_line_and_column(tmp_path, text, said):
    f = tmp_path / "azure.csv"
    f.write_text(text)
    with pytest.raises(tr.TraceError, match=re.escape(f"{f}{said}")):
        tr.load(f)


def test_a_replay_sent_later_than_a_quarter_of_its_median_gap_is_disturbed_and_an_on_time_one_is_not():
    """Requests due 50 ms apart and sent 20 ms late have lost the trace's timing (bursts it spaced apart went out
    together): a disturbance named with the numbers; 2 ms late is on time."""
    from sglperf.measure.metrics import level_result
    from sglperf.measure.validity import MeasurementPolicy
    from sglperf.records import RequestRecord

    def level(late_s):
        recs = []
        for i in range(400):
            due = i * 0.05
            t = due + late_s
            recs.append(RequestRecord(i, t, t + 0.04, 32, 4, tuple(t + 0.01 * (k + 1) for k in range(4)),
                                      (1, 1, 1, 1), 32, 4, "length", due_time=due))
        return level_result(recs, concurrency=None, rate=20.0, isl=32, osl=4, policy=MeasurementPolicy())

    late = level(0.020)
    assert late.send_late_p50_ms == pytest.approx(20.0) and late.trace_gap_p50_ms == pytest.approx(50.0)
    assert any("the client sent the trace's requests late (p50 20.0 ms" in d and "limit 25% of it" in d
               for d in late.disturbances), late.disturbances
    assert not level(0.002).disturbances


def test_a_trace_whose_window_sent_fewer_than_the_mean_rate_is_not_called_saturated_when_all_were_served():
    """A trace's arrivals are its own: a window that falls in its quieter stretch sends 6 req/s of a 10 req/s mean.
    A server that served every one kept up; measured against the Poisson expectation (rate x window) it would read
    12.6 standard deviations short."""
    from sglperf.measure.workload_metrics import open_loop
    from sglperf.records import RequestRecord

    recs = [RequestRecord(i, i / 6, i / 6 + 0.05, 32, 32, (i / 6 + 0.01,), (32,), 32, 32, "length", due_time=i / 6)
            for i in range(601)]
    kept = open_loop(recs, 10.0, 0.0)
    assert kept["saturation"] is None and kept["achieved_rps"] == pytest.approx(6.0, abs=0.01)
    poisson = [RequestRecord(r.index, r.send_time, r.end_time, 32, 32, r.chunk_times, r.chunk_tokens, 32, 32,
                             "length") for r in recs]
    assert "the server saturated" in open_loop(poisson, 10.0, 0.0)["saturation"], "a Poisson loop's rule stays"
