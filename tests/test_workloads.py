"""Workloads beyond random prompts: a shared prefix (bench_serving's generated-shared-prefix) whose prompts a prefix
cache can serve, measured per level as the share of prompt tokens the server took from cache, and judged apart from
throughput (a cache turned off can leave throughput inside its floor)."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sglperf.decide.floor import other_workload
from sglperf.measure.workload_metrics import open_loop, prefix_cache
from sglperf.measure.validity import check_prompt_lengths
from sglperf.measure.prompts import PromptMaker, SharedPrefix
from sglperf.measure.wire import NATIVE, by_name
from sglperf.records import Rate, RequestRecord, ServerSample, Shape, level_name
from sglperf.report.allure import perf_entries
from sglperf.report.html import GROUPS, KINDS
from sglperf.run import profiles
from sglperf.store.history import record_from_run
from sglperf.store.rundoc import load_run
from sglperf.sim.radix import RadixCache

from .conftest import user_env
from .test_faults import ROOT

SHAPE = Shape()


def test_shared_prefix_prompts_share_their_groups_prefix_exactly_and_nothing_more():
    maker = PromptMaker("ids", 128, seed=0, low=100, high=32000, prefix=SharedPrefix(groups=4, tokens=96))
    prompts = [maker.make(s, i).ids for s in range(4) for i in range(50)]
    assert all(len(p) == 128 for p in prompts)
    heads = {tuple(p[:96]) for p in prompts}
    assert len(heads) == 4, "four groups, four system prompts"
    for a in prompts[:20]:
        for b in prompts[20:40]:
            shared = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), 128)
            # one group: exactly its prefix, the questions differ from their first token; two groups: less
            assert shared == 96 if a[:96] == b[:96] else shared < 96
    assert maker.make(2, 7).ids == PromptMaker("ids", 128, seed=0, low=100, high=32000,
                                               prefix=SharedPrefix(4, 96)).make(2, 7).ids, "seeded"


@pytest.mark.parametrize("workload, words", [
    ({"kind": "shared_prefix", "prefix_groups": 4}, "needs prefix_groups and prefix_tokens"),
    ({"kind": "shared_prefix", "prefix_groups": 4, "prefix_tokens": 128}, "must be below isl (128)"),
    ({"prefix_groups": 4, "prefix_tokens": 64}, "are for kind = \"shared_prefix\""),
    ({"kind": "zipf"}, "kind"),
    ({"kind": "multi_turn", "turns": 4}, "needs turns and turn_tokens"),
    ({"kind": "multi_turn", "turns": 4, "turn_tokens": 32, "prompt_format": "text"}, "prompt_format \"ids\""),
    ({"turns": 4, "turn_tokens": 32}, "are for kind = \"multi_turn\""),
    ({"kind": "multi_turn", "turns": 1, "turn_tokens": 32}, "turns"),
    ({"kind": "multi_turn", "turns": 256, "turn_tokens": 9_000_000}, "past any context window"),
])
def test_a_workload_that_cannot_be_made_is_refused_naming_the_key(workload, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        profiles.WorkloadSection(isl=128, osl=32, **workload)


def test_the_workload_is_described_in_the_fingerprint_and_a_baseline_of_another_never_judges():
    w = profiles.WorkloadSection(isl=128, osl=32, kind="shared_prefix", prefix_groups=8, prefix_tokens=96)
    assert w.describe() == "shared_prefix 128/32: 8 groups x 96-token prefix"
    assert w.client_workload().cache_allowed == 0.75
    assert profiles.WorkloadSection(isl=32, osl=32).client_workload().cache_allowed is None
    entry = SimpleNamespace(fingerprint={"workload": "random 128/32"})
    assert "under the workload random 128/32, this run under shared_prefix" in other_workload(
        [entry], {"workload": w.describe()})
    assert other_workload([SimpleNamespace(fingerprint={})], {"workload": w.describe()}) is None, "older baselines"


def rec(i, prompt, cached, end=5.0):
    return RequestRecord(i, 0.0, end, prompt, 32, (1.0,), (32,), prompt, 32, "length", server_cached_tokens=cached)


def test_a_levels_cache_share_is_its_windows_cached_prompt_tokens_over_its_prompt_tokens_with_an_interval():
    done = [rec(i, 128, 96 if i % 4 else 0) for i in range(40)] + [rec(99, 128, 128, end=50.0)]
    gauge = [ServerSample(2.0, cache_hit_rate=0.7), ServerSample(3.0, cache_hit_rate=0.5)]
    out = prefix_cache(done, (1.0, 10.0), gauge, 0.75)
    assert out["prefix_cache_share"] == pytest.approx(0.75 * 30 / 40)
    assert 0 < out["prefix_cache_share_ci95"] < 0.15
    assert out["prefix_cache_allowed"] == 0.75 and out["server_cache_hit_rate"] == 0.6
    assert prefix_cache(done, (1.0, 10.0), [], None) == {}, "a random workload records nothing"
    assert "prefix_cache_share" not in prefix_cache([rec(0, 128, None)], None, [], 0.75), "a server that says nothing"


def test_cached_tokens_are_read_from_sglangs_meta_info_and_openais_usage_details():
    from sglperf.measure.client import _Progress

    p = _Progress(0, 0.0, 128, 32)
    NATIVE.chunk({"meta_info": {"finish_reason": {"type": "length"}, "prompt_tokens": 128, "completion_tokens": 32,
                                "cached_tokens": 96}}, p, 0)
    assert p.cached == 96
    q = _Progress(0, 0.0, 128, 32)
    by_name("openai").chunk({"choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": 32,
                                                      "prompt_tokens_details": {"cached_tokens": 64}}}, q, 0)
    assert q.cached == 64
    r = _Progress(0, 0.0, 128, 32)
    NATIVE.chunk({"meta_info": {"finish_reason": {"type": "length"}, "cached_tokens": "96"}}, r, 0)
    assert r.cached is None, "not a count: not believed"


def test_the_simulators_prefix_cache_serves_a_shared_prefix_and_nothing_when_disabled_or_flushed():
    cache = RadixCache(1000)
    assert cache.admit([1, 2, 3, 4, 5]) == 0
    assert cache.admit([1, 2, 3, 9, 9]) == 3
    assert cache.admit([1, 2, 3, 4, 5]) == 4, "the last prompt token is always computed"
    cache.flush()
    assert cache.admit([1, 2, 3, 4, 5]) == 0
    assert RadixCache(1000, enabled=False).admit([1, 2]) == 0
    small = RadixCache(4)
    small.admit([1, 2, 3, 4])
    small.admit([5, 6, 7, 8])
    assert small.admit([1, 2, 3, 4]) == 0, "least recently used out first"


def prefix_suite(tmp_path, *args):
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-rs", "-p", "no:randomly", "--profile",
                        "sim-prefix", "--reports-dir", str(tmp_path / "reports"), *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=user_env())
    return p, p.stdout + p.stderr


def test_a_shared_prefix_run_judges_its_cache_and_a_disabled_radix_cache_fails_in_its_own_category(tmp_path):
    p, out = prefix_suite(tmp_path, "--levels", "12")
    assert p.returncode == 0, out[-3000:]
    assert "test_prefix_cache" not in out or "FAILED" not in out
    run = json.loads(next((tmp_path / "reports" / "runs").glob("*.json")).read_text())
    level = run["configs"]["radix"]["levels"]["12"]
    assert level["prefix_cache_allowed"] == 0.75 and 0.6 < level["prefix_cache_share"] <= 0.75
    assert run["fingerprint"]["workload"] == "shared_prefix 128/32: 8 groups x 96-token prefix"
    # a trend of its own in the report, in its own chart group; a history point like throughput's
    doc = load_run(next((tmp_path / "reports" / "runs").glob("*.json")))
    (point,) = [e for e in perf_entries([doc]) if e["key"] == "prefix_cache.sim-prefix.radix.c12"]
    assert point["value"] == round(level["prefix_cache_share"], 3)
    assert KINDS["prefix_cache"][3] == "prefix_cache" and "prefix_cache" in GROUPS
    assert record_from_run(doc).levels[0].prefix_cache_share == level["prefix_cache_share"]
    p, out = prefix_suite(tmp_path / "off", "--levels", "12", "--server-arg=--disable-radix-cache")
    assert p.returncode == 1, out[-3000:]
    assert ("PREFIX CACHE REGRESSION: sim-prefix/radix c12: 0.000 ± 0.000 of prompt tokens served from the prefix "
            "cache, the workload allows 0.750") in out
    assert "THROUGHPUT REGRESSION" not in out, "throughput alone would not have seen it"


def test_a_random_workloads_run_has_no_prefix_cache_items(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "--collect-only", "-q", "-m", "sim", "--profile",
                        "sim-ci"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
    assert p.returncode == 0 and "test_prefix_cache" not in p.stdout, p.stdout[-2000:]


def test_bench_sends_a_shared_prefix_and_prints_the_cache_share_beside_what_it_allows(start_sim, tmp_path):
    srv = start_sim("--enable-metrics")
    out_json = tmp_path / "run.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "8", "--isl", "128",
                        "--osl", "32", "--shared-prefix", "8,96", "--ci-target", "0.05", "--max-seconds", "20",
                        "--json", str(out_json)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cache/allowed" in p.stdout and "/0.750" in p.stdout
    (level,) = json.loads(out_json.read_text())["configs"]["bench"]["levels"].values()
    assert 0.6 < level["prefix_cache_share"] <= 0.75
    bad = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--isl", "64",
                          "--shared-prefix", "8,64"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--shared-prefix 8,64: the prefix must be shorter than --isl 64" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--shared-prefix", "8"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected GROUPS,TOKENS" in bad.stderr
    mix = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "8", "--isl",
                          "64", "--osl", "32", "--length-mix", "0.6,256,128", "--ci-target", "0.05", "--max-seconds",
                          "15", "--records", str(tmp_path / "mix.jsonl")], capture_output=True, text=True, timeout=120)
    assert mix.returncode == 0, mix.stdout + mix.stderr
    rows = [json.loads(x) for x in (tmp_path / "mix.jsonl").read_text().splitlines()]
    assert len({r["prompt_tokens"] for r in rows}) > 10 and len({r["max_tokens"] for r in rows}) > 10
    assert all(r["server_prompt_tokens"] == r["prompt_tokens"] for r in rows if r["server_prompt_tokens"])


def test_a_length_mix_draws_each_requests_lengths_log_normal_around_the_medians_clipped_and_seeded():
    w = profiles.WorkloadSection(isl=64, osl=32, kind="length_mix", length_sigma=0.6, isl_max=256, osl_max=128)
    assert w.describe() == "length_mix 64/32: log-normal sigma 0.6, clipped at 256/128"
    client = w.client_workload()
    drawn = [client.prompt(s, i) for s in range(4) for i in range(500)]
    isl = sorted(p.tokens for p in drawn)
    osl = sorted(p.max_tokens for p in drawn)
    assert all(len(p.ids) == p.tokens for p in drawn), "every prompt exactly the length it claims"
    assert 58 <= isl[len(isl) // 2] <= 70 and 29 <= osl[len(osl) // 2] <= 35, "around the medians"
    assert isl[-1] <= 256 and osl[-1] <= 128 and isl[0] >= 1 and isl[-1] > 170, "clipped, with a tail"
    assert client.prompt(3, 7) == w.client_workload().prompt(3, 7), "seeded"
    body = NATIVE.body(client.prompt(0, 1), client, None, SHAPE)
    assert body["sampling_params"]["max_new_tokens"] == client.prompt(0, 1).max_tokens
    openai = by_name("openai").body(client.prompt(0, 1), client, "m", SHAPE)
    assert openai["max_tokens"] == client.prompt(0, 1).max_tokens
    isl_mean, osl_mean, tail = w.kv_basis()
    assert (isl_mean, osl_mean) == (75, 37) and tail > isl_mean + osl_mean, "the ceiling from the mean, the tail named"


@pytest.mark.parametrize("workload, words", [
    ({"kind": "length_mix", "length_sigma": 0.5}, "needs length_sigma, isl_max and osl_max"),
    ({"kind": "length_mix", "length_sigma": 0.5, "isl_max": 32, "osl_max": 64}, "must be at least the medians"),
    ({"length_sigma": 0.5}, "are for kind = \"length_mix\""),
])
def test_a_length_mix_that_cannot_be_drawn_is_refused_naming_the_key(workload, words):
    with pytest.raises(ValueError, match=words):
        profiles.WorkloadSection(isl=64, osl=32, **workload)


def test_each_requests_prompt_is_checked_against_the_servers_count_of_it():
    ok = [rec(i, 60 + i, None) for i in range(5)]
    assert check_prompt_lengths(ok, 64, "exact") is None, "each its own length, each counted right"
    off = [*ok, RequestRecord(9, 0.0, 5.0, 66, 32, (1.0,), (32,), 67, 32, "length")]
    assert check_prompt_lengths(off, 64, "exact") == (
        "the server counted 67 prompt tokens for a 66-token prompt (1 of 6 requests): the prompts are not the length "
        "the level claims")


def test_a_length_mix_run_is_valid_names_its_ceilings_basis_and_a_slower_prefill_fails(tmp_path):
    def mix_suite(reports, *args):
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "--profile",
                            "sim-mix", "--levels", "12", "--reports-dir", str(reports), *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env=user_env())
        return p, p.stdout + p.stderr

    p, out = mix_suite(tmp_path / "a", "-k", "request_health or client_matches")
    assert p.returncode == 0, out[-3000:]
    run = json.loads(next((tmp_path / "a" / "runs").glob("*.json")).read_text())
    assert run["configs"]["rr16"]["server"]["ceiling"]["basis"].startswith(
        "the length mix's mean request, 75 + 37 tokens; at its 90th percentile")
    assert run["configs"]["rr16"]["levels"]["12"]["valid"]
    p, out = mix_suite(tmp_path / "b", "--server-arg=--prefill-slowdown=2")
    assert p.returncode == 1, out[-3000:]
    assert "LATENCY REGRESSION: sim-mix/rr16 c12: server_ttft_mean_ms" in out


def test_an_open_loop_level_says_where_the_server_fell_behind_the_offered_rate():
    """10 req/s offered for 100 s: 1,000 completions are the server keeping up; 600 are 12.6 standard deviations of
    the Poisson arrivals short, the server saturating at about 6 req/s."""
    def level(done):
        return [RequestRecord(i, i * 0.1, i * 0.1 + (0.05 if i < done else 500.0), 32, 32, (1.0,), (32,), 32, 32,
                              "length") for i in range(1001)]
    kept = open_loop(level(1000), 10.0, 0.0)
    assert kept == {"offered_rps": 10.0, "sent_rps": 10.0, "achieved_rps": 10.0, "saturation": None}
    behind = open_loop(level(600), 10.0, 37.5)
    assert behind["achieved_rps"] == 6.0
    assert behind["saturation"] == ("offered 10 req/s, the client sent 10.00, the server completed 6.00 in the window "
                                    "(12.6 standard deviations of the arrivals short): the server saturated at about "
                                    "6.00 req/s; the server's queue held 37.5 requests on average")
    assert open_loop(level(1000), None, None) == {}, "a closed-loop level records none of it"


def test_a_profiles_ladder_is_concurrencies_or_offered_rates_never_both_and_messages_name_each(tmp_path):
    rate = profiles.load("sim-rate")
    assert rate.levels == [20, 40] and all(isinstance(lv, Rate) for lv in rate.levels)
    assert [level_name(lv) for lv in rate.levels] == ["r20", "r40"]
    assert [level_name(lv) for lv in rate.ladder(["30"])] == ["r30"], "--levels is read as the profile's kind"
    closed = profiles.load("sim-ci")
    assert [level_name(lv) for lv in closed.ladder([8])] == ["c8"]
    text = (profiles.PROFILE_DIR / "sim-rate.toml").read_text()
    for ladder, words in (("rates = [20, 40]\nlevels = [8]", "exactly one of them"), ("rates = []", "exactly one of "
                          "them"), ("rates = [0, 20]", "rates: .*must be positive")):
        bad = tmp_path / "ladder.toml"
        bad.write_text(text.replace("rates = [20, 40]", ladder))
        with pytest.raises(profiles.ProfileError, match=words):
            profiles.load(str(bad))


def test_an_open_loop_profile_runs_its_rates_and_a_server_saturating_below_them_fails_saying_where(tmp_path):
    """sim-rate offers 20 and 40 req/s; its baseline gates throughput and latency at each. Capped at 4 running
    requests the simulator completes about 16 req/s: the floor fails as THROUGHPUT REGRESSION, its message saying
    the server saturated and where, not that the client fell behind."""
    def rate_suite(reports, *args):
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-rfs", "-p", "no:randomly",
                            "--profile", "sim-rate", "--reports-dir", str(reports), *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=400, env=user_env())
        return p, p.stdout + p.stderr

    p, out = rate_suite(tmp_path / "a", "--levels", "40", "-k", "floor or request_health")
    assert p.returncode == 0, out[-3000:]
    assert "sim-rate/rr24 r40: sustained" in out
    run = json.loads(next((tmp_path / "a" / "runs").glob("*.json")).read_text())
    level = run["configs"]["rr24"]["levels"]["40"]
    assert (level["concurrency"], level["offered_rps"], level["saturation"]) == (None, 40.0, None)
    assert abs(level["achieved_rps"] / 40 - 1) < 0.1
    doc = load_run(next((tmp_path / "a" / "runs").glob("*.json")))
    assert "throughput.sim-rate.rr24.r40" in {e["key"] for e in perf_entries([doc])}, "its Allure trend names r40"
    assert record_from_run(doc).open_loop, "its history line keeps the ladder's kind"
    p, out = rate_suite(tmp_path / "b", "--levels", "20", "-k", "floor", "--server-arg=--max-running-requests=4")
    assert p.returncode == 1, out[-3000:]
    assert "FAILED perf_tests/test_levels.py::test_sustained_throughput_floor[sim-rate/rr24/r20]" in out
    line = next(ln for ln in out.splitlines() if "THROUGHPUT REGRESSION: sim-rate/rr24 r20: sustained_output_tps" in ln)
    assert "offered 20 req/s" in line and "the server saturated at about" in line, line


def test_a_conversation_is_described_and_its_kv_basis_holds_its_longest_turn():
    w = profiles.WorkloadSection(isl=128, osl=32, kind="multi_turn", turns=6, turn_tokens=32)
    assert w.describe() == "multi_turn 128/32: 6 turns of 32 new tokens, think 0 s"
    assert w.kv_basis() == (128 + 5 * 64 // 2, 32, 128 + 5 * 64 + 32)


def test_each_turn_sends_the_whole_history_and_the_simulators_cache_serves_it_all_but_when_disabled(start_sim):
    """Against the simulator: turn t's prompt is turn t-1's prompt, its reply's ids as the server produced them, and
    turn_tokens new ids; the server served exactly the history from its prefix cache, and nothing with the cache
    off. Its records carry turn and history, which the level's prefix claim and its by-turn table read."""
    import asyncio

    from sglperf.measure.client import LoadGenerator, Target, Workload
    from sglperf.measure.prompts import MultiTurn
    from sglperf.measure.workload_metrics import by_turn

    def talk(srv) -> list[RequestRecord]:
        async def go():
            w = Workload(64, 16, vocab_low=100, vocab_high=32000, multi_turn=MultiTurn(4, 8))
            async with LoadGenerator(Target.for_engine(srv.url, __import__("sglperf.engines").engines.get("sim")),
                                     w) as gen:
                stop = asyncio.Event()
                task = asyncio.create_task(gen.closed_loop(2, stop))
                while sum(r.turn == 3 for r in gen.records) < 2:
                    await asyncio.sleep(0.05)
                stop.set()
                await task
                return gen.records
        return asyncio.run(asyncio.wait_for(go(), 60))

    recs = talk(start_sim("--enable-metrics"))
    first = [r for r in recs if r.index % 2 == 0 and r.ok]  # user 0's first conversation, turn by turn
    assert [r.turn for r in first[:4]] == [0, 1, 2, 3]
    for before, after in zip(first, first[1:4]):
        assert after.history_tokens == before.prompt_tokens + 16 and after.prompt_tokens == after.history_tokens + 8
        assert after.server_cached_tokens == after.history_tokens
    table = by_turn(recs, None)
    assert table["0"]["cache_share"] == 0.0 and table["3"]["cache_share"] == table["3"]["cache_allowed"] > 0.8
    off = talk(start_sim("--enable-metrics", "--disable-radix-cache", name="off"))
    assert all(r.server_cached_tokens == 0 for r in off if r.ok)


def test_a_conversation_needs_the_replies_ids():
    from sglperf.measure.client import LoadGenerator, Target, Workload
    from sglperf.measure.prompts import MultiTurn
    from sglperf.categories import UsageError
    from sglperf import engines

    w = Workload(64, 16, multi_turn=MultiTurn(4, 8))
    with pytest.raises(UsageError, match="needs SGLang's native /generate"):
        LoadGenerator(Target.for_engine("http://127.0.0.1:1", engines.get("sglang"), api="openai"), w)


def test_a_conversation_run_prints_its_turns_and_a_disabled_radix_cache_fails_as_a_prefix_cache_regression(tmp_path):
    def suite(where, *args):
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
                            "--profile", "sim-agentic", "--levels", "4", "--reports-dir", str(where), *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=300, env=user_env())
        return p, p.stdout + p.stderr

    p, out = suite(tmp_path / "on")
    assert p.returncode == 0, out[-3000:]
    assert "turn  requests  prompt  TTFT p50/p90 ms  TPOT p50 ms  cached / allowed" in out
    run = json.loads(next((tmp_path / "on" / "runs").glob("*.json")).read_text())
    level = run["configs"]["radix"]["levels"]["4"]
    assert level["valid"] and set(level["by_turn"]) == {"0", "1", "2", "3", "4", "5"}
    assert 0.8 < level["prefix_cache_share"] <= level["prefix_cache_allowed"]
    assert run["fingerprint"]["workload"] == "multi_turn 128/32: 6 turns of 32 new tokens, think 0 s"
    (line,) = [json.loads(x) for x in (tmp_path / "on" / "history.jsonl").read_text().splitlines()]
    assert line["levels"][0]["by_turn"] == level["by_turn"], "the history keeps the table by turn"
    p, out = suite(tmp_path / "off", "--server-arg=--disable-radix-cache")
    assert p.returncode == 1, out[-3000:]
    assert "PREFIX CACHE REGRESSION: sim-agentic/radix c4: 0.000 ± 0.000 of prompt tokens served" in out
    assert "each conversation's history is recomputed" in out


def test_the_simulator_at_8k_in_1k_out_plateaus_on_its_kv_pool_and_decode_slows_with_the_context(tmp_path):
    """sim-long (the ci-long preset: 73,728 tokens of KV, 8 requests of 8,192 + 1,024): past 8 the running count stays
    at 8 and throughput flat (the KV plateau passes, attributed to the pool); TPOT grows from c4 to c8 as the decode
    step reads more context."""
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim_long",
                        "-k", "plateau or sustained or request_health", "--reports-dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=user_env())
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    run = json.loads(next((tmp_path / "runs").glob("*.json")).read_text())
    c = run["configs"]["rr16"]
    assert c["plateau"]["passed"] and c["plateau"]["attributed_to"] == "kv", c["plateau"]
    lv = c["levels"]
    assert all(lv[k]["server_max_running"] <= 8.5 for k in ("12", "16"))
    assert lv["8"]["tpot_ms"]["median"] > 1.2 * lv["4"]["tpot_ms"]["median"]
