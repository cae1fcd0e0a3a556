"""Verdicts decided by intervals: a floor passes when the whole 95% interval is above it, is a regression when the
whole interval is below it, and is INCONCLUSIVE in between; a precision miss is a warning, not an invalid level;
a degenerate spread is unknown, not zero; a level whose host was busy is INVALID naming the disturbance."""

import numpy as np
import pytest

from sglperf.record import baselines
from sglperf.environment.host import HostMonitor, disturbance, parse_psi_total
from sglperf.measure.metrics import MeasurementPolicy, batch_means, level_result
from sglperf.records import HostSample
from sglperf.judge.verdict import floor_outcome

from .test_metrics import closed_loop


def test_the_interval_decides_the_floor():
    assert floor_outcome(1000.0, 20.0, 950.0) == "pass"
    assert floor_outcome(900.0, 20.0, 950.0) == "regression"
    assert floor_outcome(940.0, 20.0, 950.0) == "inconclusive", "straddles: neither a pass nor a regression"
    assert floor_outcome(949.0, None, 950.0) == "regression", "a point metric (whole-run) compares as a point"


def test_identical_batches_give_an_unknown_interval_not_zero():
    times = np.arange(0.0, 10.0, 0.01)  # lockstep: the same tokens in every batch
    rate, half, k = batch_means(times, np.ones_like(times), (0.0, 10.0), 1.0, 5, 30)
    assert half is None and k == 10 and rate == pytest.approx(100.0)
    # seen on the H200 (llama.cpp, 64 slots at c64): identical batches up to float rounding gave "± 0.0" (2.7e-13)
    # (np.std of 14 equal rates is not exactly 0: the mean rounds)
    k, length = 14, 0.55
    mids = 0.1 + (np.arange(k) + 0.5) * length
    assert np.full(k, 2053.59 / length).std(ddof=1) > 0
    rate, half, n = batch_means(mids, np.full(k, 2053.59), (0.1, 0.1 + k * length), length, 5, 30)
    assert n == k and half is None, f"{half} is rounding, not precision"


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
    assert reasons == ["disturbed: the hypervisor stole 0.3 cores of 2 during the window (limit 0.2)"]


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


def test_simulated_false_alarms_and_power_of_the_interval_floor():
    """An unchanged system against a baseline calibrated from 4 runs: the interval rule raises a false regression
    in at most 1% of levels; the power to see a 5% drop is printed (it exists only where the tolerance is below
    5%, i.e. where run-to-run noise is small)."""
    rng = np.random.default_rng(7)
    trials = 4000
    for run_cv, level_ci in ((0.005, 0.01), (0.01, 0.01), (0.03, 0.02)):
        alarms = inconclusive = caught = 0
        for _ in range(trials):
            runs = rng.normal(1000, 1000 * run_cv, 4)
            mean, _, tol = baselines.calibrated_tolerance(list(runs))
            floor = mean * (1 - tol)
            same = rng.normal(1000, 1000 * run_cv)
            half = same * level_ci
            outcome = floor_outcome(same, half, floor)
            alarms += outcome == "regression"
            inconclusive += outcome == "inconclusive"
            dropped = rng.normal(950, 950 * run_cv)
            caught += floor_outcome(dropped, dropped * level_ci, floor) == "regression"
        print(f"run-to-run CV {run_cv:.1%}, level CI ±{level_ci:.0%}: false regressions {alarms / trials:.2%}, "
              f"inconclusive {inconclusive / trials:.2%}, a 5% drop caught {caught / trials:.1%}")
        assert alarms / trials <= 0.01
