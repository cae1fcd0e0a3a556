"""The client's stream parsing: every way a request goes wrong ends as an error kind, never as a success.

A scripted aiohttp server on loopback plays each answer."""

import asyncio
import json
import os
import signal
import time

import pytest
from aiohttp import web

from sglperf.interrupts import resume
from sglperf.measure.client import LoadGenerator, Target, Workload, run_loop
from sglperf.measure.wire import NATIVE, by_name


def chunk(n, finish=None, *, ids=True, layout="sglang"):
    """One /generate event: as SGLang writes it (compact JSON, meta_info last, completion_tokens after
    finish_reason: the client counts such chunks without parsing them), or "spaced" (json.dumps: parsed)."""
    meta = {"id": "r1", "finish_reason": finish, "prompt_tokens": 4, "completion_tokens": n, "cached_tokens": 0}
    body = {"text": "x" * n, **({"output_ids": list(range(n))} if ids else {}), "meta_info": meta}
    data = json.dumps(body, separators=(",", ":")) if layout == "sglang" else json.dumps(body)
    return b"data: " + data.encode() + b"\n\n"


LENGTH = {"type": "length", "length": 4}
LAYOUTS = ["sglang", "spaced"]


def scripts(layout="sglang"):
    def c(*a, **k):
        return chunk(*a, layout=layout, **k)

    return {
        "ok": [c(1), c(2), c(4, LENGTH), b"data: [DONE]\n\n"],
        "coalesced": [c(3), c(4, LENGTH), b"data: [DONE]\n\n"],
        "stream_error": [c(1), b'data: {"error": {"message": "boom", "code": 400}}\n\n', b"data: [DONE]\n\n"],
        "abort": [c(1), c(1, {"type": "abort", "message": "x", "status_code": 503}), b"data: [DONE]\n\n"],
        "no_finish": [c(1), c(2)],
        "short_output": [c(1), c(3, {"type": "length", "length": 3}), b"data: [DONE]\n\n"],
        "long_output": [c(2), c(5, {"type": "length", "length": 5}), b"data: [DONE]\n\n"],
        "bad_chunk": [c(1), b"data: {not json\n\n", c(4, LENGTH), b"data: [DONE]\n\n"],
        "count_shrinks": [c(3), c(2), c(4, LENGTH), b"data: [DONE]\n\n"],
    }


async def serve(script, status=200, delay=0.0, layout="sglang"):
    async def generate(request):
        await request.read()
        if status != 200:
            return web.json_response({"error": {"message": "nope"}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if script == "disconnect":
            await resp.write(chunk(1))
            request.transport.close()
            return resp
        for part in scripts(layout)[script]:
            await asyncio.sleep(delay)
            await resp.write(part)
        return resp

    async def completions(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(4):  # llama.cpp style: one token per chunk, usage only on the last one
            c = {"choices": [{"text": f" w{i}", "finish_reason": "length" if i == 3 else None}]}
            if i == 3:
                c["usage"] = {"completion_tokens": 4, "prompt_tokens": len(body["prompt"])}
            await resp.write(b"data: " + json.dumps(c).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def one(script, *, status=200, api="sglang", timeout=30.0, delay=0.0, layout="sglang"):
    async def go():
        runner, url = await serve(script, status, delay, layout)
        try:
            async with LoadGenerator(Target(url, wire=by_name(api)), Workload(4, 4), request_timeout=timeout) as gen:
                return await gen.one_request()
        finally:
            await runner.cleanup()

    return asyncio.run(go())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_good_stream_is_a_success_with_token_deltas(layout):
    rec = one("ok", layout=layout)
    assert rec.ok and rec.finish_reason == "length"
    assert rec.chunk_tokens == (1, 1, 2) and rec.output_tokens == 4
    assert rec.server_completion_tokens == 4 and rec.server_prompt_tokens == 4


@pytest.mark.parametrize("layout", LAYOUTS)
def test_coalesced_chunks_count_tokens_from_completion_tokens(layout):
    rec = one("coalesced", layout=layout)
    assert rec.ok and rec.chunk_tokens == (3, 1)


@pytest.mark.parametrize("script", ["stream_error", "abort", "no_finish", "short_output", "long_output",
                                    "bad_chunk"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_http_200_streams_that_go_wrong_are_errors(script, layout):
    rec = one(script, layout=layout)
    assert not rec.ok
    assert rec.error == script
    assert rec.http_status == 200


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_token_count_that_shrinks_is_a_bad_chunk_never_negative_tokens(layout):
    rec = one("count_shrinks", layout=layout)
    assert rec.error == "bad_chunk" and "token count 2 after 3: not a whole number that only grows" in rec.error_detail


def test_a_stream_past_its_length_limit_names_the_field_it_went_past():
    rec = one("long_output")
    assert rec.error == "long_output"
    assert "5 tokens generated, 4 asked: the server went past the length limit it was sent " \
           "(sampling_params.max_new_tokens)" in rec.error_detail


def test_non_200_is_an_http_status_error():
    rec = one("ok", status=503)
    assert rec.error == "http_status" and rec.http_status == 503 and "nope" in rec.error_detail


def test_a_dropped_connection_is_a_connection_error():
    rec = one("disconnect")
    assert rec.error in ("connection", "no_finish")
    assert not rec.ok


def test_a_request_over_its_timeout_is_a_timeout():
    rec = one("ok", timeout=0.2, delay=0.5)
    assert rec.error == "timeout"


def test_openai_streams_without_per_chunk_usage_count_one_token_per_chunk():
    rec = one("ok", api="openai")
    assert rec.ok and rec.output_tokens == 4 and rec.chunk_tokens == (1, 1, 1, 1)


def test_prompts_are_seeded_distinct_and_exact_length():
    w = Workload(128, 8, seed=3)
    a, b = w.prompt(0, 0).ids, w.prompt(0, 1).ids
    assert len(a) == 128 and a != b and a == Workload(128, 8, seed=3).prompt(0, 0).ids
    assert all(w.vocab_low <= x < w.vocab_high for x in a)


def test_two_requests_share_no_prompt_prefix():
    w = Workload(32, 8, seed=1)
    heads = {tuple(w.prompt(s, i).ids[:3]) for s in range(8) for i in range(500)}
    assert len(heads) == 8 * 500  # a radix cache matches nothing between them


def test_a_client_process_gets_the_workload_without_its_id_pool_and_makes_the_same_prompts():
    import pickle

    w = Workload(32, 8, seed=2)
    first = w.prompt(1, 7).ids
    sent = pickle.dumps(w)  # --client-procs workers are spawned: their arguments are pickled
    assert len(sent) < 10_000 and pickle.loads(sent).prompt(1, 7).ids == first


def test_native_chunks_are_read_from_meta_info_alone_and_anything_else_whole():
    meta = {"completion_tokens": 3, "finish_reason": None}
    sglang = json.dumps({"text": 'he said \"meta_info\": no', "output_ids": [1, 2, 3], "meta_info": meta})
    assert NATIVE.parse(b" " + sglang.encode() + b"\r") == {"meta_info": meta}
    for whole in ({"meta_info": meta, "index": 0}, {"meta_info": {"finish_reason": None}, "output_ids": [1]},
                  {"error": {"message": "boom"}}):
        assert NATIVE.parse(json.dumps(whole).encode()) == whole
    with pytest.raises(ValueError):
        NATIVE.parse(b'{"text": "cut off here')


def test_only_ordinary_native_chunks_are_counted_without_parsing():
    """The chunks between a stream's first and last, as SGLang writes them, give their count unparsed; every other
    chunk (the last, an abort, an error, another spacing, no field after the count) gives None and is parsed."""
    assert NATIVE.count(b" " + chunk(7)[6:-2]) == 7
    assert NATIVE.count(chunk(12, ids=False)[6:-2]) == 12
    tail = b',"meta_info":{"finish_reason":null,"completion_tokens":3,"cached_tokens":0}}'
    assert NATIVE.count(b'{"text":"he wrote \\"meta_info\\":{\\"completion_tokens\\":99,"' + tail) == 3
    for other in (chunk(4, LENGTH), chunk(1, {"type": "abort", "message": "x"}), chunk(3, layout="spaced"),
                  b'data: {"error": {"message": "boom"}}\n\n',
                  b'data: {"meta_info":{"finish_reason":null,"completion_tokens":3}}\n\n',
                  b'data: {"meta_info":{"finish_reason":null,"completion_tokens":"3","x":0}}\n\n'):
        assert NATIVE.count(other[6:-2]) is None, other


def test_bad_targets_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="http://"):
        Target("localhost:30000")
    with pytest.raises(ValueError, match="unknown API 'grpc'"):
        by_name("grpc")


def test_events_are_read_however_the_bytes_are_cut_into_reads():
    """The usual read is one whole event; events split across reads, several per read, CRLF line ends, comments
    and other fields must give the same payloads, each stamped at the read that completed it."""
    from sglperf.measure.stream import _Exchange

    stream = (b'data: {"a": 1}\n\n: a comment\n\nevent: x\ndata: {"b": 2}\r\n\r\ndata: [DONE]\n\n')
    want = [b'{"a": 1}', b'{"b": 2}', b"[DONE]"]
    for cuts in ([], [5], [14, 15], [3, 20, 40, 41], list(range(1, len(stream)))):
        got, ex = [], _Exchange(clock=lambda: 0.0)
        ex.sse, ex.on_event = True, lambda data, now: got.append(data.strip())
        for a, b in zip([0, *cuts], [*cuts, len(stream)]):
            ex.on_body(stream[a:b])
        assert got == want, cuts


def test_ctrl_c_after_the_interrupted_level_is_saved_raises_again_and_never_reaches_the_closed_loop():
    """The first Ctrl-C cancels the level; once its partial result is saved (resume), Ctrl-C is the caller's again.
    The level's own handler must not come back then: its loop is closed, and it raised `RuntimeError: Event loop is
    closed` from inside pytest's session end (a traceback where a clean interrupted run was due)."""
    async def level():
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "interrupted"

    before = signal.getsignal(signal.SIGINT)
    assert run_loop(level()) == "interrupted"
    resume()
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # Python runs the handler between bytecodes: at once


def test_a_check_after_a_pause_of_the_process_snapshots_once_the_streams_have_read_what_reached_them():
    """Tokens reach a stream's socket while the event loop is busy (a long pause of the process): snapshotted at once,
    the reader has not read them yet; after level.caught_up it has read them all."""
    import asyncio
    import socket

    from sglperf.measure.level import caught_up

    async def busy_then(settle) -> tuple[int, int]:
        ours, peer = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        got: list[int] = []

        async def read() -> None:
            while line := await reader.readline():
                got.append(int(line))

        task = asyncio.create_task(read())
        peer.sendall(b"".join(b"%d\n" % i for i in range(100)))
        await asyncio.sleep(0.05)
        before = len(got)
        peer.sendall(b"".join(b"%d\n" % i for i in range(100, 600)))  # arrives while the loop does not turn
        await settle()
        seen = len(got)
        task.cancel()
        writer.close()
        peer.close()
        return before, seen

    async def at_once():
        return None

    assert asyncio.run(busy_then(at_once)) == (100, 100), "the snapshot misses what arrived while the loop was busy"
    assert asyncio.run(busy_then(lambda: caught_up(lambda: 0.0))) == (100, 600)
