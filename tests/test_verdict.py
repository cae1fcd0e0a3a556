"""Verdicts: the KV-ceiling prediction, plateau band and attribution, floors, and the A/B with measured noise."""

import dataclasses
import math

import pytest

from sglperf.store.baselines import Entry
from sglperf.records import Ceiling, LevelResult, Summary
from sglperf.engines.sglang import predict_ceiling
from sglperf.judge.noise import Noise
from sglperf.judge.plateau import (
    PLATEAU_SHARE, check_plateau, decides_plateau_level, plateau_compares, plateau_share, ratio_outcome,
)
from sglperf.judge.ab import check_ab
from sglperf.judge.floor import check_floor, decides_floor

S = Summary(None, None, None, None, 0)


def lr(c, tps, *, ci=10.0, running=None, queued=0.0, valid=True):
    fields = {f.name: None for f in dataclasses.fields(LevelResult)}
    fields.update(concurrency=c, isl=128, osl=128, valid=valid, invalid_reasons=(), sustained_output_tps=tps,
                  sustained_output_tps_ci95=ci, ttft_ms=S, tpot_ms=S, itl_ms=S, e2e_ms=S, errors={}, window_s=60.0,
                  ci_batches=10, completed=100, completed_in_window=80, requests_sent=100, cancelled=0,
                  duration_s=70.0, server_max_running=running, server_mean_running=running, server_mean_queued=queued,
                  incomplete=False, warnings=())
    return LevelResult(**fields)


def test_the_seeds_ceilings():
    kv = predict_ceiling(495_488, 64, 128, 128, 2048)
    assert (kv.kv, kv.effective, kv.binding) == (1935, 1935, "kv")
    cap = predict_ceiling(495_488, 64, 128, 128, 1024)
    assert (cap.effective, cap.binding) == (1024, "cap")


def test_plateau_on_the_kv_pool_is_attributed_to_it():
    c = predict_ceiling(495_488, 64, 128, 128, 2048)
    res = {1024: lr(1024, 1631), 2048: lr(2048, 2095, running=1935, queued=100),
           3072: lr(3072, 2062, running=1935, queued=1137)}
    v = check_plateau(res, c, band=0.07)
    assert v.passed and v.attributed_to == "kv" and v.reference_level == 2048


def test_plateau_on_the_admission_cap_is_attributed_to_it():
    c = predict_ceiling(495_488, 64, 128, 128, 1024)
    res = {1024: lr(1024, 1601, running=1024), 2048: lr(2048, 1640, running=1024, queued=1024)}
    v = check_plateau(res, c, band=0.07)
    assert v.passed and v.attributed_to == "cap"


def test_a_server_busy_at_its_cap_throughout_is_saturated_though_its_queue_gauge_reads_empty():
    """llama.cpp on the H200 (prompt cache on) read requests_deferred 0 at c48 with 32 slots busy. Busy slots per
    decode step at the cap say the server was full."""
    c = predict_ceiling(495_488, 64, 32, 32, 32)
    full = {64: lr(64, 1861, running=31.8, queued=0.0), 128: lr(128, 1843, running=31.9, queued=0.0)}
    v = check_plateau(full, c, band=0.10)
    assert v.passed and v.attributed_to == "cap", v.message
    idle = {64: lr(64, 1861, running=20.0, queued=0.0), 128: lr(128, 1843, running=20.0, queued=0.0)}
    assert "shows no saturation (nothing queued)" in check_plateau(idle, c, band=0.10).message


def test_throughput_that_keeps_climbing_past_the_ceiling_violates_the_plateau():
    c = predict_ceiling(495_488, 64, 128, 128, 2048)
    res = {2048: lr(2048, 2095, running=1935, queued=100), 3072: lr(3072, 2600, running=1935, queued=900)}
    v = check_plateau(res, c, band=0.07)
    assert not v.passed and "outside the plateau band ±7%" in v.message


def test_the_plateau_is_decided_by_the_levels_intervals():
    c = predict_ceiling(1024, 16, 32, 32, 4)
    res = {4: lr(4, 830, ci=2), 16: lr(16, 898, ci=2, running=4, queued=12)}  # +8.2% in one run, tight CIs
    assert check_plateau(res, c, band=0.07).outcome == "violated"
    wide = {4: lr(4, 830, ci=30), 16: lr(16, 898, ci=30, running=4, queued=12)}  # +8.2% ± 5%
    v = check_plateau(wide, c, band=0.07)
    assert v.outcome == "inconclusive" and "straddles the plateau band's edge" in v.message, \
        "+8.2% ± 5% cannot say whether it is past a 7% band: never a violation"
    calm = {4: lr(4, 830, ci=10), 16: lr(16, 840, ci=10, running=4, queued=12)}
    assert check_plateau(calm, c, band=0.07).outcome == "pass"


def test_a_plateau_ratio_the_host_disturbed_is_never_a_violation_and_names_the_disturbance():
    """An H200 run of 2026-12-04 read p32 c128 at 0.704 x c64 on a start whose hypervisor stole 25% of the CPU the
    work wanted (the floors had set that start aside) and failed KV PLATEAU VIOLATED: a disturbance lowers one
    level, not the other, so such a ratio decides nothing."""
    c = predict_ceiling(495_488, 64, 32, 32, 32)
    steal = "disturbed: the hypervisor stole 1.07 cores of the 4.27 this host's work wanted during the window"
    calm = {64: lr(64, 2420, ci=20, running=32, queued=32), 128: lr(128, 1704, ci=20, running=32, queued=96)}
    assert check_plateau(calm, c, band=0.15).outcome == "violated", "undisturbed, -29.6% is a violation"
    hit = {**calm, 128: dataclasses.replace(calm[128], disturbances=(steal,))}
    v = check_plateau(hit, c, band=0.15)
    assert v.outcome == "inconclusive" and not v.problems and not v.passed
    assert v.disturbed == (f"c128: {steal}",) and "not judged, the host disturbed c128" in v.message
    from sglperf.decide.settle import settle  # where no fresh start is left, the plateau is settled so
    o = settle([v], where="sim/p32", against="plateau", disturbed=v.disturbed)
    assert o.kind == "fail" and o.message.startswith("INVALID MEASUREMENT: sim/p32 cannot be judged against its "
                                                     "plateau: c128: disturbed: the hypervisor stole 1.07 cores")
    # the reference is the level the host left alone, though the disturbed one is more precise
    tight = {**hit, 128: dataclasses.replace(hit[128], sustained_output_tps_ci95=2.0)}
    assert check_plateau(tight, c, band=0.15).reference_level == 64
    # a disturbed level whose ratio passes still passes: a disturbance can only have lowered it
    flat = {**calm, 128: dataclasses.replace(calm[128], sustained_output_tps=2390, disturbances=(steal,))}
    assert check_plateau(flat, c, band=0.15).outcome == "pass"


def test_the_h200_plateau_of_a_start_the_hypervisor_disturbed_is_undecided_naming_the_steal():
    """The planted run of 2026-12-04 (tests/data/gpu/h200-2026-12-04): p32 c64 and c128 of its first start had 21%
    and 6% of their CPU stolen; the ratio straddled the band. Undecided, saying so, for the suite to re-measure."""
    from pathlib import Path
    from sglperf.store.rundoc import load_run

    path = next((Path(__file__).parent / "data" / "gpu" / "h200-2026-12-04").glob("planted-*.json"))
    c = load_run(path).configs["p32"]
    res = {lv: LevelResult(**{f.name: getattr(c.levels[str(lv)], f.name) for f in dataclasses.fields(LevelResult)})
           for lv in (64, 128)}
    v = check_plateau(res, Ceiling(**c.server.ceiling), band=0.15)
    assert v.outcome == "inconclusive" and not v.unsure
    assert [d.split(":")[0] for d in v.disturbed] == ["c64", "c128"]
    assert all("the hypervisor stole" in d for d in v.disturbed)


def test_a_plateau_level_stops_on_its_floor_only_once_its_interval_is_narrow_enough_for_the_band():
    floor, band = 1800.0, 0.07
    decided_at_5pct = lr(2048, 2000, ci=100)  # 2,000 ± 100: wholly above the floor, but ±5% against a ±7% band
    assert decides_floor(floor)(decided_at_5pct)
    assert not decides_plateau_level(floor, band)(decided_at_5pct)
    narrow = 2000 * band * PLATEAU_SHARE  # ±2.33%: two such levels' ratio is known to ±3.3%
    assert decides_plateau_level(floor, band)(lr(2048, 2000, ci=narrow))
    assert not decides_plateau_level(floor, band)(lr(2048, 1810, ci=20))  # narrow, but the floor straddled
    assert not decides_plateau_level(floor, band)(lr(2048, 2000, ci=None))


def test_a_plateau_the_baseline_measured_flat_lets_its_levels_stop_at_half_the_band_and_a_sagging_one_keeps_a_third():
    band = 0.07
    flat = plateau_share(band, [15830.1, 15655.9])  # sim-seed's baseline: c3072 / c2048 = 0.989
    assert flat == 0.5
    half = 2000 * band * flat  # ±3.5% each: the baseline's ratio still decides (TOST) with both levels that wide
    assert ratio_outcome(0.989, math.hypot(half / 2000, half / 2000), band) == "pass"
    assert decides_plateau_level(1800.0, band, share=flat)(lr(2048, 2000, ci=half))
    assert not decides_plateau_level(1800.0, band)(lr(2048, 2000, ci=half)), "a third without a baseline's ratio"
    assert plateau_share(band, [2000, 1900]) == PLATEAU_SHARE  # -5%: no wider than today's third
    assert plateau_share(band, [2000]) == PLATEAU_SHARE  # one level: nothing to say how flat


def test_a_later_plateau_level_stops_once_its_ratio_to_the_earlier_one_is_decided_as_check_plateau_decides_it():
    floor, band = 1800.0, 0.07
    c2048 = lr(2048, 2000, ci=2000 * band * PLATEAU_SHARE)  # stopped at ±2.33%
    flat = lr(3072, 1980, ci=80)  # -1% at ±4%: the ratio's 90% interval is -1% ± 3.9%, inside ±7%
    assert not decides_plateau_level(floor, band)(flat), "alone, ±4% is too wide for the band"
    assert decides_plateau_level(floor, band, [c2048])(flat)
    ceiling = Ceiling(kv=1935, cap=2048, effective=1935, binding="kv", tokens_per_request=256)
    both = {2048: dataclasses.replace(c2048, server_max_running=1935, server_mean_running=1935, server_mean_queued=100),
            3072: dataclasses.replace(flat, server_max_running=1935, server_mean_running=1935, server_mean_queued=1100)}
    assert check_plateau(both, ceiling, band=band).outcome == "pass", "what stopped the level is what the plateau says"
    sagging = lr(3072, 1900, ci=76)  # -5% at ±4%: straddles the band's edge, so the level runs on
    assert not decides_plateau_level(floor, band, [c2048])(sagging)
    fallen = lr(3072, 1600, ci=64)  # -20%, wholly outside: violated, decided (its floor too: below it)
    assert decides_plateau_level(1500.0, band, [c2048])(fallen)
    assert not decides_plateau_level(floor, band, [c2048])(lr(3072, 1810, ci=80)), "the floor still straddled"

def test_the_levels_the_plateau_compares_are_those_check_plateau_judges():
    cap = predict_ceiling(495_488, 64, 128, 128, 1024)  # binds at 1024
    ladder = [256, 512, 1024, 2048, 3072]
    assert [lv for lv in ladder if plateau_compares(lv, cap, ladder)] == [2048, 3072]  # c1024 is left out
    assert [lv for lv in [512, 1024, 2048] if plateau_compares(lv, cap, [512, 1024, 2048])] == [1024, 2048]
    assert not plateau_compares(3072, None, ladder)


def test_a_server_running_far_from_the_prediction_violates_the_plateau():
    c = predict_ceiling(495_488, 64, 128, 128, 2048)
    res = {2048: lr(2048, 2095, running=1500, queued=100), 3072: lr(3072, 2062, running=1500, queued=900)}
    v = check_plateau(res, c, band=0.07)
    assert not v.passed and "not near the predicted ceiling 1935" in v.message


def test_a_running_count_far_from_the_ceiling_says_how_many_scrapes_it_was_read_from_and_why_others_failed():
    """The H200's llama.cpp read 1 running request with 32 slots busy: the message must let the next run tell a
    server that counts wrong from a view read from two scrapes while the others timed out."""
    c = predict_ceiling(495_488, 64, 128, 128, 2048)
    thin = dataclasses.replace(lr(3072, 2062, running=1, queued=900), server_samples_in_window=2, scrape_errors=14,
                               scrape_last_error="TimeoutError: ")
    v = check_plateau({2048: lr(2048, 2095, running=1935, queued=100), 3072: thin}, c, band=0.07)
    assert not v.passed
    assert ("c3072: server ran up to 1 requests (mean 1.0), not near the predicted ceiling 1935 (the KV pool: a mean "
            "within ±20% of it, the maximum reaching it) (read from 2 scrapes inside the window; 14 failed during the "
            "level, last: TimeoutError: )") in v.message


def test_floor_message_names_everything():
    e = Entry(metric="sustained_output_tps", value=2095.0, tolerance=0.05, taken_at="2026-11-01", source="run x",
              sglperf_version="0.1.0")
    v = check_floor(lr(2048, 1800.0, ci=12.0), e, where="glm5/rr2048 c2048", baseline_source="b.json",
                    log_path="srv.log", env_diff="environment changed since the baseline: driver 1 → 2")
    assert not v.passed
    assert v.detail == v.message[len("THROUGHPUT REGRESSION: "):] and "REGRESSION" not in v.detail, \
        "a disturbed level quotes the measurement without the category"
    for needle in ["THROUGHPUT REGRESSION", "c2048", "1,800.0 ± 12.0", "-14.1% vs baseline", "floor 1,990.2",
                   "baseline 2,095.0", "b.json", "run x", "driver 1 → 2", "srv.log"]:
        assert needle in v.message, needle


def test_a_late_simulator_is_named_for_its_share_of_the_drop_and_never_said_to_be_under_a_limit_it_passed():
    # sim-seed rr2048 c2048 on a 2-core Intel VM (2026-12-05): 11.7% late, the level INVALID for it (limit 5%); the
    # floor's message inside said "under its disturbance limit"
    e = Entry(metric="sustained_output_tps", value=19555.4, tolerance=0.05, taken_at="2026-11-29", source="run x",
              sglperf_version="0.1.0")
    for late in (0.03, 0.117):
        level = dataclasses.replace(lr(2048, 18023.4, ci=526.9), sim_behind_share=late)
        v = check_floor(level, e, where="sim-seed/rr2048-cds8 c2048", baseline_source="b.json", log_path=None)
        assert v.outcome == "inconclusive"
        assert f"the simulator ran {late:.1%} late" in v.message and "under its disturbance limit" not in v.message


def test_ab_seed_gain_and_no_loss():
    c1, c2 = predict_ceiling(495_488, 64, 128, 128, 1024), predict_ceiling(495_488, 64, 128, 128, 2048)
    base = {256: lr(256, 705), 2048: lr(2048, 1640)}
    tuned = {256: lr(256, 705), 2048: lr(2048, 2095)}
    v = check_ab(base, tuned, c1, c2, margin=0.05)
    assert v.passed and v.gains[2048] == pytest.approx(0.2774, abs=1e-3)


def test_ab_uses_the_baselines_run_to_run_noise():
    c1, c2 = predict_ceiling(3072, 16, 32, 32, 4), predict_ceiling(3072, 16, 32, 32, 8)
    base, tuned = {4: lr(4, 890, ci=15)}, {4: lr(4, 740, ci=15)}  # -17% in one run
    assert check_ab(base, tuned, c1, c2, margin=0.05).outcome == "regression", "with only the within-run CIs: worse"
    noisy = check_ab(base, tuned, c1, c2, margin=0.05, base_noise={4: Noise(0.02, 20)},
                     tuned_noise={4: Noise(0.12, 20)})
    assert noisy.outcome == "inconclusive" and "cannot tell" in noisy.unsure[0], \
        "the tuned config's between-start noise (12% CV) makes -17% undecidable in one run: not a regression"
    lost_gain = check_ab({8: lr(8, 900)}, {8: lr(8, 880)}, c1, c2, margin=0.05)
    assert lost_gain.outcome == "regression" and "expected a gain" in lost_gain.problems[0]
    unsure_gain = check_ab({8: lr(8, 900)}, {8: lr(8, 905)}, c1, c2, margin=0.05)
    assert unsure_gain.outcome == "inconclusive" and "does not decide it" in unsure_gain.unsure[0]
    assert check_ab({8: lr(8, 900)}, {8: lr(8, 960)}, c1, c2, margin=0.05).outcome == "pass"


def test_the_expected_gain_is_decided_on_the_levels_past_the_base_ceiling_together():
    c1, c2 = predict_ceiling(3072, 16, 32, 32, 4), predict_ceiling(3072, 16, 32, 32, 8)
    noise = {lv: Noise(0.06, 20) for lv in (8, 16, 32)}
    base = {lv: lr(lv, 550, ci=13) for lv in (8, 16, 32)}
    tuned = {8: lr(8, 667, ci=25), 16: lr(16, 607, ci=29), 32: lr(32, 688, ci=19)}
    alone = check_ab({16: base[16]}, {16: tuned[16]}, c1, c2, margin=0.4, base_noise=noise, tuned_noise=noise)
    assert alone.outcome == "inconclusive", "+10% with 6% between-start CVs cannot be told from noise at one level"
    together = check_ab(base, tuned, c1, c2, margin=0.4, base_noise=noise, tuned_noise=noise)
    assert together.outcome == "pass" and "3 levels" in together.lines[-1], \
        "+21%, +10%, +25%: their mean decides the gain (between-start noise counted once, as fully correlated)"
    lost_at_one = {**tuned, 16: lr(16, 450, ci=5)}
    assert check_ab(base, lost_at_one, c1, c2, margin=0.4).outcome == "regression", \
        "a level clearly without the gain is a problem even when the mean still gains"


def test_an_ab_whose_profile_shows_the_levels_below_the_cap_judges_only_the_gain():
    # llama.cpp on a 2-core CI host, 2026-12-03: p8's c4 over three starts (172.9, 394.3, 391.8) against p4's
    c1, c2 = predict_ceiling(3072, 16, 32, 32, 4), predict_ceiling(3072, 16, 32, 32, 8)
    base = {4: lr(4, 381.6, ci=40.6), 8: lr(8, 373.0, ci=17.1), 16: lr(16, 375.8, ci=16.6)}
    tuned = {4: lr(4, 319.7, ci=300.0), 8: lr(8, 526.6, ci=22.1), 16: lr(16, 536.5, ci=25.3)}
    judged = check_ab(base, tuned, c1, c2, margin=0.5)
    assert judged.outcome == "inconclusive" and judged.undecided_levels == (4,)
    shown = check_ab(base, tuned, c1, c2, margin=0.5, judge_below_cap=False)
    assert shown.outcome == "pass" and "shown, not judged" in shown.lines[0], \
        "below the cap the loss is shown; the gain past it (+42%) is the claim and it holds"
    lost = check_ab(base, {**tuned, 8: lr(8, 330.0, ci=17.0), 16: lr(16, 335.0, ci=17.0)}, c1, c2, margin=0.5,
                    judge_below_cap=False)
    assert lost.outcome == "regression", "a config that loses past the base's cap (-11%) still fails"
    nothing = check_ab({4: base[4]}, {4: tuned[4]}, c1, c2, margin=0.5, judge_below_cap=False)
    assert nothing.outcome == "inconclusive" and "no level measured gains past it" in nothing.unsure[0], \
        "with nothing past the cap there is nothing judged: never a pass"


def test_the_plateau_is_measured_from_the_first_level_where_requests_wait():
    c = predict_ceiling(1024, 16, 32, 32, 4)
    res = {4: lr(4, 780, ci=5, running=4), 8: lr(8, 880, ci=5, running=4, queued=4),
           16: lr(16, 885, ci=6, running=4, queued=12)}  # c4 loses each slot's client round trip: +13% to c8
    v = check_plateau(res, c, band=0.07)
    assert v.passed and v.reference_level == 8 and "not judged" in v.message
    assert check_plateau({4: res[4], 8: res[8]}, c, band=0.07).reference_level == 4, \
        "with one level past the ceiling, the one at it is the only reference there is"


def test_the_plateau_reference_is_its_most_precise_level_and_never_judged_against_itself():
    """The 2-core CI host: c8 at ±22.6% made every ratio against it undecided, itself included (+0.0% ± 32%)."""
    c = predict_ceiling(1024, 16, 32, 32, 4)
    res = {4: lr(4, 843.8, ci=105.6, running=4), 8: lr(8, 910.6, ci=206.3, running=4, queued=3.2),
           16: lr(16, 901.8, ci=17.5, running=4, queued=11.8), 32: lr(32, 903.9, ci=14.1, running=4, queued=27.9)}
    v = check_plateau(res, c, band=0.15)
    assert v.outcome == "pass" and v.reference_level == 32, v.message
    assert "vs c32 straddles" not in v.message and "c8: +0.7% ± 22.7% vs c32: its own interval (±22.7%) is wider " \
        "than the band, so it cannot test it; consistent with the plateau, set aside" in v.message


def test_a_level_too_imprecise_to_test_the_band_is_set_aside_only_while_it_leans_inside_it():
    c = predict_ceiling(2048, 16, 32, 32, 8)
    ci_run = {8: lr(8, 969.9, ci=68.7, running=8), 16: lr(16, 984.3, ci=31.4, running=8, queued=6.6),
              32: lr(32, 1031.2, ci=357.9, running=8, queued=23.6)}  # the CI host: +4.8% ± 34.9%
    assert check_plateau(ci_run, c, band=0.15).outcome == "pass"
    leaning = {**ci_run, 32: lr(32, 870.0, ci=357.9, running=8, queued=23.6)}  # -11.6%: past the inner half
    assert check_plateau(leaning, c, band=0.15).outcome == "inconclusive"
    both = {**ci_run, 16: lr(16, 984.3, ci=250.0, running=8, queued=6.6)}  # the reference as imprecise
    v = check_plateau(both, c, band=0.15)
    assert v.outcome == "inconclusive" and "but so is the reference c16's" in v.message, v.message
    collapsed = {**ci_run, 32: lr(32, 300.0, ci=120.0, running=8, queued=23.6)}  # -69.5% ± 40%
    assert check_plateau(collapsed, c, band=0.15).outcome == "violated"


def test_the_ab_between_start_noise_shrinks_with_the_starts_each_value_is_the_mean_of():
    """Three starts of each config average their between-start noise as the floor's do (the host's part stays):
    -3.7% at p16 c8 on an H200 was undecided over 3 starts while each config's mean was known to ±1.7%."""
    c1, c2 = predict_ceiling(3072, 16, 32, 32, 16), predict_ceiling(3072, 16, 32, 32, 32)
    noise = {8: Noise(0.04, 30, within=0.01)}
    base, tuned = {8: lr(8, 1000, ci=10)}, {8: lr(8, 963, ci=10)}
    one = check_ab(base, tuned, c1, c2, margin=0.10, base_noise=noise, tuned_noise=noise)
    assert one.outcome == "inconclusive" and one.undecided_levels == (8,)
    three = check_ab(base, tuned, c1, c2, margin=0.10, base_noise=noise, tuned_noise=noise, base_starts={8: 3},
                     tuned_starts={8: 3})
    assert three.outcome == "pass", three.lines
    hosted = {8: Noise(0.04, 30, within=0.01, host=0.035, hosts=5)}
    assert check_ab(base, tuned, c1, c2, margin=0.10, base_noise=hosted, tuned_noise=hosted, base_starts={8: 3},
                    tuned_starts={8: 3}).outcome == "inconclusive", "a host's part does not average away"


def test_an_undecided_pooled_gain_names_every_level_it_rests_on():
    c1, c2 = predict_ceiling(3072, 16, 32, 32, 4), predict_ceiling(3072, 16, 32, 32, 8)
    noise = {lv: Noise(0.06, 20) for lv in (2, 8, 16)}
    base = {lv: lr(lv, 550, ci=13) for lv in (2, 8, 16)}
    tuned = {2: lr(2, 560, ci=13), 8: lr(8, 580, ci=25), 16: lr(16, 570, ci=29)}
    v = check_ab(base, tuned, c1, c2, margin=0.4, base_noise=noise, tuned_noise=noise)
    assert v.outcome == "inconclusive" and v.undecided_levels == (8, 16), v.unsure


def test_a_plateau_undecided_on_one_start_is_judged_over_all_starts_with_the_between_start_noise():
    # an H200 run (llama.cpp, 32 slots): c64's first start ran in two regimes inside its window, 2,088 ± 926; the
    # floors had measured c64 and c128 again on other starts
    from sglperf.judge.starts import over_starts
    c = predict_ceiling(128 * 64, 64, 32, 32, 32)
    starts = {64: [lr(64, 2087.7, ci=926.3, running=32, queued=29), lr(64, 2412.0, ci=46.7, running=32, queued=29)],
              128: [lr(128, 2340.5, ci=63.8, running=32, queued=92), lr(128, 2301.3, ci=40.0, running=32, queued=92)]}
    assert check_plateau({lv: s[0] for lv, s in starts.items()}, c, band=0.15).outcome == "inconclusive"
    noise = {64: Noise(cv=0.034, df=20, within=0.015), 128: Noise(cv=0.025, df=20, within=0.01)}
    over = over_starts(starts, noise)
    one = check_plateau(over, c, band=0.15)
    assert one.outcome == "pass"
    # the between-start noise is in the intervals: wider than the starts' own intervals alone say
    assert over[128].sustained_output_tps_ci95 > (63.8 ** 2 + 40.0 ** 2) ** 0.5 / 2
    # without a calibrated between-start noise, or with nothing measured twice, starts are not mixed
    assert over_starts(starts, {64: noise[64]}) is None
    assert over_starts({lv: s[:1] for lv, s in starts.items()}, noise) is None


def test_starts_are_weighed_by_their_precision_so_one_wide_start_leaves_a_level_decided():
    """The H200, 2026-12-02, host 383f094197cf: a healthy p16 c128 read 1,491.0 ± 31.7 on its first start and
    1,485.4 ± 128.1 on its third (a dip in its window; the second was disturbed). Their plain mean, known to ±66,
    was less precise than the floor is wide, and the level ended INCONCLUSIVE at its last start: the run was red.
    Weighed by precision it is known to ±31 and worth 1.2 starts against the between-start noise: a pass. A slow
    server still fails, weighed or not."""
    entry = Entry(metric="sustained_output_tps", value=1563.84, tolerance=0.0408, noise_cv=0.01716, runs=15,
                  noise_df=19.8, within_cv=0.01553, host_cv=0.01457, hosts=5, min_tolerance=0.03,
                  taken_at="2026-12-01", source="s", sglperf_version="0")
    starts = [lr(128, 1491.0, ci=31.7), lr(128, 1485.4, ci=128.1)]
    v = check_floor(starts, entry, where="p16 c128", baseline_source="b", log_path=None, last=True)
    assert v.outcome == "pass", v.message
    assert v.ci95 < 35 and "weighed by precision: worth 1.2 starts" in v.message
    even = [lr(128, 1491.0, ci=31.7), lr(128, 1485.4, ci=31.7)]
    assert check_floor(even, entry, where="x", baseline_source="b", log_path=None).value == pytest.approx(1488.2)
    slow = [lr(128, 1300.0, ci=31.7), lr(128, 1310.0, ci=128.1)]
    assert check_floor(slow, entry, where="x", baseline_source="b", log_path=None, last=True).outcome == "regression"


def test_only_a_drop_beyond_what_the_stolen_cpu_explains_is_a_regression_on_a_host_steal_disturbed():
    """Every start disturbed: a steal of 16% of the CPU the work wanted explains a fall of up to 32% below the floor
    (disturbance.STEAL_COST), not a two-thirds drop; the same drop beside another disturbance (other processes' CPU,
    whose cost no share bounds) says nothing."""
    from sglperf.judge.disturbance import beyond_steal

    entry = Entry(metric="sustained_output_tps", value=1631.8, tolerance=0.038, noise_cv=0.014, runs=20,
                  noise_df=24.0, min_tolerance=0.03, taken_at="2026-12-02", source="s", sglperf_version="0")

    def stolen(tps, steal, other=None):
        why = f"disturbed: the hypervisor stole {steal:.2f} cores of the 1.70 this host's work wanted during the window"
        return dataclasses.replace(lr(64, tps, ci=19.0), host={"steal_cores": steal, "server_cores": 1.6,
                                   "client_cores": 0.1, "other_cores": 0.0},
                                   disturbances=(why,) + ((other,) if other else ()))

    def share(starts):
        return beyond_steal(check_floor(starts, entry, where="p16 c64", baseline_source="b", log_path=None,
                                        last=True), starts)

    assert share([stolen(511.0, 0.28), stolen(497.0, 0.16)]) == pytest.approx(0.28 / 1.98)
    assert share([stolen(1180.0, 0.28), stolen(1190.0, 0.16)]) is None  # -27%: the steal may be all of it
    assert share([stolen(1640.0, 0.28)]) is None  # a pass is nothing to explain
    busy = "disturbed: other processes used 3.1 cores of 16 during the window"
    assert share([stolen(511.0, 0.28, busy), stolen(497.0, 0.16)]) is None


def test_a_level_whose_server_reports_twice_the_tokens_is_invalid_and_its_floor_never_passes():
    """A proxy doubling completion_tokens while half is generated: the client's 964.9 tok/s against the server's
    1,929.8. The level is made invalid where it is measured (run/session), so no floor passes on it, no history point
    is taken and no candidate is written; the count test says why."""
    from types import SimpleNamespace

    from sglperf.decide import decide
    from sglperf.decide.count import ServerCount
    from sglperf.judge.count import check_server_count
    from sglperf.decide.health import count_checked as _count_checked

    r = dataclasses.replace(lr(16, 964.9), server_output_tps=1929.8, server_ratio=0.5)
    run = SimpleNamespace(where="sim-ci/rr24-cds4", server_count=lambda x: check_server_count(
        x, where="sim-ci/rr24-cds4", tolerance=0.02, cap=24))
    checked = _count_checked(run, r)
    assert not checked.valid and "disagree on how many tokens were streamed" in checked.invalid_reasons[-1]
    assert checked.invalid_reasons[-1].startswith("client 964.9 tok/s"), "the level is named once, by its message"
    from sglperf.decide.health import start_failure

    said = start_failure("sim-ci/rr24-cds4", checked, None, None)
    assert said.count("c16") == 1 and said.startswith("INVALID MEASUREMENT: sim-ci/rr24-cds4 c16 cannot be trusted: "
                                                      "client 964.9"), said
    assert _count_checked(run, dataclasses.replace(r, server_output_tps=965.0, server_ratio=0.9999)).valid
    ev = SimpleNamespace(where=run.where, server_count=run.server_count,
                         measure=lambda lv: SimpleNamespace(result=checked, scrape_source="metrics"))
    o = decide(ServerCount(16), ev)
    assert o.kind == "fail" and o.message.startswith("INVALID MEASUREMENT: sim-ci/rr24-cds4 c16: client 964.9 tok/s, "
                                                     "server 1,929.8")


def _plateau_evidence(first: dict, *fresh: dict):
    """A config's plateau evidence: `first` the levels of its first start, `fresh` those of the starts the profile
    still allows, in order, the measurement a profile's (band 15%)."""
    from types import SimpleNamespace

    c = predict_ceiling(3072, 16, 32, 32, 64)  # KV ceiling 48
    recorded = {}
    ev = SimpleNamespace(
        where="cpu-sglang/rr32", ceiling=c, starts=1, log_path=None, recorded=recorded,
        profile=SimpleNamespace(measurement=SimpleNamespace(plateau_band=0.15)),
        measure=lambda lv: SimpleNamespace(result=first[lv]), canary_failure=lambda what: None,
        level_failure=lambda m: None, over_starts=lambda levels: None, level_starts=lambda lv: [first[lv]],
        record_plateau=lambda doc: recorded.setdefault("doc", doc))

    def replicate_levels(levels, why):
        if ev.starts > len(fresh):
            return None
        ev.starts += 1
        return {lv: SimpleNamespace(result=fresh[ev.starts - 2][lv]) for lv in levels}
    ev.replicate_levels = replicate_levels
    return ev


def test_a_plateau_violation_that_does_not_repeat_on_a_fresh_start_is_the_hosts_drift_never_violated():
    """Real SGLang on a CPU whose speed drifts between levels measured minutes apart read c64 +27% over c96 on one
    start, where physics says flat; on the next start the two agree. Undecided, naming the drift: never red."""
    from sglperf.decide import decide
    from sglperf.decide.plateau import Plateau

    drifted = {64: lr(64, 1270, ci=20, running=48, queued=16), 96: lr(96, 1000, ci=20, running=48, queued=48)}
    flat = {64: lr(64, 1010, ci=20, running=48, queued=16), 96: lr(96, 1000, ci=20, running=48, queued=48)}
    o = decide(Plateau((64, 96)), _plateau_evidence(drifted, flat))
    assert o.kind == "fail" and o.message.startswith("INCONCLUSIVE"), o.message
    assert "a violation that does not repeat is the host drifting between levels, not the plateau" in o.message
    again = decide(Plateau((64, 96)), _plateau_evidence(drifted, drifted))
    assert again.kind == "fail" and again.message.startswith("KV PLATEAU VIOLATED"), "a real one repeats"
    assert decide(Plateau((64, 96)), _plateau_evidence(flat)).kind == "pass"
    third = decide(Plateau((64, 96)), _plateau_evidence(drifted, flat, flat))
    assert third.kind == "pass", "where a third start is allowed, it decides: two of three flat"
