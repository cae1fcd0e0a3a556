"""Servers in the wild: a strict OpenAI-compatible server gets valid levels with text and chat prompts (bench and
suite); a server that refuses everything ends the level within seconds in its own words; --server-url against
broken servers fails within 15 s naming the cause, never "stalled"; a wrong prompt count invalidates the level."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from sglperf.run.launch import LaunchSpec, launch
from sglperf.measure.level import systematic_failure
from sglperf.records import FULL, RequestRecord, Shape
from sglperf.measure.wire import OPENAI

from .conftest import user_env
from .rundocs import bench_engine, bench_levels

ROOT = Path(__file__).resolve().parent.parent
STRICT = [sys.executable, str(ROOT / "tests" / "strict_server.py")]
ISL = OSL = 16


@pytest.fixture
def strict(tmp_path):
    servers = []

    def start(*flags):
        srv = launch(LaunchSpec("strict", [*STRICT, *flags], tmp_path / "logs", launch_timeout_s=30,
                                terminate_timeout_s=5, ready_path="/stats"))
        servers.append(srv)
        return srv

    yield start
    for s in servers:
        assert not s.stop().survivors


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """A word-level tokenizer: "w0".."w999", one token per whitespace-separated word, like the strict server."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(1000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def bench(url, *args, timeout=180):
    out = Path(f"/tmp/sglperf-bench-{time.monotonic_ns()}.json")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", url, "--isl", str(ISL), "--osl",
                        str(OSL), "--vocab-range", "1,1001", "--json", str(out), *args], capture_output=True, text=True,
                       timeout=timeout)
    doc = json.loads(out.read_text()) if out.exists() else None
    out.unlink(missing_ok=True)
    return p, doc, time.monotonic() - t0


@pytest.mark.parametrize("fmt", ["text", "chat"])
def test_a_strict_server_gets_valid_levels_with_text_and_chat_prompts(strict, word_tokenizer, fmt):
    srv = strict()
    p, doc, _ = bench(srv.url, "--prompt-format", fmt, "--tokenizer", str(word_tokenizer), "--levels", "2,4",
                      "--ci-target", "0.05", "--max-seconds", "30")
    assert p.returncode == 0, p.stdout + p.stderr
    eng = bench_engine(doc)
    assert eng["engine"] == "openai" and eng["detected"] and eng["prompt_format"] == fmt
    assert eng["wire"] == ("chat" if fmt == "chat" else "openai")
    said = " | ".join(eng["negotiated"])
    assert "ignore_eos refused" in said and "Unexpected fields in the request: {'ignore_eos'}" in said, said
    assert "min_tokens refused too" in said and "usage on every chunk refused" in said, said
    for lv in bench_levels(doc):
        assert lv["valid"] and lv["errors"] == {} and lv["count_source"] == "usage", lv["invalid_reasons"]


def test_the_suite_measures_a_strict_server_through_a_profile(strict, word_tokenizer, tmp_path):
    profile = tmp_path / "strict.toml"
    profile.write_text(f'''
name = "strict-openai"
engine = "openai"
marker = "sim"
levels = [2, 4]
[server]
command = ["{{python}}", "{ROOT / 'tests' / 'strict_server.py'}"]
launch_timeout_s = 30
terminate_timeout_s = 5
[workload]
isl = {ISL}
osl = {OSL}
vocab_low = 1
vocab_high = 1001
prompt_format = "text"
tokenizer = "{word_tokenizer}"
[measurement]
ci_target = 0.05
level_max_seconds = 30
stall_timeout_s = 10
[[configs]]
name = "default"
''')
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-rs", "-p", "no:randomly", "--profile",
                        str(profile), "--reports-dir", str(tmp_path / "reports")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=user_env())
    assert p.returncode == 0, p.stdout[-3000:]
    # request health at both levels and the output canary; floors skip (no baseline)
    assert "3 passed" in p.stdout, p.stdout[-2000:]
    doc = json.loads(next((tmp_path / "reports" / "runs").glob("*.json")).read_text())
    server = doc["configs"]["default"]["server"]
    assert server["engine"]["prompt_format"] == "text" and server["engine"]["negotiated"]
    assert all(lv["valid"] and not lv["errors"] for lv in doc["configs"]["default"]["levels"].values())


def test_a_server_that_refuses_everything_ends_the_level_within_seconds_in_its_own_words(strict):
    srv = strict("--mode", "refuse")
    p, doc, took = bench(srv.url, "--levels", "8", "--max-seconds", "120", "--engine", "openai")
    assert p.returncode == 1
    words = "model 'strict-model' is not loaded on this replica"
    assert words in p.stdout and "every request failed" in p.stdout, p.stdout
    lv = bench_levels(doc)[0]
    assert not lv["valid"] and words in lv["invalid_reasons"][0]
    assert lv["duration_s"] < 5, f"the level should stop at once, took {lv['duration_s']:.1f} s"
    assert took < 15
    sent = requests.get(srv.url + "/stats").json()["requests"]
    assert sent <= 300, f"{sent} requests sent to a server that refused every one"


def test_a_prompt_count_that_differs_from_isl_makes_the_level_invalid_naming_both(strict, word_tokenizer):
    srv = strict("--prompt-tokens-offset", "3")
    p, doc, _ = bench(srv.url, "--prompt-format", "text", "--tokenizer", str(word_tokenizer), "--levels", "2",
                      "--ci-target", "0.05", "--max-seconds", "10")
    assert p.returncode == 1
    reasons = " ".join(bench_levels(doc)[0]["invalid_reasons"])
    assert f"the server counted {ISL + 3} prompt tokens for a {ISL}-token prompt" in reasons, reasons


def test_token_ids_refused_without_a_tokenizer_is_a_usage_error_with_the_servers_words(strict):
    srv = strict()
    p, _, took = bench(srv.url, "--levels", "2", "--max-seconds", "10")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "refuses token-id prompts (HTTP 400: {\"detail\": \"prompt must be a string.\"})" in p.stderr
    assert "--tokenizer" in p.stderr and took < 15


# --server-url against what users point it at ------------------------------------------------------------------
def silent_listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)  # accepts connections, never answers
    return s


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("case,expect", [
    ("closed port", "connection refused at 127.0.0.1:"),
    ("silent listener", "no response within 5 s (the connection was accepted)"),
    ("http500", "answered HTTP 500: {\"detail\": \"Internal Server Error: the model worker is gone\"}"),
    ("non-sse", "HTTP 200 with Content-Type application/json, not an SSE stream"),
    ("bad-sse", "not JSON: b'{not json at all'"),
    ("wrong key", "answered HTTP 401: {\"error\": \"Unauthorized\"} (is SGLPERF_API_KEY set, and right?)"),
    ("refuse", "every request failed: HTTP 400: {\"detail\": \"model 'strict-model' is not loaded on this replica\"}"),
])
def test_server_url_failures_name_their_cause_within_15_s(case, expect, strict, start_sim, tmp_path):
    env = {}
    keep = None
    if case == "closed port":
        url = f"http://127.0.0.1:{closed_port()}"
    elif case == "silent listener":
        keep = silent_listener()
        url = f"http://127.0.0.1:{keep.getsockname()[1]}"
    elif case == "wrong key":
        url = start_sim("--api-key", "the-right-key").url
        env["SGLPERF_API_KEY"] = "a-wrong-key"
    else:
        url = strict("--mode", case).url
    # a server the suite knows nothing of is measured through a profile of engine openai (a sim profile against it
    # is refused up front: test_a_server_url_that_is_not_the_profiles_engine_is_refused)
    profile = ["--profile", str(openai_profile(tmp_path))] if case not in ("wrong key",) else ["-m", "sim"]
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", *profile,
                            "--server-url", url, "--levels", "8", "--reports-dir", str(tmp_path / "reports")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env(**env))
    finally:
        if keep:
            keep.close()
    took = time.monotonic() - t0
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-2000:]
    assert expect in out, out[-3000:]
    assert "stalled" not in out
    assert took < 15, f"{case}: took {took:.1f} s"


def openai_profile(tmp_path) -> Path:
    path = tmp_path / "any-openai.toml"
    path.write_text('''name = "any-openai"
engine = "openai"
marker = "sim"
levels = [8]
[server]
command = ["unused-with-server-url"]
[workload]
isl = 16
osl = 16
vocab_low = 1
vocab_high = 1001
[measurement]
level_max_seconds = 10
stall_timeout_s = 10
[[configs]]
name = "default"
''')
    return path


def test_a_server_url_that_is_not_the_profiles_engine_is_refused(strict, tmp_path):
    srv = strict()
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
                        "--server-url", srv.url, "--levels", "8", "--reports-dir", str(tmp_path / "reports")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-2000:]
    assert (f"USAGE ERROR: --server-url {srv.url} serves openai (detected from what it answers), but profile sim-ci "
            f"is for engine sim") in out, out[-3000:]


# the decisions, as pure functions ------------------------------------------------------------------------------
def rec(i, error=None, detail=None, status=None):
    return RequestRecord(i, i * 0.01, i * 0.01 + 0.005, 16, 16, error=error, error_detail=detail, http_status=status)


def test_fail_fast_needs_a_systematic_failure_not_one_error():
    refused = [rec(i, "http_status", "HTTP 422: Unexpected fields in the request: {'ignore_eos'}", 422)
               for i in range(16)]
    why = systematic_failure(refused, 64)
    assert why.startswith("stopped early: every request failed: HTTP 422: Unexpected fields")
    assert "hint: the server refuses ignore_eos" in why
    assert systematic_failure(refused[:5], 64) is None, "5 failures of 64 streams: not yet the first N"
    ok_then_one = [rec(0)] + refused[:1]
    assert systematic_failure(ok_then_one, 8) is None
    burst = [rec(i) for i in range(10)] + refused[:11]
    assert "11 of the last 20 requests failed" in systematic_failure(burst, 8)


def test_only_what_the_shape_allows_is_sent():
    from sglperf.measure.client import Workload
    from sglperf.measure.prompts import Prompt

    w = Workload(4, 8)
    full = OPENAI.body(Prompt(ids=[1, 2, 3, 4]), w, "m", FULL)
    assert full["ignore_eos"] is True and full["stream_options"]["continuous_usage_stats"] is True
    strict = OPENAI.body(Prompt(text="w1 w2 w3 w4"), w, "m",
                         Shape(ignore_eos=False, min_tokens=False, continuous_usage=False))
    assert "ignore_eos" not in strict and "min_tokens" not in strict and strict["stream_options"] == {
        "include_usage": True} and strict["prompt"] == "w1 w2 w3 w4"
    assert OPENAI.body(Prompt(ids=[1]), w, None, Shape(ignore_eos=False, min_tokens=True))["min_tokens"] == 8


def test_a_server_that_does_not_say_its_vocabulary_needs_a_range_or_a_tokenizer(strict, word_tokenizer, tmp_path):
    srv = strict()
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "does not say its model's vocabulary size: give --vocab-range LOW,HIGH" in p.stderr
    # with the model's tokenizer, its vocabulary gives the range
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "2", "--isl",
                        str(ISL), "--osl", str(OSL), "--prompt-format", "text", "--tokenizer", str(word_tokenizer),
                        "--max-seconds", "10", "--ci-target", "0.2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    vocab = json.loads(word_tokenizer.read_text())["model"]["vocab"]
    assert bench_engine(json.loads(out.read_text()))["vocab_range"] == [min(1000, len(vocab) // 4), len(vocab)], \
        p.stdout + p.stderr
