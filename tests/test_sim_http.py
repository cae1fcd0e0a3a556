"""The simulator's HTTP surface against a started process: shapes, framing, auth, exit codes, fault flags."""

import json
import subprocess
import sys
import time

import pytest
import requests

from sglperf.run.launch import LaunchError

GEN = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}


def sse_events(resp: requests.Response) -> list[str]:
    """The data payloads of an SSE response, checking the framing: 'data: ...' lines separated by blank lines."""
    raw = resp.content.decode()
    blocks = raw.split("\n\n")
    assert blocks[-1] == "", f"stream does not end with a blank line: {raw[-80:]!r}"
    out = []
    for b in blocks[:-1]:
        assert b.startswith("data: "), b
        out.append(b[len("data: "):])
    return out


def test_endpoints_answer_with_sglang_shapes(start_sim):
    srv = start_sim("--enable-metrics", "--max-running-requests", "24")
    u = srv.url
    assert requests.get(u + "/health").status_code == 200
    assert requests.get(u + "/health_generate").status_code == 200
    assert requests.get(u + "/ready").status_code == 200
    mi = requests.get(u + "/model_info").json()
    assert {"model_path", "served_model_name", "tokenizer_path", "is_generation", "architectures"} <= set(mi)
    si = requests.get(u + "/server_info").json()
    assert si["max_total_num_tokens"] == 3072
    assert si["internal_states"][0]["effective_max_running_requests_per_dp"] == 24
    assert si["max_running_requests"] == 24 and si["version"].startswith("0.5.23")
    models = requests.get(u + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == mi["served_model_name"]
    assert requests.get(u + "/v1/models/other").status_code == 404
    loads = requests.get(u + "/v1/loads").json()
    assert {"num_running_reqs", "num_waiting_reqs", "token_usage", "max_total_num_tokens"} <= set(loads["loads"][0])
    flush = requests.post(u + "/flush_cache")
    assert flush.status_code == 200 and flush.text.startswith("Cache flushed.")
    requests.post(u + "/generate", json=GEN).raise_for_status()
    text = requests.get(u + "/metrics").text
    for series in ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                   "sglang:max_total_num_tokens", "sglang:num_used_tokens", 'sglang:realtime_tokens_total{',
                   "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                   "sglang:num_retracted_requests_total", "sglang:time_to_first_token_seconds_bucket",
                   "sglang:e2e_request_latency_seconds_bucket"]:
        assert series in text, series
    assert 'mode="decode"' in text


def test_metrics_exist_only_with_enable_metrics(start_sim):
    srv = start_sim()
    assert requests.get(srv.url + "/metrics").status_code == 404


def test_generate_non_stream_and_stream_framing(start_sim):
    srv = start_sim()
    body = requests.post(srv.url + "/generate", json=GEN).json()
    assert len(body["output_ids"]) == 6 and body["meta_info"]["completion_tokens"] == 6
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert body["meta_info"]["prompt_tokens"] == 4 and "e2e_latency" in body["meta_info"]
    r = requests.post(srv.url + "/generate", json={**GEN, "stream": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in chunks), "cumulative ids"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_openai_completions_stream_and_usage(start_sim):
    srv = start_sim()
    body = {"prompt": [1, 2, 3], "max_tokens": 5}
    r = requests.post(srv.url + "/v1/completions", json=body).json()
    assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] == 5
    assert r["choices"][0]["finish_reason"] == "length"
    s = requests.post(srv.url + "/v1/completions", stream=True,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(s)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    text = requests.post(srv.url + "/v1/completions", data=json.dumps(body), headers={"Content-Type": "text/plain"})
    assert text.status_code == 400


def test_api_key_requires_bearer_and_exempts_health(start_sim):
    srv = start_sim("--api-key", "s3cret")
    u = srv.url
    assert requests.post(u + "/generate", json=GEN).status_code == 401
    wrong = requests.post(u + "/generate", json=GEN, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json() == {"error": "Unauthorized"}
    assert requests.post(u + "/generate", json=GEN, headers={"Authorization": "s3cret"}).status_code == 401
    assert requests.post(u + "/generate", json=GEN, headers={"Authorization": "bearer s3cret"}).status_code == 200
    for path in ("/health", "/ready", "/health_generate"):
        assert requests.get(u + path).status_code == 200
    assert requests.get(u + "/server_info").status_code == 401


def test_bad_bodies_get_sglang_errors(start_sim):
    srv = start_sim()
    u = srv.url
    bad = requests.post(u + "/generate", json={"input_ids": [1], "sampling_params": {"bogus": 1}})
    assert bad.status_code == 400 and "unknown field `bogus`" in bad.json()["error"]
    assert requests.post(u + "/generate", data=b"{not json").status_code == 400
    too_long = {"input_ids": list(range(5000)), "sampling_params": {"max_new_tokens": 4}}
    r = requests.post(u + "/generate", json=too_long)
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    s = requests.post(u + "/generate", json={**too_long, "stream": True})
    assert s.status_code == 200, "SGLang reports errors after the stream started inside it"
    events = sse_events(s)
    assert "error" in json.loads(events[0]) and events[-1] == "[DONE]"


def test_unknown_flag_exits_2_like_argparse():
    out = subprocess.run([sys.executable, "-m", "sglperf.sim", "--no-such-flag"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in out.stderr


def test_prefix_of_a_flag_works_like_sglang_and_ambiguous_prefix_exits_2():
    ok = subprocess.run([sys.executable, "-m", "sglperf.sim", "--tp", "8", "--help"], capture_output=True, timeout=60)
    assert ok.returncode == 0
    amb = subprocess.run([sys.executable, "-m", "sglperf.sim", "--cuda-graph-max-bs", "8"], capture_output=True,
                         text=True, timeout=60)
    assert amb.returncode == 2 and "ambiguous option" in amb.stderr


def test_resolution_error_exits_1_with_the_servers_error_line(start_sim):
    with pytest.raises(LaunchError) as e:
        start_sim("--preset", "glm5-nvfp4-rtxpro6000-tp8", "--kv-cache-dtype", "nvfp4")
    assert e.value.exit_code == 1
    assert "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype" in str(e.value)


def test_fault_startup_fail_exits_1_with_a_traceback(start_sim):
    with pytest.raises(LaunchError) as e:
        start_sim("--fault-startup-fail")
    assert e.value.exit_code == 1
    assert "scheduler died during initialization" in str(e.value) and "Traceback" in e.value.log_tail


def test_fault_slow_start_delays_readiness(start_sim):
    t0 = time.monotonic()
    start_sim("--fault-slow-start", "1.5")
    assert time.monotonic() - t0 >= 1.5


def test_fault_crash_after_kills_the_process_hard(start_sim):
    srv = start_sim("--fault-crash-after", "3")  # past launch's slowest /health poll, as the hang below
    srv.proc.wait(10)
    assert srv.proc.returncode == -9
    reason = srv.crash_reason()
    assert "exit code -9" in reason and "crashed with exit code -9" in reason


def test_fault_hang_after_stops_tokens_but_keeps_the_connection(start_sim):
    # the hang starts 3 s after ready: past launch's slowest /health poll (1 s apart), so launch always sees it up
    srv = start_sim("--fault-hang-after", "3", env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"})
    end = time.monotonic() + 20
    while "Injected hang" not in srv.log_tail() and time.monotonic() < end:
        time.sleep(0.2)
    assert "Injected hang" in srv.log_tail()
    with pytest.raises((requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError), match="timed out"):
        requests.post(srv.url + "/generate", json={**GEN, "stream": True}, timeout=1.5).content
    assert srv.proc.poll() is None, "a hang keeps the process alive"
    assert requests.get(srv.url + "/health", timeout=5).status_code == 503


def test_fault_error_rate_aborts_inside_http_200_streams(start_sim):
    srv = start_sim("--fault-error-rate", "1.0")
    kinds = set()
    for _ in range(12):
        r = requests.post(srv.url + "/generate", json={**GEN, "stream": True})
        assert r.status_code == 200
        events = sse_events(r)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        if "error" in last:
            kinds.add("error")
        else:
            assert last["meta_info"]["finish_reason"]["type"] == "abort"
            kinds.add("abort")
    assert kinds == {"error", "abort"}


def test_fault_truncate_rate_ends_streams_without_finish_reason(start_sim):
    srv = start_sim("--fault-truncate-rate", "1.0")
    r = requests.post(srv.url + "/generate", json={**GEN, "stream": True})
    events = sse_events(r) if r.content else []
    assert "[DONE]" not in events
    assert all(json.loads(e)["meta_info"]["finish_reason"] is None for e in events)


def test_fault_short_rate_finishes_with_fewer_tokens(start_sim):
    srv = start_sim("--fault-short-rate", "1.0")
    body = {**GEN, "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}, "stream": True}
    events = sse_events(requests.post(srv.url + "/generate", json=body))
    last = json.loads(events[-2])
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["completion_tokens"] < 20


def test_queue_full_answers_503(start_sim):
    from concurrent.futures import ThreadPoolExecutor

    srv = start_sim("--max-queued-requests", "1", "--max-running-requests", "1")
    long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}

    def post(i):
        body = {**long, "stream": True} if i % 2 else long
        return requests.post(srv.url + "/generate", json=body, timeout=60)

    with ThreadPoolExecutor(6) as ex:
        answers = list(ex.map(post, range(6)))
    plain = [r for i, r in enumerate(answers) if i % 2 == 0 and r.status_code == 503]
    streamed = [json.loads(sse_events(r)[0]) for i, r in enumerate(answers) if i % 2 and r.status_code == 200]
    aborted = [c for c in streamed if (c["meta_info"]["finish_reason"] or {}).get("status_code") == 503]
    assert plain or aborted, "with one running and one queued, later requests must be refused"
    assert all("queue is full" in r.json()["error"]["message"] for r in plain)


def test_sigterm_shuts_down_and_the_tree_is_gone(start_sim):
    srv = start_sim()
    tree = srv.tree_pids()
    assert len(tree) >= 2, "the simulator runs a child process like SGLang's schedulers"
    report = srv.stop()
    assert report.exit_code == 0 and report.graceful and not report.survivors
