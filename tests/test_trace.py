"""Trace replay (`sglperf replay`, measure/trace.py): a Mooncake-layout trace of our own (tests/data/traces) read,
its shared blocks made equal token blocks, sent on its timestamps against the simulator, with each request's send
lateness and the prefix cache's share against what the shared blocks allow; bad traces refused naming the line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglperf.measure import trace as tr

TRACE = Path(__file__).parent / "data" / "traces" / "agent-sessions.jsonl"


def test_equal_hash_ids_are_equal_token_blocks_and_nothing_else_is_shared():
    reqs = tr.read_mooncake(TRACE, 16)
    a, b = reqs[0], next(r for r in reqs if r.hash_ids[:1] == reqs[0].hash_ids[:1] and len(r.hash_ids) == 3)
    pa, pb = (tr.prompt(r, seed=0, low=100, high=32000, block=16) for r in (a, b))
    assert len(pb.ids) == b.isl and pb.max_tokens == b.osl
    assert pb.ids[:min(a.isl, 16)] == pa.ids[:min(a.isl, 16)]  # the block they share
    other = next(r for r in reqs if r.hash_ids[0] != a.hash_ids[0])
    assert tr.prompt(other, seed=0, low=100, high=32000, block=16).ids[:8] != pa.ids[:8]


def test_what_a_prefix_cache_may_serve_is_the_leading_blocks_an_earlier_request_sent():
    reqs = [tr.TraceRequest(0, 40, 4, (1, 2, 3)), tr.TraceRequest(1, 48, 4, (1, 2, 9)),
            tr.TraceRequest(2, 30, 4, (7, 2)), tr.TraceRequest(3, 16, 4, (1,)),
            tr.TraceRequest(4, 48, 4, (1, 2, 3))]
    # block 3 of the first request held 8 of its 16 tokens: the fifth shares those 8 and no more
    assert tr.shared_tokens(reqs, 16) == [0, 32, 0, 15, 40]  # a whole-prompt hit still computes its last token


@pytest.mark.parametrize("line, said", [
    ('{"timestamp": -5, "input_length": 10, "output_length": 4, "hash_ids": [1]}', "timestamp -5"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 4}', "input_length 0"),
    ('{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}', "1 hash_ids of 16 tokens"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": ["a"]}', "hash_ids"),
    ("not json", "not JSON"),
])
def test_a_trace_line_that_is_not_a_request_is_refused_naming_the_line(tmp_path, line, said):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(tr.TraceError, match=f"{f}:2: .*{said}".replace("[", r"\[")):
        tr.read_mooncake(f, 16)


def test_a_trace_replayed_on_its_timestamps_says_how_late_it_sent_and_how_much_the_cache_served(start_sim,
                                                                                                  tmp_path):
    def replay(srv, name):
        out = tmp_path / f"{name}.json"
        p = subprocess.run([sys.executable, "-m", "sglperf.cli", "replay", "--url", srv.url, "--trace", str(TRACE),
                            "--block-tokens", "16", "--json", str(out)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(out.read_text())

    on = replay(start_sim("--enable-metrics"), "on")
    assert on["requests"] == 48 and on["failed"] == 0
    assert on["send_late_ms"]["p99"] < 50, on["send_late_ms"]  # loopback, an idle client: sent on time
    assert on["cache_allowed"] > 0.6 and on["cache_share"] >= 0.9 * on["cache_allowed"], on
    off = replay(start_sim("--enable-metrics", "--disable-radix-cache", name="off"), "off")
    assert off["cache_share"] == 0.0 and off["cache_allowed"] == on["cache_allowed"]
