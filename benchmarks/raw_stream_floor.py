"""The floor under any Python asyncio streaming client on this machine: C closed-loop streams of SGLang's /generate
on keep-alive connections, read by a uvloop Protocol that only counts SSE events (no HTTP parser, no JSON, no
records). What it costs per token is the event loop's wake-up and the socket read, which every client pays.

    python benchmarks/raw_stream_floor.py --url http://127.0.0.1:30000 --seconds 30 [--concurrency 16]

Prints one JSON line: CPU seconds (user, system) of this process and the events counted. Used by
client_vs_bench_serving.py as its "floor" row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
from urllib.parse import urlsplit

import uvloop


def request(host: str, port: int, isl: int, osl: int) -> bytes:
    body = json.dumps({"input_ids": list(range(1000, 1000 + isl)), "stream": True,
                       "sampling_params": {"max_new_tokens": osl, "temperature": 0.0, "ignore_eos": True}}).encode()
    return (f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Counter(asyncio.Protocol):
    events = 0

    def __init__(self, req: bytes, stop: asyncio.Event):
        self.req, self.stop = req, stop

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.req)

    def data_received(self, data: bytes) -> None:
        Counter.events += data.count(b"data: {")
        if b"data: [DONE]" in data:  # the stream ended: the next request on the same connection
            if self.stop.is_set():
                self.transport.close()
            else:
                self.transport.write(self.req)


async def main(url: str, seconds: float, c: int, isl: int, osl: int) -> None:
    u = urlsplit(url)
    req, stop = request(u.hostname, u.port, isl, osl), asyncio.Event()
    loop = asyncio.get_running_loop()
    for _ in range(c):
        await loop.create_connection(lambda: Counter(req, stop), u.hostname, u.port)
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.sleep(1.0)  # the last streams end


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--isl", type=int, default=32)
    ap.add_argument("--osl", type=int, default=32)
    a = ap.parse_args()
    uvloop.run(main(a.url, a.seconds, a.concurrency, a.isl, a.osl))
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"user_s": r.ru_utime, "sys_s": r.ru_stime, "events": Counter.events}))
