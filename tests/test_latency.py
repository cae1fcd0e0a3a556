"""Latency ceilings: percentile intervals from order statistics, the ceiling verdict, what is judged past the KV
ceiling, the calibrated false-alarm rate, goodput, and the simulator's prefill-only slowdown."""

import dataclasses

import numpy as np
import pytest

from sglperf.judge import calibration
from sglperf.store.baselines import Entry
from sglperf.cli.bench import table
from sglperf.judge.latency import (
    MIN_FOR_MEAN, ceiling_outcome, check_ceiling, mean_interval, min_requests, percentile_interval,
)
from sglperf.measure.metrics import MeasurementPolicy, goodput, level_result
from sglperf.records import RequestRecord
from sglperf.sim.calibrate import engine_config
from sglperf.sim.engine import Engine
from sglperf.sim.presets import PRESETS


def entry(metric, value, tol=0.2):
    return Entry(metric=metric, value=value, tolerance=tol, taken_at="2026-11-30", source="runs a, b",
                 sglperf_version="0.1.0")


def rec(i, send, ttft, tpot, n=16):
    first = send + ttft
    times = tuple(first + k * tpot for k in range(n))
    return RequestRecord(i, send, times[-1], 32, n, times, (1,) * n, finish_reason="length")


def closed_loop(c, life, until, tokens, ttft):
    """c workers sending back-to-back requests of `life` seconds whose first token comes after `ttft`."""
    out, i = [], 0
    for _ in range(c):
        t = 0.0
        while t + life <= until:
            out.append(rec(i, t, ttft, (life - ttft) / (tokens - 1), tokens))
            i += 1
            t += life + 0.001
    return out


def test_a_p99_needs_368_values_before_its_interval_has_an_upper_end():
    assert min_requests(0.99) == 368 and min_requests(0.5) == 6
    x = np.arange(1, 301, dtype=float)
    est, lo, hi = percentile_interval(x, 0.99)
    assert hi is None and lo is not None and lo < est
    est, lo, hi = percentile_interval(np.arange(1, 1001, dtype=float), 0.99)
    assert lo < est < hi and hi <= 1000
    assert percentile_interval(np.arange(367.0), 0.99)[2] is None and percentile_interval(np.arange(368.0), 0.99)[2]


def test_the_percentile_interval_covers_the_true_p99_at_least_95_percent_of_the_time():
    rng = np.random.default_rng(3)
    true = float(np.exp(0.0 + 0.5 * 2.3263))  # lognormal(0, 0.5): its p99
    hits = 0
    for _ in range(2000):
        _, lo, hi = percentile_interval(rng.lognormal(0.0, 0.5, 800), 0.99)
        hits += lo <= true <= hi
    assert hits / 2000 >= 0.95


def test_the_ceiling_is_decided_by_the_interval():
    assert ceiling_outcome(80.0, 95.0, 100.0) == "pass"
    assert ceiling_outcome(101.0, 130.0, 100.0) == "regression"
    assert ceiling_outcome(90.0, 110.0, 100.0) == "inconclusive"
    assert ceiling_outcome(90.0, None, 100.0) == "inconclusive", "no upper end: never a pass"
    assert ceiling_outcome(120.0, None, 100.0) == "regression", "even the lower end is past it"


def test_a_slower_ttft_is_a_latency_regression_naming_it_and_a_queue_past_the_kv_ceiling_is_not():
    recs = closed_loop(8, 1.0, 60.0, tokens=16, ttft=0.3)
    r = level_result(recs, concurrency=8, rate=None, isl=32, osl=16, policy=MeasurementPolicy())
    v = check_ceiling(recs, r, entry("ttft_p50_ms", 200.0), where="sim-ci/a c8", baseline_source="b.json")
    assert v.outcome == "regression" and v.message.startswith("LATENCY REGRESSION: sim-ci/a c8: ttft_p50_ms 300.0")
    assert "ceiling 240.0 = baseline 200.0 x (1 + 20.0%)" in v.message
    past = check_ceiling(recs, r, entry("ttft_p50_ms", 200.0), where="x", baseline_source="b", past_kv_ceiling=True)
    assert past.outcome == "not judged" and "queue by design" in past.message
    tpot = check_ceiling(recs, r, entry("tpot_p50_ms", 200.0), where="x", baseline_source="b", past_kv_ceiling=True)
    assert tpot.outcome == "pass", tpot.message


def test_a_bimodal_ttft_hides_a_slower_prefill_from_its_median_but_not_from_its_mean():
    """The simulator at c8: a request arrives between runs of continuous decode steps (short wait) or during one
    (waits it out). A slower prefill lengthens every TTFT a little and moves requests into the long mode: the
    median stays in the short mode until that mode drops below half (its interval reaches into the other: at best
    inconclusive), while the mean moves with all of it."""
    rng = np.random.default_rng(5)

    def ttfts(short_share, short_ms, long_ms, n=300):
        return np.where(rng.random(n) < short_share, short_ms, long_ms) + rng.normal(0, 0.2, n)

    base, slow = ttfts(0.70, 10.0, 20.0), ttfts(0.55, 10.5, 21.0)
    for metric, value in (("ttft_p50_ms", float(np.median(base))), ("ttft_mean_ms", float(np.mean(base)))):
        recs = [rec(i, i * 1.0, t / 1e3, 0.008) for i, t in enumerate(slow)]
        r = level_result(recs, concurrency=8, rate=None, isl=32, osl=16, policy=MeasurementPolicy())
        v = check_ceiling(recs, r, entry(metric, value, tol=0.10), where="sim-ci/a c8", baseline_source="b.json")
        if metric == "ttft_p50_ms":
            assert v.outcome in ("pass", "inconclusive"), v.message  # +5%, its interval reaching the other mode
        else:
            assert v.outcome == "regression", v.message
            assert v.message.startswith("LATENCY REGRESSION: sim-ci/a c8: ttft_mean_ms ")


def test_a_mean_needs_30_requests_before_it_has_an_interval():
    assert mean_interval(np.arange(MIN_FOR_MEAN - 1.0))[1:] == (None, None)
    est, lo, hi = mean_interval(np.arange(float(MIN_FOR_MEAN)))
    assert lo < est < hi
    recs = closed_loop(2, 1.0, 10.0, tokens=16, ttft=0.1)
    r = level_result(recs, concurrency=2, rate=None, isl=32, osl=16, policy=MeasurementPolicy(min_window_lifetimes=1.0))
    v = check_ceiling(recs, r, entry("ttft_mean_ms", 200.0), where="x", baseline_source="b")
    assert v.outcome == "inconclusive" and "too few for an upper end of the mean interval (it needs 30)" in v.message


def test_the_mean_interval_covers_the_true_mean_of_a_skewed_latency_95_percent_of_the_time():
    rng = np.random.default_rng(9)
    true = float(np.exp(0.5 ** 2 / 2))  # lognormal(0, 0.5)
    hits = sum(lo <= true <= hi for _, lo, hi in (mean_interval(rng.lognormal(0.0, 0.5, 100)) for _ in range(2000)))
    assert hits / 2000 >= 0.93  # t over 100 skewed values: close to nominal


def test_too_few_requests_for_a_p99_is_inconclusive_and_says_how_many_it_needs():
    recs = closed_loop(4, 1.0, 30.0, tokens=16, ttft=0.1)
    r = level_result(recs, concurrency=4, rate=None, isl=32, osl=16, policy=MeasurementPolicy())
    v = check_ceiling(recs, r, entry("ttft_p99_ms", 200.0), where="x", baseline_source="b")
    assert v.outcome == "inconclusive" and "(it needs 368)" in v.message


@pytest.mark.parametrize("stat,n", [(0.99, 600), (0.5, 105), ("mean", 105)], ids=["p99", "p50", "mean"])
def test_calibrated_latency_ceilings_raise_at_most_one_percent_false_alarms(stat, n):
    """Four calibration runs of an unchanged system (the level's TTFT statistic varies run to run by `cv`; each
    level has `n` requests: 600 for a p99, sim-ci's 105 at c8 for the median and mean), then a fifth: how often its
    interval lands wholly above the calibrated ceiling, and how often a TTFT 50% slower is caught."""
    rng = np.random.default_rng(11)

    def value(x):
        return float(np.mean(x)) if stat == "mean" else float(np.percentile(x, stat * 100))

    def interval(x):
        return mean_interval(x) if stat == "mean" else percentile_interval(x, stat)

    name = "mean" if stat == "mean" else f"p{stat * 100:g}"
    for cv in (0.03, 0.10):
        alarms = caught = inconclusive = 0
        trials = 600
        for _ in range(trials):
            def run(scale=1.0):
                return rng.lognormal(np.log(100.0), 0.3, n) * rng.normal(1.0, cv) * scale
            mean, _, tol = calibration.calibrated_tolerance([value(run()) for _ in range(4)])
            ceiling = mean * (1 + tol)
            _, lo, hi = interval(run())
            outcome = ceiling_outcome(lo, hi, ceiling)
            alarms += outcome == "regression"
            inconclusive += outcome == "inconclusive"
            _, lo, hi = interval(run(1.5))
            caught += ceiling_outcome(lo, hi, ceiling) == "regression"
        print(f"{name} TTFT ({n} requests), run-to-run CV {cv:.0%}: false regressions {alarms / trials:.2%}, "
              f"inconclusive {inconclusive / trials:.1%}, a 50% slower TTFT caught {caught / trials:.1%}")
        assert alarms / trials <= 0.01


def test_goodput_counts_only_requests_that_met_the_slo():
    recs = [rec(0, 1.0, 0.1, 0.01), rec(1, 2.0, 0.5, 0.01), rec(2, 3.0, 0.1, 0.05), rec(3, 4.0, 0.1, 0.01)]
    rps, tps, share = goodput(recs, (0.0, 10.0), MeasurementPolicy(slo_ttft_ms=200, slo_tpot_ms=20))
    assert (rps, tps, share) == (pytest.approx(0.2), pytest.approx(3.2), 0.5)
    assert goodput(recs, (0.0, 10.0), MeasurementPolicy()) == (None, None, None), "no SLO, no goodput"


def test_bench_shows_goodput_when_an_slo_is_given():
    recs = closed_loop(4, 1.0, 30.0, tokens=16, ttft=0.1)
    with_slo = level_result(recs, concurrency=4, rate=None, isl=32, osl=16,
                            policy=MeasurementPolicy(slo_ttft_ms=500, slo_tpot_ms=100))
    assert with_slo.slo_met_share == 1.0 and with_slo.goodput_tps == pytest.approx(with_slo.sustained_output_tps,
                                                                                   rel=0.1)
    assert "goodput tok/s (met)" in table([with_slo]) and "(100%)" in table([with_slo])
    plain = level_result(recs, concurrency=4, rate=None, isl=32, osl=16, policy=MeasurementPolicy())
    assert "goodput" not in table([plain])


def test_the_simulators_prefill_slowdown_slows_prefill_only():
    def steps(f):
        eng = Engine(dataclasses.replace(engine_config(PRESETS["ci"], 8, 1), prefill_slowdown=f))
        eng.add_request("a", 32, 8)
        out = []
        while (s := eng.step()) is not None:
            out.append((s.kind, round(s.duration, 9)))
        return out
    base, slow = steps(0.0), steps(0.5)
    assert [k for k, _ in base] == [k for k, _ in slow]
    for (kind, a), (_, b) in zip(base, slow):
        assert b == pytest.approx(a * 1.5 if kind == "prefill" else a, rel=0.3 if kind == "prefill" else 1e-9)
    assert any(k == "prefill" for k, _ in base)


def test_a_latency_ceiling_failed_on_one_start_is_decided_by_the_majority_of_the_starts_allowed():
    from sglperf.judge.latency import over_starts
    assert over_starts(["pass"], 3) == "pass"
    assert over_starts(["regression"], 3) is None, "one start in another mode: measured again"
    assert over_starts(["regression", "pass"], 3) is None
    assert over_starts(["regression", "pass", "pass"], 3) == "pass"
    assert over_starts(["regression", "regression"], 3) == "regression", "a slower prefill slows every start"
    assert over_starts(["regression"], 1) == "regression", "no re-measure allowed: the start's verdict stands"
    assert over_starts(["regression", "pass"], 2) == "inconclusive"
    assert over_starts(["inconclusive", "regression", "inconclusive"], 3) == "regression"
    assert over_starts(["inconclusive", "pass", "inconclusive"], 3) == "pass"


def test_a_verdict_over_starts_names_every_starts_value_and_takes_the_decided_outcome():
    from sglperf.judge.latency import LatencyVerdict, verdict_over_starts
    bad = LatencyVerdict("regression", "server_ttft_mean_ms", 10.2, 9.3, 11.1, 7.8, 177,
                         "LATENCY REGRESSION: sim-ci/rr24-cds4 c16: server_ttft_mean_ms 10.2 ms")
    good = LatencyVerdict("pass", "server_ttft_mean_ms", 7.1, 6.9, 7.3, 7.8, 180, "sim-ci/rr24-cds4 c16: 7.1 ms")
    v = verdict_over_starts([bad, good, good], "pass")
    assert v.outcome == "pass" and not v.message.startswith("LATENCY")
    assert v.message.endswith("over 3 server starts: 10.2 (regression), 7.1 (pass), 7.1 (pass)")
    v = verdict_over_starts([bad, good], None)
    assert v.outcome == "inconclusive" and v.message.startswith("INCONCLUSIVE: sim-ci/rr24-cds4 c16:")
    assert verdict_over_starts([bad], "regression") is bad


def test_a_ceiling_failed_on_its_only_start_with_no_fresh_start_to_be_had_is_inconclusive_saying_why():
    from sglperf.judge.latency import LatencyVerdict, verdict_over_starts
    bad = LatencyVerdict("regression", "server_ttft_mean_ms", 8.65, 8.2, 9.1, 7.82, 180,
                         "LATENCY REGRESSION: sim-ci/rr24-cds4 c16: server_ttft_mean_ms 8.65 ms")
    v = verdict_over_starts([bad], None)
    assert v.outcome == "inconclusive" and v.message.startswith("INCONCLUSIVE: sim-ci/rr24-cds4 c16: server_ttft")
    assert "one server start only" in v.message and "no fresh start could be had" in v.message
    assert verdict_over_starts([bad], "regression") is bad, "a profile of one start: that start decides"
    unsure = LatencyVerdict("inconclusive", "server_ttft_mean_ms", 7.9, 7.5, 8.3, 7.82, 180, "INCONCLUSIVE: x")
    assert verdict_over_starts([unsure], None) is unsure
