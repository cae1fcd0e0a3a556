"""Invariants of the simulated scheduler (pure engine, simulated time)."""

import pytest

from sglperf.sim.calibrate import closed_loop, engine_config
from sglperf.engines.sglang import predict_ceiling
from sglperf.sim.engine import Engine, EngineConfig, QueueFull
from sglperf.sim.presets import CI, GLM5_RTXPRO6000_TP8


def ci_config(**kw) -> EngineConfig:
    base = dict(max_total_num_tokens=3072, page_size=16, max_running_requests=64, chunked_prefill_size=2048,
                max_prefill_tokens=4096, num_continuous_decode_steps=1, context_len=4096, step_time=CI.step_time)
    base.update(kw)
    return EngineConfig(**base)


def drive(eng: Engine, n: int, isl: int, osl: int, *, concurrency: int, max_steps: int = 200_000, check=None):
    """Closed loop in simulated time; returns {rid: [output_len after each event]} and finish order."""
    seen: dict[str, list[int]] = {}
    submitted = 0
    finished = []
    for _ in range(min(concurrency, n)):
        eng.add_request(f"r{submitted}", isl, osl)
        submitted += 1
    for _ in range(max_steps):
        step = eng.step()
        if step is None:
            break
        if check:
            check(eng, step)
        for ev in step.events:
            seen.setdefault(ev.rid, []).append(ev.output_len)
            if ev.finished:
                finished.append(ev.rid)
                if submitted < n:
                    eng.add_request(f"r{submitted}", isl, osl)
                    submitted += 1
    return seen, finished


def test_running_requests_never_exceed_the_admission_cap():
    eng = Engine(ci_config(max_running_requests=24))
    peak = []
    drive(eng, 300, 32, 32, concurrency=100, check=lambda e, s: peak.append(len(e.running)))
    assert max(peak) == 24


def test_kv_use_never_exceeds_the_pool_even_with_optimistic_admission():
    cfg = ci_config(init_new_token_ratio=0.3, min_new_token_ratio=0.1, new_token_ratio_decay=0.01)
    eng = Engine(cfg)

    def check(e, s):
        assert e.used_pages <= cfg.num_pages
        assert e.used_pages == sum(r.pages for r in e.running)
        for r in e.running:  # the last sampled token's KV is written by the next forward pass
            assert r.pages * cfg.page_size >= (r.seq_len - 1 if r.state == "running" else r.prefilled)

    drive(eng, 400, 32, 96, concurrency=200, check=check)
    assert eng.stats.retracted_requests > 0, "this configuration is meant to over-admit and retract"


def test_ignore_eos_requests_get_exactly_max_new_tokens_and_each_token_once():
    eng = Engine(ci_config(init_new_token_ratio=0.3, min_new_token_ratio=0.1, new_token_ratio_decay=0.01))
    seen, finished = drive(eng, 300, 32, 96, concurrency=150)
    assert len(finished) == 300
    for rid, lens in seen.items():
        assert lens == list(range(1, 97)), f"{rid} skipped or repeated a token"


def test_retracted_request_resumes_and_finishes_with_the_right_count():
    eng = Engine(ci_config(init_new_token_ratio=0.2, min_new_token_ratio=0.1, new_token_ratio_decay=0.01))
    retracted = set()

    def check(e, s):
        retracted.update(s.retracted)

    seen, finished = drive(eng, 200, 32, 128, concurrency=120, check=check)
    assert retracted, "expected retractions"
    for rid in retracted:
        assert rid in finished
        assert seen[rid][-1] == 128
        assert seen[rid] == sorted(set(seen[rid])), "output must only grow"


def test_admission_is_first_come_first_served():
    eng = Engine(ci_config(max_running_requests=8))
    for i in range(40):
        eng.add_request(f"r{i:02d}", 32, 8)
    first_tokens = []
    while (step := eng.step()) is not None:
        first_tokens += [ev.rid for ev in step.events if ev.output_len == 1]
    assert first_tokens == sorted(first_tokens)


def test_no_noise_means_identical_runs_and_noise_is_seeded():
    def run(cv, seed):
        return closed_loop(engine_config(CI, 64, 1, noise_cv=cv, seed=seed), 32, 32, 32, lifetimes=3).output_tps

    assert run(0.0, 1) == run(0.0, 2)
    assert run(0.05, 7) == run(0.05, 7)
    assert run(0.05, 7) != run(0.05, 8)


def test_slowdown_makes_every_step_take_one_over_factor_as_long():
    base, slow = Engine(ci_config()), Engine(ci_config(slowdown=0.85))
    for eng in (base, slow):
        for i in range(40):
            eng.add_request(f"r{i}", 32, 32)
    while (a := base.step()) is not None:
        b = slow.step()
        assert (a.kind, a.batch_size, len(a.events)) == (b.kind, b.batch_size, len(b.events))
        assert b.duration == pytest.approx(a.duration / 0.85, rel=1e-12)
    assert slow.step() is None


def test_chunked_prefill_splits_a_long_prompt():
    eng = Engine(ci_config(chunked_prefill_size=256, max_prefill_tokens=4096, max_total_num_tokens=8192))
    eng.add_request("long", 1000, 4)
    steps = []
    while (s := eng.step()) is not None:
        steps.append(s)
    prefills = [s for s in steps if s.kind == "prefill"]
    assert [s.new_tokens for s in prefills] == [256, 256, 256, 232]
    assert sum(len(s.events) for s in steps) == 4


def test_requests_the_server_cannot_hold_are_refused():
    eng = Engine(ci_config(max_queued_requests=2))
    with pytest.raises(ValueError, match="longer than the model's context length"):
        eng.add_request("x", 5000, 4)
    with pytest.raises(ValueError, match="exceeds the model's maximum context length"):
        eng.add_request("y", 4000, 200)
    eng.add_request("a", 8, 8)
    eng.add_request("b", 8, 8)
    with pytest.raises(QueueFull):
        eng.add_request("c", 8, 8)


def test_kv_ceiling_of_the_seed_system():
    assert predict_ceiling(GLM5_RTXPRO6000_TP8.kv_pool_tokens(None, None), 64, 128, 128, None).kv == 1935
    res = closed_loop(engine_config(GLM5_RTXPRO6000_TP8, 2048, 8), 3072, 128, 128, lifetimes=2,
                      warmup_lifetimes=1)
    assert res.max_running == 1935
