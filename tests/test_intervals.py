"""Verdicts decided by intervals: a floor passes when the whole 95% interval is above it, is a regression when the
whole interval is below it, and is INCONCLUSIVE in between; a precision miss is a warning, not an invalid level;
a degenerate spread is unknown, not zero; a level whose host was busy is INVALID naming the disturbance."""

import math
from pathlib import Path

import numpy as np
import pytest

from sglperf.judge import calibration
from sglperf.judge.noise import of as noise_of
from sglperf.store.rundoc import load_run
from sglperf.environment.host import HostMonitor, disturbance, parse_psi_total
from sglperf.measure import intervals
from sglperf.measure.intervals import aligned_batches, phased_spread, sustained_interval
from sglperf.measure.metrics import MeasurementPolicy, level_result
from sglperf.records import HostSample
from sglperf.judge.starts import another_start, judged_start
from sglperf.judge.floor import check_floor, combined, floor_outcome, outlier_start
from sglperf.store.baselines import Entry

from . import rundocs
from .rundocs import result
from .streams import KINDS, coverage
from .test_metrics import closed_loop


def test_the_interval_decides_the_floor():
    assert floor_outcome(1000.0, 20.0, 950.0) == "pass"
    assert floor_outcome(900.0, 20.0, 950.0) == "regression"
    assert floor_outcome(940.0, 20.0, 950.0) == "inconclusive", "straddles: neither a pass nor a regression"
    assert floor_outcome(949.0, None, 950.0) == "regression", "a point metric (whole-run) compares as a point"


def test_a_deterministic_stream_gets_its_counting_resolution_not_zero_and_not_unknown():
    """Lockstep cohorts deliver the same tokens in every batch: batch means alone gave "±0" (then "unknown", which
    made a two-thirds drop on the H200 INVALID). The window's count is known to one cohort at each edge, so that is
    the interval: small, nonzero, and an honest bound."""
    steps = np.arange(0.0, 10.0, 0.05)  # a decode step every 50 ms, 16 tokens each: 320 tok/s
    iv = sustained_interval(steps, np.full(steps.size, 16.0), (0.0, 10.0))
    assert iv.rate == pytest.approx(320.0) and iv.half is not None and iv.half > 0
    assert iv.resolution == pytest.approx(16.0 / 10.0 * 2, rel=0.5), "about one step's cohort per window edge"
    assert iv.half / iv.rate < 0.02
    # seen on the H200 (llama.cpp, 64 slots at c64): identical batches up to float rounding
    k, length = 14, 0.55
    mids = 0.1 + (np.arange(k) + 0.5) * length
    iv = sustained_interval(mids, np.full(k, 2053.59), (0.1, 0.1 + k * length))
    assert iv.half is not None and iv.half > 0


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_interval_covers_the_true_rate_at_nominal_95_percent_on_every_kind_of_stream(kind):
    """Seeded: independent, autocorrelated (AR(1), one lifetime), lockstep and deterministic streams, windows of
    10-40 lifetimes; at least 93% of intervals hold the true rate (benchmarks/interval_coverage.py prints the table,
    with the estimator before for comparison)."""
    def estimate(times, tokens, window):
        iv = sustained_interval(times, tokens, window, lifetime=1.0)  # the streams' lifetime
        return iv.rate, iv.half

    covered, width = coverage(estimate, kind, trials=2000, seed=11 + list(KINDS).index(kind))
    assert covered >= 0.93, f"{kind}: {covered:.1%} covered (mean half-width {width:.2%})"


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_short_window_cuts_each_whole_lifetime_into_phases_and_covers_no_worse_than_ten_equal_batches(
        kind, monkeypatch):
    """Windows of 3-5 lifetimes, where a level first may stop: 10 equal batches each cut a closed loop's cycle
    somewhere, and their spread was the cut's (sim-seed read +/-5-11% there, then +/-2% once whole lifetimes took
    over at 5). Phased batches remove each third of a lifetime's own mean: lockstep and deterministic streams' intervals
    are at most two thirds of the equal batches', and every kind is covered at 93% or no less often than before
    (autocorrelated streams are undercovered by both at this length: docs/measurement.md)."""
    def estimate(times, tokens, window):
        iv = sustained_interval(times, tokens, window, lifetime=1.0)
        return iv.rate, iv.half

    seed = 11 + list(KINDS).index(kind)
    phased = coverage(estimate, kind, trials=2000, seed=seed, lengths=(3.0, 5.0))
    monkeypatch.setattr(intervals, "MIN_PHASED", intervals.MIN_ALIGNED)
    equal = coverage(estimate, kind, trials=2000, seed=seed, lengths=(3.0, 5.0))
    assert phased[0] >= min(0.93, equal[0] - 0.01), f"{kind}: {phased[0]:.1%} against equal batches' {equal[0]:.1%}"
    if kind in ("lockstep", "deterministic"):
        assert phased[1] <= 2 / 3 * equal[1], f"{kind}: ±{phased[1]:.2%} against ±{equal[1]:.2%}"


def test_phased_batches_remove_each_parts_mean_over_the_lifetimes():
    """A cycle that repeats exactly leaves no spread; what moves a whole lifetime stays."""
    cycle = np.array([10.0, 40.0, 100.0])
    deviations, df = phased_spread(np.tile(cycle, 4), 4)
    assert df == 9 and np.allclose(deviations, 0.0)
    shifted = np.tile(cycle, 4) + np.repeat([0.0, 0.0, 0.0, 6.0], 3)
    deviations, _ = phased_spread(shifted, 4)
    assert np.allclose(deviations.reshape(4, 3)[:, 0], [-1.5, -1.5, -1.5, 4.5])


def test_a_growing_window_keeps_at_least_seven_whole_lifetime_batches():
    """A level that runs on must not read less precise for it: past 7 lifetimes the window is cut into 7-14 batches
    of whole lifetimes, never the 5 batches of 2 that a window just past 10 lifetimes got until 2026-12-03."""
    for tenths in range(70, 400):
        k, (s, e) = aligned_batches((0.0, tenths / 10), 10, 1.0)
        assert 7 <= k <= 14, (tenths / 10, k)
        per = (e - s) / k
        assert abs(per - round(per)) < 1e-9 and e <= tenths / 10 + 1e-9, "whole lifetimes, inside the window"
    assert aligned_batches((0.0, 10.1), 10, 1.0)[0] == 10


def test_a_precision_miss_is_a_warning_and_the_level_stays_valid():
    res = level_result(closed_loop(4, 1.0, 40.0, tokens=10), concurrency=4, rate=None, isl=100, osl=10,
                       policy=MeasurementPolicy(ci_target=0.00001))
    assert res.valid, res.invalid_reasons
    assert any("wider than the target" in w for w in res.warnings)


def host(t, busy, client=0.0, server=0.0, steal=0.0):
    return HostSample(t, busy, client, server, steal, 1.0)


def test_other_processes_taking_the_cpu_make_the_level_invalid_in_words():
    quiet = [host(0, 0.0), host(10, 15.0, client=6.0, server=8.0)]  # 0.1 core of others
    numbers, reasons = disturbance(quiet, (0, 10), cores=2)
    assert reasons == [] and numbers["other_cores"] == pytest.approx(0.1)
    hog = [host(0, 0.0), host(10, 20.0, client=3.0, server=4.0, steal=0.0)]  # 1.3 cores of others
    numbers, reasons = disturbance(hog, (0, 10), cores=2)
    assert reasons == ["disturbed: other processes used 1.3 cores of 2 during the window (the client and the "
                       "server's processes excluded; limit 0.5)"]
    _, reasons = disturbance([host(0, 0.0), host(10, 5.0, client=4.0, steal=3.0)], (0, 10), cores=2)
    assert reasons == ["disturbed: the hypervisor stole 0.30 cores of the 0.80 this host's work wanted during the "
                       "window (37%; limit 0.10: the server's step loop waits for the CPU it is denied)"]


def test_steal_is_judged_against_the_work_that_wanted_the_cpu_not_the_cores():
    """The lent H200 (16 cores): 1.07 cores stolen of the 3.4 the run wanted cost p32 c64 26%, under the old limit
    of 10% of the cores (1.6); the healthy starts read at most 0.03 of ~2.8."""
    def level(server, steal):
        return [host(0, 0.0), host(10, 10 * (server + 0.1), client=1.0, server=10 * server, steal=10 * steal)]
    _, reasons = disturbance(level(2.2, 1.07), (0, 10), cores=16)
    assert len(reasons) == 1 and "stole 1.07 cores of the 3.37" in reasons[0]
    assert disturbance(level(2.7, 0.03), (0, 10), cores=16)[1] == []


def test_a_profiles_steal_share_names_steal_the_default_limit_lets_pass():
    """The fresh H200 host of 2026-12-04: 0.12 cores stolen of the 2.5 p16 c64 wanted (4.8%) read it 6% low, under
    the default 5% limit; gpu1-llamacpp's 2% names it. A level of little work is judged as if it wanted 2 cores."""
    from sglperf.environment.host import steal_limit

    def level(server, steal):
        return [host(0, 0.0), host(10, 10 * (server + 0.1), client=1.0, server=10 * server, steal=10 * steal)]
    assert disturbance(level(2.3, 0.12), (0, 10), cores=16)[1] == []
    _, reasons = disturbance(level(2.3, 0.12), (0, 10), cores=16, max_steal_share=0.02)
    assert len(reasons) == 1 and "stole 0.12 cores of the 2.52" in reasons[0] and "limit 0.05" in reasons[0]
    assert steal_limit(0.5, 0.02) == pytest.approx(0.04) and steal_limit(0.5) == pytest.approx(0.1)


def test_memory_pressure_makes_the_level_invalid_in_words():
    def mem(t, stall=None, swap=None):
        return HostSample(t, 0.0, 0.0, 0.0, 0.0, 1.0, mem_stall_s=stall, mem_available_mb=512.0 - t,
                          swap_in_mb=swap)

    numbers, reasons = disturbance([mem(0, stall=100.0), mem(10, stall=100.5)], (0, 10), cores=2)
    assert reasons == [] and numbers["mem_stall_share"] == pytest.approx(0.05)
    assert numbers["mem_available_mb_min"] == 502.0
    _, reasons = disturbance([mem(0, stall=100.0), mem(10, stall=102.3)], (0, 10), cores=2)
    assert reasons == ["disturbed: tasks waited for memory 23% of the window (/proc/pressure/memory; limit 10%)"]
    # a kernel without pressure information: sustained swap-ins say it instead
    _, reasons = disturbance([mem(0, swap=0.0), mem(10, swap=400.0)], (0, 10), cores=2)
    assert reasons == ["disturbed: the host swapped in 40 MB/s during the window (limit 10 MB/s)"]


def test_the_kernels_pressure_file_is_read_as_seconds_stalled():
    text = ("some avg10=5.98 avg60=5.63 avg300=2.01 total=576582294\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")  # this machine's /proc/pressure/cpu
    assert parse_psi_total(text) == pytest.approx(576.582294)
    assert parse_psi_total("") is None
    sample = HostMonitor(lambda: 1.0).sample()  # the real host: every field read, none invented
    assert sample.mem_available_mb and sample.mem_available_mb > 0


def _judge(entry, runs, max_starts: int, used: list | None = None) -> str:
    """A floor verdict as the suite reaches it (judge/starts.another_start): the first start, then more while the
    floor is undecided, failed, or passed below the floor for all the starts allowed."""
    starts = [runs()]
    while True:
        v = check_floor(starts, entry, where="x", baseline_source="b", log_path=None)
        if not another_start(v, len(starts), entry, max_starts):
            if used is not None:
                used.append(len(starts))
            if v.outcome == "inconclusive":
                v = check_floor(starts, entry, where="x", baseline_source="b", log_path=None, last=True)
            return v.outcome
        starts.append(runs())


@pytest.mark.parametrize("between, level_ci", [(0.005, 0.01), (0.01, 0.01), (0.03, 0.02)])
def test_simulated_false_alarms_and_power_of_the_floor(between, level_ci):
    """Seeded: a profile of 6 levels calibrated from 5 runs each (their variances pooled), then an unchanged system
    and one 5% slower, each run as the suite runs it (one start; more, up to three as sim-ci and gpu1-llamacpp allow,
    while undecided; several starts are judged by their mean, whose interval widens to their spread where they
    disagree beyond the baseline's noise). False regressions stay at or below 1% of levels; where the between-start
    noise is small next to 5% (CV 0.5-1%, as the simulator and a quiet CPU engine), a 5% drop is caught in at least
    90% of levels at the same level length. The GPU-like row (CV 3%) prints its power: its detectable drop is the
    calibration's, docs/measurement.md."""
    rng = np.random.default_rng(7)
    trials, alarms, caught, caught10, undecided, used = 2000, 0, 0, 0, 0, []
    for _ in range(trials):
        mu = rng.uniform(500, 3000, 6)

        def run(m, drop=0.0):
            value = m * (1 - drop) * (1 + rng.normal(0, between)) * (1 + rng.normal(0, level_ci / 1.96))
            return rundocs.result(8, value=value, ci=value * level_ci)

        docs = [rundocs.run_doc(f"r{i}", {8 * (j + 1): run(m) for j, m in enumerate(mu)}) for i in range(5)]
        bf, _ = calibration.calibrate(docs, isl=32, osl=32)
        j = int(rng.integers(6))
        entry = bf.entries("rr24-cds4", 8 * (j + 1))["sustained_output_tps"]
        same = _judge(entry, lambda: run(mu[j]), max_starts=3, used=used)
        alarms += same == "regression"
        undecided += same == "inconclusive"
        caught += _judge(entry, lambda: run(mu[j], drop=0.05), max_starts=3) == "regression"
        caught10 += _judge(entry, lambda: run(mu[j], drop=0.10), max_starts=3) == "regression"
    print(f"between-start CV {between:.1%}, level CI ±{level_ci:.0%}: false regressions {alarms / trials:.2%}, "
          f"undecided after three starts {undecided / trials:.2%}, a 5% drop caught {caught / trials:.1%}, a 10% "
          f"drop {caught10 / trials:.1%}; starts per healthy level {np.mean(used):.2f}")
    assert alarms / trials <= 0.01
    if between <= 0.01:
        assert caught / trials >= 0.90


def test_the_h200_run_whose_cpu_the_hypervisor_took_names_it_at_the_levels_it_slowed():
    """A lent H200 start of 2026-12-01 (tests/data/gpu): p32 c64 read 1,720 tok/s against ~2,410 on other starts,
    with 1.07 cores stolen; the levels it slowed less read 5-11% below the other starts. Its recorded per-level CPU
    numbers, put
    back through the rule, name the slowed levels and leave the healthy ones alone."""
    run = load_run(Path(__file__).parent / "data" / "gpu" / "h200-gpu1-llamacpp-steal-run.json")
    named = {}
    for cfg, doc in run.configs.items():
        for lv, level in doc.levels.items():
            h = level.host
            busy = h["server_cores"] + h["client_cores"] + h["other_cores"]
            samples = [host(0, 0.0), host(10, 10 * busy, client=10 * h["client_cores"], server=10 * h["server_cores"],
                                          steal=10 * h["steal_cores"])]
            named[f"{cfg} c{lv}"] = bool(disturbance(samples, (0, 10), cores=h["cores"])[1])
    assert named == {"p16 c8": False, "p16 c64": False, "p16 c128": True, "p32 c8": True, "p32 c64": True,
                     "p32 c128": True}, "stolen: 0.05, 0.11, 0.31, 0.15, 1.07, 0.21 cores"


def test_two_starts_that_disagree_are_no_precise_mean():
    """The H200, 2026-12-01: p16 c8 read 696.9 ± 17.1 on one start and 1,004.6 ± 25.2 on the next, against a
    baseline whose run-to-run CV is 3% (between starts 0%, 11 df). Their mean is 850.8; the starts' own intervals
    alone said ± 15.2, their spread says ± 97. Starts that agree within the baseline's noise keep the narrow one."""
    entry = Entry(metric="sustained_output_tps", value=997.0, tolerance=0.03, noise_cv=0.0298, runs=6, noise_df=10.9,
                  within_cv=0.0406, taken_at="2026-12-01", source="s", sglperf_version="0")
    apart = [result(value=696.9, ci=17.1), result(value=1004.6, ci=25.2)]
    mean, half = combined(apart, "sustained_output_tps", noise_of(entry))
    assert mean == pytest.approx(850.75) and 90 < half < 105
    v = check_floor(apart, entry, where="p16 c8", baseline_source="b", log_path=None)
    assert v.outcome == "regression" and "this run's starts ±25.6% (SD)" in v.message
    close = [result(value=1001.0, ci=17.0), result(value=1004.0, ci=17.0)]
    assert combined(close, "sustained_output_tps", noise_of(entry))[1] == pytest.approx(math.sqrt(2 * 17.0 ** 2) / 2)


def test_one_start_in_another_mode_is_set_aside_by_name_and_a_slow_server_is_not():
    """The H200, 2026-12-01, host 5: llama.cpp ran one start of a healthy p32 c8 at 748.9 tok/s (7 ms a step, then
    13 ms for the rest of the level), the restarts at 1,017.4 and 996.5. The mean of the three was undecided and
    the run red. The start apart from two that agree is set aside, named; three slow starts are a regression."""
    entry = Entry(metric="sustained_output_tps", value=996.5, tolerance=0.03, noise_cv=0.0264, runs=6, noise_df=11,
                  within_cv=0.02, taken_at="2026-12-01", source="s", sglperf_version="0")
    starts = [result(value=748.9, ci=91.2), result(value=1017.4, ci=20.0), result(value=996.5, ci=18.0)]
    v = check_floor(starts, entry, where="p32 c8", baseline_source="b", log_path=None)
    assert v.outcome == "pass" and v.set_aside == (0,)
    assert "start 1 (748.9) set aside: -25.6% from the other starts' 1,007.0" in v.message
    assert judged_start(starts, noise_of(entry)).sustained_output_tps == pytest.approx((1017.4 + 996.5) / 2, rel=1e-3)
    slow = [result(value=748.9, ci=91.2), result(value=790.0, ci=20.0), result(value=771.0, ci=18.0)]
    v = check_floor(slow, entry, where="p32 c8", baseline_source="b", log_path=None)
    assert v.outcome == "regression" and v.set_aside == ()
    two = starts[:2]  # two starts cannot say which one is apart
    assert outlier_start(two, "sustained_output_tps", noise_of(entry)) == (None, "")
    same = [result(value=470.0, ci=0.0)] * 3  # a pinned simulator reads the same on every start: none is apart
    assert outlier_start(same, "sustained_output_tps", noise_of(entry)) == (None, "")
    v = check_floor(same, entry, where="p32 c8", baseline_source="b", log_path=None)
    assert v.outcome == "regression" and "-52.8% vs baseline" in v.message


def test_a_pass_near_the_floor_is_measured_again_and_a_regression_is_confirmed_over_every_start_allowed():
    """A start that clears the floor for one start but not the floor for the profile's three is not yet a pass; a
    level well above it passes at once; a regression stands at the last start allowed."""
    entry = Entry(metric="sustained_output_tps", value=2446.0, tolerance=0.079, noise_cv=0.0325, runs=12,
                  noise_df=15, within_cv=0.0149, taken_at="2026-12-01", source="s", sglperf_version="0")
    near = [result(value=2446.0 * 0.95, ci=2446.0 * 0.01)]
    v = check_floor(near, entry, where="p32 c64", baseline_source="b", log_path=None)
    assert v.outcome == "pass" and another_start(v, 1, entry, max_starts=3)
    assert not another_start(v, 1, entry, max_starts=1)
    high = [result(value=2446.0 * 1.01, ci=2446.0 * 0.01)]
    assert not another_start(check_floor(high, entry, where="x", baseline_source="b", log_path=None), 1, entry, 3)
    low = [result(value=2446.0 * 0.8, ci=20.0)] * 2
    v = check_floor(low, entry, where="x", baseline_source="b", log_path=None)
    assert v.outcome == "regression" and another_start(v, 2, entry, 3) and not another_start(v, 3, entry, 3)
