"""Speculative decoding, measured: the simulator drafts and verifies as SGLang's EAGLE path reports it (meta_info's
spec_accept_length and spec_verify_ct, the sglang:spec_accept_length gauge), and a level's acceptance length is read
from every request that finished in its window, with an interval, beside the server's gauge."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from sglperf.engines import llamacpp_build
from sglperf.measure.workload_metrics import acceptance
from sglperf.records import RequestRecord, ServerSample
from sglperf.sim.calibrate import engine_config
from sglperf.sim.engine import Engine
from sglperf.sim.presets import CI

from .conftest import assert_suite_passed, user_env
from .test_faults import ROOT


def run_engine(**spec) -> Engine:
    e = Engine(replace(engine_config(CI, 64, 1), **spec))
    for i in range(48):
        e.add_request(f"r{i}", 32, 128)
    for _ in range(100_000):
        if e.step() is None:
            break
    return e


@pytest.mark.parametrize("pinned", [False, True])
def test_the_simulators_draft_accepts_the_mean_it_is_given_pinned_or_drawn(pinned):
    e = run_engine(spec_draft_tokens=4, accept_length=2.6, accept_pinned=pinned, verify_cost=0.35)
    assert e.stats.spec_accepted / e.stats.spec_verify == pytest.approx(2.6, abs=0.05)
    assert all(r.output_len == 128 for r in e.requests.values()) or not e.requests


def test_the_simulator_counts_a_verify_steps_tokens_past_max_tokens_as_sglang_does_but_streams_only_max_tokens():
    """What SGLang 0.5.17 did on an H100 with NGRAM (docs/measurement.md, "Speculative decoding on a GPU"): its
    per-step decode counter and acceptance gauge count every token a verify step accepted, also past a request's
    max_tokens, while the request streams and reports (completion over verify steps) only what max_tokens allows."""
    e = Engine(replace(engine_config(CI, 64, 1), spec_draft_tokens=4, accept_length=3.5, accept_pinned=True))
    reqs = [e.add_request(f"r{i}", 32, 30) for i in range(16)]
    for _ in range(100_000):
        if e.step() is None:
            break
    assert all(r.output_len == 30 for r in reqs)
    streamed = sum(r.output_len - 1 for r in reqs)  # the first token is the prefill's
    assert e.stats.decode_tokens > streamed, "the last verify step's extra tokens, counted and dropped"
    per_request = sum(r.accepted for r in reqs) / sum(r.verify_ct for r in reqs)
    gauge = e.stats.spec_accepted / e.stats.spec_verify
    assert per_request < gauge and gauge == pytest.approx(3.5, abs=0.1)


def test_a_verify_step_costs_more_than_a_decode_step_and_gives_more_tokens():
    plain, spec = run_engine(), run_engine(spec_draft_tokens=4, accept_length=2.6, verify_cost=0.35)
    assert spec.stats.decode_steps < plain.stats.decode_steps / 2
    assert spec.now < plain.now, "2.6 tokens a step at 1.35 x the cost: faster"


def rec(i, accept, verify, end=5.0):
    return RequestRecord(i, 0.0, end, 32, 32, server_completion_tokens=32, finish_reason="length",
                         spec_verify_ct=verify, spec_accept_length=accept)


def test_a_levels_acceptance_is_weighed_by_verify_steps_over_the_window_beside_the_servers_gauge():
    done = [rec(0, 2.0, 10), rec(1, 3.0, 30), rec(2, 9.0, 10, end=50.0)]
    out = acceptance(done, (1.0, 10.0), [ServerSample(time=2.0, spec_accept_length=2.7),
                                         ServerSample(time=20.0, spec_accept_length=9.0)])
    assert out["acceptance_length"] == pytest.approx((2.0 * 10 + 3.0 * 30) / 40)
    assert out["server_accept_length"] == 2.7 and out["acceptance_length_ci95"] > 0
    assert acceptance([RequestRecord(0, 0.0, 5.0, 32, 32)], (1.0, 10.0), []) == {}, "a plain server: nothing"


# llama-server 0.3.36's last chunk of a /v1/completions stream, drafting with a draft model (recorded): 8 tokens, 5 of
# them accepted drafts, so 3 forward passes of the target (the prompt's, then 1 + 3 and 1 + 2 tokens)
LLAMACPP_LAST = {"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
                 "object": "text_completion", "usage": {"completion_tokens": 8, "prompt_tokens": 4, "total_tokens": 12,
                                                        "prompt_tokens_details": {"cached_tokens": 0}},
                 "timings": {"cache_n": 0, "prompt_n": 4, "prompt_ms": 13.631, "predicted_n": 8, "predicted_ms": 32.295,
                             "draft_n": 5, "draft_n_accepted": 5}}


def test_llamacpps_final_timings_give_each_request_its_tokens_per_pass_of_the_target():
    from sglperf.measure.client import _Progress
    from sglperf.measure.wire import OPENAI

    p = _Progress(0, 0.0, 4, 8)
    OPENAI.chunk(LLAMACPP_LAST, p, 7)
    assert (p.spec_verify_ct, p.spec_accept_length) == (3, pytest.approx(8 / 3))
    plain = _Progress(0, 0.0, 4, 8)
    OPENAI.chunk({**LLAMACPP_LAST, "timings": {"predicted_n": 8, "prompt_n": 4}}, plain, 7)
    assert plain.spec_verify_ct is None and plain.spec_accept_length is None, "no draft: nothing recorded"


def test_a_server_that_counts_accepted_drafts_gives_its_acceptance_over_the_window_from_its_counters():
    """llama.cpp counts output and accepted draft tokens: over the window, output / (output - accepted) tokens a
    pass of the target, the counters interpolated at the window's edges."""
    server = [ServerSample(time=0.0, output_tokens_total=0.0, spec_accepted_total=0.0),
              ServerSample(time=10.0, output_tokens_total=3200.0, spec_accepted_total=2300.0)]
    out = acceptance([rec(0, 3.5, 9)], (2.0, 7.0), server)
    assert out["server_accept_length"] == pytest.approx(1600 / (1600 - 1150), abs=1e-4)
    assert acceptance([rec(0, 3.5, 9)], (2.0, 7.0), server[:1])["server_accept_length"] is None, "one scrape: none"


def test_a_throughput_floor_missed_says_whether_the_draft_or_the_verify_step_moved():
    from sglperf.decide.floor import attributed
    from sglperf.judge.floor import FloorVerdict

    out = FloorVerdict("regression", "sustained_output_tps", 880.0, 10.0, 950.0, 1000.0, 0.05,
                       "THROUGHPUT REGRESSION: sim-spec/eagle c16: sustained_output_tps 880.0 ± 10.0 tok/s")
    drafted = FloorVerdict("regression", "acceptance_length", 2.6, 0.02, 2.95, 3.1, 0.05, "ACCEPTANCE REGRESSION: ...")
    said = attributed([out, drafted])[0].message
    assert said.endswith("; output -12.0% with acceptance 3.10 -> 2.60 (-16.1%): the draft's share")
    same = FloorVerdict("pass", "acceptance_length", 3.09, 0.02, 2.95, 3.1, 0.05, "")
    said = attributed([out, same])[0].message
    assert "acceptance unchanged (3.10 -> 3.09 (-0.3%), within its floor): the verify step slowed" in said
    assert attributed([out]) == [out], "no speculation: nothing to attribute"


def test_a_pinned_acceptance_must_hold_and_a_baseline_of_one_pin_never_judges_another():
    import dataclasses
    from types import SimpleNamespace

    from sglperf.decide.floor import other_pin
    from sglperf.environment.fingerprint import accept_pin
    from sglperf.records import LevelResult
    from sglperf.decide.health import pin_checked as _pin_checked

    assert accept_pin({"SGLANG_SIMULATE_ACC_LEN": "2.6"}) == 2.6 and accept_pin({}) is None
    fields = {f.name: None for f in dataclasses.fields(LevelResult)}
    fields.update(concurrency=16, isl=32, osl=32, valid=True, invalid_reasons=(), errors={}, window_s=10.0,
                  ci_batches=10, completed=100, completed_in_window=80, requests_sent=100, cancelled=0, duration_s=12.0,
                  incomplete=False, warnings=())
    r = LevelResult(**fields)
    run = SimpleNamespace(fingerprint={"spec_accept_pin": 2.6})
    held = dataclasses.replace(r, acceptance_length=2.57, acceptance_length_ci95=0.02)
    assert _pin_checked(run, held).valid, "a request's last step accepts what is left: a little under the pin"
    broke = _pin_checked(run, dataclasses.replace(r, acceptance_length=2.2, acceptance_length_ci95=0.02))
    assert not broke.valid and broke.invalid_reasons[-1].startswith(
        "acceptance pinned at 2.6 (SGLANG_SIMULATE_ACC_LEN) but measured 2.200 ± 0.020: the pin did not hold")
    none = _pin_checked(run, r)
    assert not none.valid and "no acceptance length reported" in none.invalid_reasons[-1]
    assert _pin_checked(SimpleNamespace(fingerprint={}), r).valid, "not pinned: nothing to hold"

    entry = SimpleNamespace(fingerprint={"spec_accept_pin": 3.0})
    assert "pinned at 3, this run at 2.6" in other_pin([entry], {"spec_accept_pin": 2.6})
    assert other_pin([entry], {"spec_accept_pin": 3.0}) is None
    assert other_pin([SimpleNamespace(fingerprint={"driver": "1"})], {}) is None, "old baselines, unpinned runs"


def spec_suite(tmp_path, *args, profile="sim-spec", env=None):
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-rs", "-p", "no:randomly", "--profile",
                        profile, "--reports-dir", str(tmp_path / "reports"), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=user_env(**(env or {})))
    return p, p.stdout + p.stderr


def test_a_lower_acceptance_fails_the_throughput_floor_naming_the_draft_and_the_acceptance_floor(tmp_path):
    """The draft accepts 2.0 tokens a step where the baseline's accepted 2.6: output falls about a fifth, and both
    floors fail; the throughput one says the draft's share."""
    p, out = spec_suite(tmp_path, "--levels", "16", "--server-arg=--sim-accept-length=2.0")
    assert p.returncode == 1, out[-3000:]
    assert "THROUGHPUT REGRESSION: sim-spec/eagle c16: sustained_output_tps" in out
    assert "ACCEPTANCE REGRESSION: sim-spec/eagle c16: acceptance_length" in out
    assert ": the draft's share" in out and "the verify step slowed" not in out


def test_a_slower_verify_step_with_the_same_acceptance_fails_naming_the_verify_step(tmp_path):
    p, out = spec_suite(tmp_path, "--levels", "16", "--server-arg=--sim-verify-cost=0.9")
    assert p.returncode == 1, out[-3000:]
    assert "THROUGHPUT REGRESSION: sim-spec/eagle c16: sustained_output_tps" in out
    assert "acceptance unchanged" in out and "the verify step slowed" in out
    assert "disagree on how many tokens were streamed" not in out, "counted by its finished requests while it drafts"
    assert "ACCEPTANCE REGRESSION: sim-spec/eagle c16: acceptance_length" not in out


def test_a_pinned_acceptance_that_holds_is_judged_and_one_that_does_not_is_invalid(tmp_path):
    """SGLANG_SIMULATE_ACC_LEN=3 in the server's environment: the simulator honours it, the level measures it, and the
    baseline (taken unpinned) does not judge it. A server that ignores the variable accepts its own 2.6: INVALID
    naming both."""
    p, out = spec_suite(tmp_path, "--levels", "16", env={"SGLANG_SIMULATE_ACC_LEN": "3"})
    assert "the baseline was taken with the acceptance pinned at none, this run at 3" in out, out[-3000:]
    assert "the pin did not hold" not in out
    p, out = spec_suite(tmp_path, "--levels", "16", "--server-arg=--fault-ignore-accept-pin",
                        env={"SGLANG_SIMULATE_ACC_LEN": "3"})
    assert p.returncode == 1 and "INVALID MEASUREMENT: sim-spec/eagle c16 cannot be trusted: acceptance pinned at 3 " \
                                 "(SGLANG_SIMULATE_ACC_LEN) but measured 2." in out, out[-3000:]


def test_real_llamacpp_drafting_is_measured_and_a_worse_draft_or_a_slower_target_fails_naming_which(tmp_path):
    """Real llama.cpp on this CPU, a draft model proposing up to 3 tokens a pass to a target that computes the same
    outputs at 4x its work. The client's acceptance (each request's final `timings`) is the server's (its counters);
    a baseline from that run, then a draft from other weights (every draft rejected: 1 token a pass, whatever the
    host) fails throughput naming the draft, and a target with twice the idle layers (the same outputs and
    acceptance, each pass slower) fails throughput naming the verify step."""
    def llama(name, *args):
        p, out = spec_suite(tmp_path / name, "--levels", "1", *args, profile="cpu-llamacpp-spec")
        if "floor not judged: this host's CPU is" in out:
            # a one-run baseline's CPU band is the probe's prior alone, and a VM's probe can leave it between two runs
            # minutes apart (docs/measurement.md, "The CPU probe between two runs"): the floor then goes unjudged,
            # rightly (tests/test_host_speed.py pins that gate). This test pins the draft and the verify step, so a
            # probe's slow spell earns one rerun.
            p, out = spec_suite(tmp_path / f"{name}-again", "--levels", "1", *args, profile="cpu-llamacpp-spec")
        return p, out

    p, out = llama("healthy")
    assert_suite_passed(p.returncode, p.stdout)
    [run] = (tmp_path / "healthy" / "reports" / "runs").glob("*.json")
    c1 = json.loads(run.read_text())["configs"]["draft3"]["levels"]["1"]
    # 32 tokens, all drafts accepted: the prompt's pass gives 1, then passes of 4 (3 accepted + the target's own):
    # 9 passes, 3.56 a pass; a rare draft the target computes otherwise takes a little off
    assert 3.3 < c1["acceptance_length"] <= round(32 / 9, 4), c1  # the run file keeps 4 decimals
    # the server's counters move when a request ends, as its output count does: within its 2% agreement
    assert abs(c1["acceptance_length"] / c1["server_accept_length"] - 1) < 0.02, "the client's is the server's"
    bfile = tmp_path / "baseline.json"
    for metric in ("sustained_output_tps", "acceptance_length"):
        subprocess.run([sys.executable, "-m", "sglperf", "baseline", "update", "--from", str(run), "--metric", metric,
                        "--file", str(bfile)], check=True, capture_output=True)
    worse = llamacpp_build.make_model(seed=1)
    p, out = llama("draft", "--baseline-file", str(bfile), "--server-arg=--model-draft", f"--server-arg={worse}")
    assert p.returncode == 1, out[-3000:]
    assert "THROUGHPUT REGRESSION: cpu-llamacpp-spec/draft3 c1: sustained_output_tps" in out, out[-3000:]
    assert "ACCEPTANCE REGRESSION: cpu-llamacpp-spec/draft3 c1: acceptance_length" in out
    assert ": the draft's share" in out and "the verify step slowed" not in out

    slower = llamacpp_build.make_model(idle_layers=24)
    p, out = llama("verify", "--baseline-file", str(bfile), "--model-path", str(slower))
    assert p.returncode == 1, out[-3000:]
    assert "THROUGHPUT REGRESSION: cpu-llamacpp-spec/draft3 c1: sustained_output_tps" in out, out[-3000:]
    assert "acceptance unchanged" in out and "the verify step slowed" in out
    assert "disagree on how many tokens were streamed" not in out, "counted by its finished requests while it drafts"
    assert "ACCEPTANCE REGRESSION: cpu-llamacpp-spec/draft3 c1: acceptance_length" not in out


SPEC_FLAGS = ["--enable-metrics", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--sim-accept-length", "2.6",
              "--max-running-requests", "24"]


@pytest.mark.parametrize("scale,valid", [(1.0, True), (1 / 1.08, False), (1.08, False)],
                         ids=["honest", "client-over-counts-1.08x", "server-over-counts-1.08x"])
def test_while_drafting_the_count_is_checked_on_the_requests_that_finished_and_an_8_percent_gap_is_invalid(
        tmp_path, start_sim, scale, valid):
    """While it drafts, SGLang counts a request's tokens when it finishes. The check compares that counter with the
    tokens of the requests the client saw finish between the two scrapes that bound the window: an honest server
    reads 1.000, and one whose counter is 8% off either way is INVALID (the old allowance, a cohort of requests in
    flight at each edge, was +/-7-10% on 3-4 s windows and let 1.08x pass). The counter is rescaled by a loopback
    proxy in front of the simulator; 8-s levels."""
    from sglperf.run.launch import LaunchSpec, launch

    sim = start_sim(*SPEC_FLAGS)
    proxy = launch(LaunchSpec(name="hostile", argv=[sys.executable, str(ROOT / "tests" / "hostile_proxy.py"),
                                                    "--upstream", sim.url, "--scale",
                                                    f"sglang:generation_tokens_total={scale!r}"],
                              log_dir=tmp_path / "logs", launch_timeout_s=30, terminate_timeout_s=5))
    try:
        p, out = spec_suite(tmp_path, "--server-url", proxy.url, "--levels", "16", "--level-max-seconds", "8",
                            "-k", "matches_server_count")
    finally:
        proxy.stop()
    run = json.loads(next((tmp_path / "reports" / "runs").glob("*.json")).read_text())
    lv = next(iter(run["configs"].values()))["levels"]["16"]
    assert lv["server_count_at_completion"] is True
    # off by no more than the tokens finished within the bounding scrapes' timing (a loaded host widens it)
    assert abs(lv["server_ratio"] * scale - 1) <= lv["client_completed_edge_share"] + 0.01, lv
    if valid:
        assert p.returncode == 0, out[-3000:]
    else:
        assert p.returncode == 1 and "disagree on how many tokens were streamed" in out, out[-3000:]
        assert "in the requests that finished" in out


def test_a_level_whose_finished_requests_near_its_scrapes_exceed_the_count_tolerance_does_not_stop_yet():
    """On a loaded host a 4-s window of the drafting simulator had 10% of its finished tokens within the bounding
    scrapes' timing: the check allowed 12% and an 8% over-count passed. A level may stop (converged or decided) only
    once that share is at most the count's tolerance; a per-token counter is not held back."""
    import dataclasses
    from sglperf.measure.level import LevelSpec, trusted
    from sglperf.measure.metrics import MeasurementPolicy
    from .rundocs import result

    policy = MeasurementPolicy(server_agreement=0.02, min_completions=1)
    base = dataclasses.replace(result(16, value=2266.0, ci=40.0), window_s=4.0, lifetime_s=0.2,
                               completed_in_window=260,
                               server_count_at_completion=True)
    spec = LevelSpec(concurrency=16)
    assert not trusted(dataclasses.replace(base, client_completed_edge_share=0.10), 8.0, spec, policy)
    assert trusted(dataclasses.replace(base, client_completed_edge_share=0.015), 8.0, spec, policy)
    assert trusted(dataclasses.replace(base, server_count_at_completion=False, client_completed_edge_share=None),
                   8.0, spec, policy)


def test_a_cohort_finishing_inside_a_bounding_scrapes_round_trip_is_the_counts_allowance():
    """Between scrapes at 1.0 s and 5.0 s (each read somewhere inside a 20-ms round trip), 20 requests of 32 tokens
    finish at 2-4 s and 4 more at 5.005 s, inside the second scrape's round trip: the server may have counted them or
    not, so they are the allowance (4 x 32 tokens against the 20 x 32 the client saw finish between: 20%); 4 at
    5.5 s are outside both."""
    from sglperf.measure.metrics import completion_count

    done = [RequestRecord(i, 0.0, 2.0 + i * 0.1, 32, 32, server_completion_tokens=32) for i in range(20)]
    done += [RequestRecord(20 + i, 0.0, end, 32, 32, server_completion_tokens=32)
             for i, end in enumerate([5.005] * 4 + [5.5] * 4)]
    scrapes = [ServerSample(time=1.0, output_tokens_total=1000.0, time_uncertainty_s=0.01),
               ServerSample(time=5.0, output_tokens_total=1000.0 + 20 * 32, time_uncertainty_s=0.01)]
    c = completion_count(done, scrapes, (1.0, 5.0), lag_p99_ms=0.0)
    assert c is not None
    assert (c.client_tps, c.server_tps) == (20 * 32 / 4.0, 20 * 32 / 4.0)
    assert c.edge_share == pytest.approx(4 / 20)


def test_a_cohort_the_server_counted_just_before_a_scrape_is_not_read_on_the_wrong_side_of_it():
    """A closed loop's 16 requests finish together, each cohort reaching the client 40 ms after the server counted it,
    longer than the scrape's 10 ms round trip says. A window opening at 1.5 s, just after the server counted the
    cohort the client sees at 1.51 s: bounded by its first scrape, the client would count one cohort the server had
    counted before it (the CI host's ratio 1.0588 = 18/17); the count is bounded by scrapes between cohorts and
    agrees exactly."""
    from sglperf.measure.metrics import completion_count

    seen = [1.51 + k for k in range(4)]  # cohorts of 16 x 32 tokens, as the client saw them finish
    done = [RequestRecord(16 * k + i, 0.0, end, 32, 32, server_completion_tokens=32)
            for k, end in enumerate(seen) for i in range(16)]
    times = [1.5 + 0.25 * i for i in range(15)]
    scrapes = [ServerSample(time=t, output_tokens_total=1000.0 + 16 * 32 * sum(1 for e in seen if e - 0.04 <= t),
                            time_uncertainty_s=0.01) for t in times]
    c = completion_count(done, scrapes, (1.5, 5.0), lag_p99_ms=0.0)
    assert c is not None and c.client_tps == c.server_tps and c.edge_share == 0.0


def test_a_request_the_server_counted_before_a_scrape_but_delivered_after_it_is_in_the_allowance():
    """Each request's own client TTFT less the server's says its tokens take up to 50 ms to arrive: one that the
    client saw finish 30 ms after the window's last scrape (outside that scrape's 10-ms round trip) may have been
    counted by the server before it, so its tokens are the allowance (1 of the 20 the client saw finish between)."""
    from sglperf.measure.metrics import completion_count

    def req(i, end):
        return RequestRecord(i, end - 1.0, end, 32, 32, chunk_times=(end - 0.9, end), chunk_tokens=(1, 31),
                             server_completion_tokens=32, server_ttft_s=0.05)

    done = [req(i, 2.0 + i * 0.1) for i in range(20)] + [req(20, 5.03)]
    scrapes = [ServerSample(time=1.0, output_tokens_total=0.0, time_uncertainty_s=0.01),
               ServerSample(time=5.0, output_tokens_total=21 * 32.0, time_uncertainty_s=0.01)]
    c = completion_count(done, scrapes, (1.0, 5.0), lag_p99_ms=0.0)
    assert c is not None and c.client_tps / c.server_tps == pytest.approx(20 / 21)
    assert c.edge_share == pytest.approx(1 / 20)
