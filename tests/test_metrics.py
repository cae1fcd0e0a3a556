"""Metric maths on synthetic records whose answers are known by construction."""

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from sglperf.measure.intervals import sustained_interval
from sglperf.measure.metrics import (ArrivalLog, LevelEnd, LevelSamples, MeasurementPolicy, first_generation,
                                    level_result, peak_bucket, regime_shift, steady_state_window, summarize,
                                    time_average_inflight, token_arrivals)
from sglperf.records import ERROR_KINDS, RequestRecord, ServerSample


def req(i, send, end, tokens=10, *, first=None, error=None, cancelled=False, prompt=100):
    """A request streaming `tokens` tokens evenly from `first` (default: send + 10% of its life) to `end`."""
    first = send + 0.1 * (end - send) if first is None else first
    times = tuple(np.linspace(first, end, tokens)) if tokens else ()
    return RequestRecord(i, send, end, prompt, tokens, times, (1,) * tokens, prompt, tokens,
                         None if error else "length", error, None, 200, cancelled)


def closed_loop(c, life, until, tokens=10, gap=0.001):
    """c workers, each sending back-to-back requests of `life` seconds until `until`."""
    out, i = [], 0
    for w in range(c):
        t = 0.0
        while t + life <= until:
            out.append(req(i, t, t + life, tokens))
            i += 1
            t += life + gap
    return out


def test_a_checks_arrival_log_holds_the_same_chunks_as_reading_every_record_again():
    recs = closed_loop(4, 1.0, 30.0)
    recs[7] = req(7, recs[7].send_time, recs[7].end_time, error="abort")  # a failed request's chunks do not count
    log, finished = ArrivalLog(), 0
    for finished in (0, 10, 10, 40, len(recs) - 4):
        in_flight = [dataclasses.replace(r, cancelled=True) for r in recs[finished:finished + 4]]
        snap = recs[:finished] + in_flight
        got, want = log.arrivals(snap, finished), token_arrivals(snap)
        assert sorted(zip(*got)) == sorted(zip(*want)) and got[0].size == sum(r.output_tokens for r in snap
                                                                              if r.error is None)


def test_window_starts_after_one_generation_and_ignores_hand_over_gaps():
    recs = closed_loop(4, 1.0, 20.0)
    w = steady_state_window(recs, 4, 0.9, 0.05, not_before=1.0, now=20.0)
    assert w[0] == pytest.approx(1.0)
    assert w[1] == pytest.approx(max(r.end_time for r in recs), abs=0.05)


def test_window_is_the_longest_span_at_the_target():
    recs = closed_loop(4, 1.0, 10.0)
    # two workers pause from t=10 to t=13, then all four run again until t=30: the second span is longer
    recs += [req(1000 + k, 13.0 + j, 14.0 + j) for k in range(2) for j in range(17)]
    recs += [req(2000 + k, 10.0 + j, 11.0 + j) for k in range(2) for j in range(20)]
    w = steady_state_window(recs, 4, 0.9, 0.05, not_before=1.0, now=30.0)
    assert w == (pytest.approx(13.0), pytest.approx(30.0))


def test_a_dip_longer_than_the_gap_tolerance_breaks_the_span():
    recs = [req(0, 0, 5), req(1, 5.2, 10)]
    assert steady_state_window(recs, 1, 0.9, 0.05, 0, 10) == (0, 5)
    assert steady_state_window(recs, 1, 0.9, 0.5, 0, 10) == (0, 10)


def test_sustained_rate_counts_tokens_arriving_inside_the_window():
    times = np.array([0.5, 1.5, 2.5, 3.5, 4.5, 9.5])
    tokens = np.array([2, 2, 2, 2, 2, 100])
    assert sustained_interval(times, tokens, (1.0, 5.0)).rate == pytest.approx(8 / 4.0)


def test_the_interval_is_t_times_the_batches_standard_error_inflated_for_their_correlation_and_the_resolution():
    # 10 batches of 1 s, each 100 tokens in 100 arrivals, rates alternating 90 and 110 tokens/s
    times, tokens = [], []
    for b in range(10):
        times += list(b + (np.arange(100) + 0.5) / 100)
        tokens += [0.9 if b % 2 else 1.1] * 100
    iv = sustained_interval(np.array(times), np.array(tokens), (0.0, 10.0))
    assert iv.batches == 10 and iv.rate == pytest.approx(100.0)
    spread = stats.t.ppf(0.975, 9) * np.std([110, 90] * 5, ddof=1) / math.sqrt(10)
    assert iv.ar1 == 0.0, "alternating batches are negatively correlated: no inflation"
    assert iv.half == pytest.approx(math.hypot(spread, iv.resolution)) and 0 < iv.resolution < spread / 5


def test_correlated_batches_widen_the_interval():
    times = np.arange(0.0, 10.0, 0.01)
    slow_wave = 1 + 0.1 * np.sin(2 * math.pi * times / 10.0)  # one slow swing over the window: lag-1 near 0.8
    iv = sustained_interval(times, slow_wave, (0.0, 10.0))
    plain = stats.t.ppf(0.975, 9) * sustained_interval_rates_sd(times, slow_wave) / math.sqrt(10)
    assert iv.ar1 > 0.5 and iv.half > 2 * plain


def sustained_interval_rates_sd(times, tokens):
    from sglperf.measure.intervals import batch_rates

    return batch_rates(times, tokens, (0.0, 10.0), 10).std(ddof=1)


def test_a_window_without_tokens_gives_no_interval():
    assert sustained_interval(np.array([5.5]), np.array([1.0]), (0.0, 3.0)).half is None


def test_peak_is_the_best_one_second_bucket():
    times = np.array([0.1, 0.2, 3.1, 3.2, 3.9, 5.0])
    tokens = np.array([5, 1, 4, 4, 4, 1], float)
    assert peak_bucket(times, tokens, 0.0) == 12


def test_percentiles_are_numpy_linear():
    s = summarize([1, 2, 3, 4, 100])
    assert (s.mean, s.median, s.p90, s.p99) == (22, 3, pytest.approx(61.6), pytest.approx(96.16))


def test_achieved_concurrency_is_the_time_average_in_flight():
    recs = [req(0, 0, 10), req(1, 0, 10), req(2, 0, 5), req(3, 0, 5)]
    assert time_average_inflight(recs, (0, 10), 10) == pytest.approx(3.0)


def test_level_result_on_a_steady_closed_loop():
    recs = closed_loop(4, 1.0, 40.0, tokens=10)
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05))
    assert res.valid, res.invalid_reasons
    # 4 streams, 10 tokens per ~1.001 s each; tokens sit in the last 90% of each request
    assert res.sustained_output_tps == pytest.approx(40 / 1.001, rel=0.02)
    assert res.achieved_concurrency == pytest.approx(4, rel=0.01)
    assert res.completed == len(recs) and res.errors == {}
    assert res.ttft_ms.median == pytest.approx(100.0)
    assert res.e2e_ms.median == pytest.approx(1000.0)
    assert res.tpot_ms.median == pytest.approx(900 / 9)
    assert res.whole_run_output_tps == pytest.approx(len(recs) * 10 / (max(r.end_time for r in recs)))


@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_every_error_kind_fails_the_level_and_is_never_counted(kind):
    recs = closed_loop(4, 1.0, 40.0)
    bad = recs[50]
    recs[50] = RequestRecord(bad.index, bad.send_time, bad.end_time, 100, 10, bad.chunk_times, bad.chunk_tokens,
                             error=kind, error_detail="synthetic")
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05))
    assert not res.valid
    assert res.errors == {kind: 1}
    assert any(kind in r for r in res.invalid_reasons)
    assert res.completed == len(recs) - 1


def test_cancelled_requests_are_neither_errors_nor_completions():
    recs = closed_loop(4, 1.0, 40.0)
    last = recs[-1]
    recs[-1] = RequestRecord(last.index, last.send_time, last.end_time, 100, 10, cancelled=True)
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05))
    assert res.errors == {} and res.cancelled == 1 and res.completed == len(recs) - 1


def test_window_cap_keeps_the_drain_out_of_the_window():
    recs = closed_loop(4, 1.0, 40.0)
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       end=LevelEnd(window_cap=20.0))
    assert res.window_end == pytest.approx(20.0)


def test_invalid_when_the_window_is_shorter_than_two_lifetimes():
    recs = closed_loop(4, 1.0, 2.5)  # warm-up ends at 1 s: a 1.5-s window of 1-s requests
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy())
    assert not res.valid and any("shorter than 2 service lifetimes" in r for r in res.invalid_reasons)


def queued_closed_loop(clients, slots, service, until, tokens=10, prefill=0.1):
    """`clients` workers on a server that runs `slots` requests at once, each for `service` seconds (`prefill` of
    it before the first token): the others wait for a slot, in lockstep cohorts."""
    out, free, i = [], [0.0] * slots, 0
    sends = [0.0] * clients
    while True:
        w = min(range(clients), key=lambda c: sends[c])
        slot = min(range(slots), key=lambda k: free[k])
        start = max(sends[w], free[slot])
        if start + service > until:
            return out
        out.append(req(i, sends[w], start + service, tokens, first=start + prefill))
        free[slot] = start + service
        sends[w] = start + service + 0.001
        i += 1


def test_a_queued_level_counts_its_window_in_service_lifetimes_not_in_the_wait_for_a_slot():
    # 32 clients, 16 slots, 1-s service: every request waits ~1 s for a slot, so it lives 2 s end to end, but the
    # running batch turns over every second
    recs = queued_closed_loop(32, 16, 1.0, 4.0)
    res = level_result(recs, concurrency=32, rate=None, isl=100, osl=10, policy=MeasurementPolicy())
    assert res.e2e_ms.median == pytest.approx(2000.0, rel=0.01)
    assert res.lifetime_s == pytest.approx(1.0, rel=0.01)
    # the warm-up is one generation of running requests (16 completions at 1 s), not of clients (32, at 2 s)
    assert res.window_start == pytest.approx(1.0, abs=0.01)
    # a 3-s window: 1.5 end-to-end lifetimes (too short, counted so), 3 service lifetimes
    assert res.valid, res.invalid_reasons


@pytest.mark.parametrize("clients", [20, 24, 33, 40])
def test_a_queued_level_s_warm_up_is_the_running_batch_counted_not_estimated(clients):
    """16 slots: Little's law (clients x service / end-to-end) read 16.5-20 running requests here (sim-seed's c2048
    on 1,024 slots: 1,047), and the warm-up waited for a completion of the second generation, a lifetime lost.
    The 16 requests with a first token before the first one finished are the batch: the window opens at 1 s."""
    recs = queued_closed_loop(clients, 16, 1.0, 8.0)
    res = level_result(recs, concurrency=clients, rate=None, isl=100, osl=10, policy=MeasurementPolicy())
    assert first_generation(recs) == 16
    assert res.window_start == pytest.approx(1.0, abs=0.01)
    assert res.sustained_output_tps == pytest.approx(160.0, rel=0.01)


def test_an_unqueued_level_s_service_lifetime_is_its_lifetime():
    recs = closed_loop(4, 1.0, 40.0)  # the first token at 10% of a request's life: its prefill
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy())
    assert res.lifetime_s == pytest.approx(1.0, rel=0.001)


def test_client_bound_levels_are_invalid():
    from sglperf.records import ClientSample

    recs = closed_loop(4, 1.0, 40.0)
    samples = [ClientSample(t, cpu_s=0.95 * t, loop_lag_s=0.2) for t in np.arange(0, 40, 0.05)]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(client=samples))
    assert not res.valid
    assert any("client CPU" in r for r in res.invalid_reasons)
    assert any("held back 28.6% of the offered load" in d for d in res.disturbances)  # 2 x 0.2 s per 1-s cycle


def ticker(until, lag, tail=(), cpu=0.3):
    """The client monitor's 50 ms samples: every tick `lag` seconds late, the ticks at `tail`'s times later."""
    from sglperf.records import ClientSample

    return [ClientSample(t, cpu_s=cpu * t, loop_lag_s=0.055 if any(abs(t - x) < 0.01 for x in tail) else lag)
            for t in np.arange(0, until, 0.05)]


def test_a_lag_tail_of_a_few_ticks_holds_back_no_load_and_is_valid():
    # CI of 2026-12-03, SGLang on a 2-core host: p99 55 ms on ~0.6-s requests, sends otherwise on time
    recs = closed_loop(2, 0.6, 30.0)
    tail = np.arange(1.0, 30.0, 3.0)  # 10 of 600 ticks late by 55 ms: the p99
    res = level_result(recs, concurrency=2, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(client=ticker(30.0, 0.001, tail)))
    assert res.client_lag_p99_ms > 50
    assert res.client_late_share < 0.01
    assert res.valid, res.invalid_reasons
    assert not res.disturbances


def test_a_steadily_late_loop_that_withholds_load_is_a_disturbance_though_its_p99_is_short():
    recs = closed_loop(4, 1.0, 40.0)
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(client=ticker(40.0, 0.015)))  # 15 ms at every tick, 2 x 15 ms a cycle
    assert res.client_lag_p99_ms < 50
    assert res.client_late_share == pytest.approx(0.03 / 1.03, rel=0.05)
    # it can only have lowered throughput: a floor it passes is passed, one it fails is INVALID naming it
    assert any("the client's event loop held back 2.9% of the offered load" in d for d in res.disturbances)


def test_server_view_interpolates_counters_at_the_window_edges():
    recs = closed_loop(4, 1.0, 40.0, tokens=10)
    # a server whose decode counter grows at 36 tok/s and first tokens at 4 per second
    samples = [ServerSample(t, decode_tokens_total=36 * t, first_tokens_total=4 * t, running=4, queued=0,
                            token_usage=0.5) for t in np.arange(0, 41, 0.7)]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(server=samples))
    assert res.server_output_tps == pytest.approx(40.0)
    assert res.server_mean_running == 4 and res.server_mean_token_usage == 0.5


def test_running_is_read_per_decode_step_where_the_engine_counts_busy_slots():
    """A snapshot gauge that reads 1 while the engine's own per-step count says 32 busy (llama.cpp on the H200 with
    its prompt cache on): the per-step counters decide, and the level says where its running count came from."""
    recs = closed_loop(4, 1.0, 40.0, tokens=10)
    # 30 decode steps a second; 32 slots busy at each, except a dip to 16 between 20 and 21 s
    busy = lambda t: 32 * 30 * t - (16 * 30 * min(max(t - 20, 0), 1))  # noqa: E731
    samples = [ServerSample(t, output_tokens_total=40 * t, running=1, decode_steps_total=30 * t,
                            busy_slot_steps_total=busy(t)) for t in np.arange(0, 41, 0.5)]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(server=samples))
    span = res.window_end - res.window_start
    assert res.server_mean_running == pytest.approx(32 - 16 / span, rel=1e-6)
    assert res.server_max_running == pytest.approx(32)
    assert res.server_running_source == "per decode step"
    snap = [dataclasses.replace(x, decode_steps_total=None, busy_slot_steps_total=None) for x in samples]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(server=snap))
    assert (res.server_max_running, res.server_running_source) == (1, "snapshots")


def test_slow_scrapes_at_the_window_edges_are_counted_as_timing_uncertainty():
    recs = closed_loop(4, 1.0, 40.0, tokens=10)
    # every scrape took 20 ms to answer, except the two that took 240 ms: the counter is known to +/-120 ms there
    slow = {7, 50}
    samples = [ServerSample(t, decode_tokens_total=36 * t, first_tokens_total=4 * t,
                            time_uncertainty_s=0.12 if i in slow else 0.01)
               for i, t in enumerate(np.arange(0, 41, 0.7))]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=10, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(server=samples))
    s, e = res.window_start, res.window_end
    bracketing = [max(u for t, u in ((x.time, x.time_uncertainty_s) for x in samples) if abs(t - edge) < 0.7)
                  for edge in (s, e)]
    assert res.server_edges_uncertainty_s == pytest.approx(sum(bracketing))
    assert res.server_edges_uncertainty_s >= 0.02


def test_lag_that_only_blurs_timestamps_is_a_warning_not_invalid():
    from sglperf.records import ClientSample

    recs = closed_loop(4, 10.0, 400.0, tokens=100)  # 10 s requests, ~90 ms between tokens
    samples = [ClientSample(t, cpu_s=0.2 * t, loop_lag_s=0.06) for t in np.arange(0, 400, 0.05)]
    res = level_result(recs, concurrency=4, rate=None, isl=100, osl=100, policy=MeasurementPolicy(ci_target=0.05),
                       samples=LevelSamples(client=samples))
    assert res.valid, res.invalid_reasons
    assert any("blurred" in w for w in res.warnings)


def _h200_window(name: str) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Output tokens per 50 ms inside one level's window on the H200 (tests/data/gpu): times, tokens, window,
    lifetime."""
    path = Path(__file__).parent / "data" / "gpu" / name
    head = [line for line in path.read_text().splitlines() if line.startswith("# window")][0].split()
    t, n = np.loadtxt(path, delimiter=",", skiprows=3, unpack=True)
    return t + 0.025, n, float(head[2]), float(head[6])


@pytest.mark.parametrize("name, shifted", [("h200-p16-c64-prompt-cache-on.csv", True),
                                           ("h200-p16-c64-prompt-cache-off.csv", False)])
def test_a_level_that_changed_regime_inside_its_window_says_so(name, shifted):
    """llama.cpp with its prompt cache on ran ~1,010 tok/s, then ~1,340, inside one 40 s window: the level's interval
    spans both. With the cache off the same level ran in one regime, and nothing is said."""
    t, n, length, lifetime = _h200_window(name)
    words = regime_shift(t, n, (0.0, length), min(30, int(length // lifetime)))
    if shifted:
        assert words and "then 1,3" in words and "two regimes" in words, words
        assert words.startswith("throughput changed inside the window: 1,0"), words
    else:
        assert words is None, words


def test_regime_changes_are_rarely_seen_in_steady_noise_and_always_in_a_30_percent_step():
    """Batch rates with 5% noise, 10 and 30 batches, seeded: a step of +30% halfway is named; steady noise is named
    in under 1% of levels (a warning only: it never changes a verdict)."""
    rng = np.random.default_rng(7)

    def named(k, step):
        rates = 1000 * (1 + rng.normal(0, 0.05, k))
        rates[k // 2:] *= 1 + step
        return regime_shift(np.arange(k) + 0.5, rates, (0.0, float(k)), k) is not None

    for k in (10, 30):
        assert np.mean([named(k, 0.0) for _ in range(400)]) < 0.01
    assert np.mean([named(30, 0.30) for _ in range(100)]) == 1.0


def test_one_long_pause_of_the_client_loop_shows_in_its_longest_lateness_not_its_p99():
    """A 50-ms ticker late by 1-3 ms, except once by 430 ms (the process paused): the p99 of about 200 samples stays
    low, the longest lateness names the pause."""
    from sglperf.measure.metrics import client_health
    from sglperf.records import ClientSample

    lags = [0.001 + 0.002 * (i % 2) for i in range(200)]
    lags[150] = 0.43
    samples = [ClientSample(time=i * 0.05, cpu_s=i * 0.005, loop_lag_s=lag) for i, lag in enumerate(lags)]
    health = client_health(samples, (0.0, 10.0))
    assert health.lag_max_ms == pytest.approx(430.0) and health.lag_p99_ms < 10.0
    assert health.cpu == pytest.approx(0.1)
    assert client_health([], (0.0, 10.0)).lag_max_ms is None
