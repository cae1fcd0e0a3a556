"""A stand-in server that streams SGLang-shaped /generate chunks at a set rate and almost no CPU of its own.

    python benchmarks/chunk_server.py --port 30001 --tokens-per-s 400

Why: on a 2-core machine the simulator saturates its core near 30,000 chunks/s (it builds each chunk's cumulative
text and ids), before a fast client does; this serves pre-shaped chunks (SGLang's /generate fields, cumulative ids,
completion_tokens and finish_reason in meta_info) from one uvloop timer, each stream getting one chunk per write
every 1/tokens-per-s seconds, so the client is what saturates. For benchmarks/client_capacity.py only: no
scheduling, no KV cache, no errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import uvloop


def chunk(ids: list[int], done: bool) -> bytes:
    meta = {"id": "x", "prompt_tokens": 32, "completion_tokens": len(ids),
            "finish_reason": {"type": "length", "length": len(ids)} if done else None}
    body = b"data: " + json.dumps({"text": " w" * len(ids), "output_ids": ids, "meta_info": meta},
                                  separators=(",", ":")).encode() + b"\n\n"
    return f"{len(body):x}\r\n".encode() + body + b"\r\n"


class Stream(asyncio.Protocol):
    def __init__(self, server: "Blaster"):
        self.server, self.buf, self.transport = server, b"", None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if len(rest) < length:
            return
        self.buf = rest[length:]
        path = head.split(b" ")[1]
        if path == b"/health":
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            return
        if path != b"/generate":
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        n = json.loads(rest[:length])["sampling_params"]["max_new_tokens"]
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
                             b"\r\n\r\n")
        self.server.streams.append([self, n, 0, self.server.loop.time()])

    def connection_lost(self, exc) -> None:
        self.transport = None


class Blaster:
    def __init__(self, tokens_per_s: float):
        self.period, self.streams, self.loop = 1.0 / tokens_per_s, [], asyncio.get_event_loop()
        self.cache = {}

    def tick(self) -> None:
        now, keep = self.loop.time(), []
        for s in self.streams:
            proto, n, k, due = s
            if proto.transport is None:
                continue
            while due <= now and k < n:
                k += 1
                key = (k, k == n)
                if key not in self.cache:
                    self.cache[key] = chunk(list(range(1000, 1000 + k)), k == n)
                proto.transport.write(self.cache[key])
                due += self.period
            if k == n:
                proto.transport.write(chunk_done())
            else:
                keep.append([proto, n, k, due])
        self.streams = keep
        self.loop.call_later(0.001, self.tick)


def chunk_done() -> bytes:
    body = b"data: [DONE]\n\n"
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-s", type=float, default=400.0, help="per stream")
    a = ap.parse_args()
    blaster = Blaster(a.tokens_per_s)
    server = await blaster.loop.create_server(lambda: Stream(blaster), a.host, a.port)
    blaster.tick()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main())
