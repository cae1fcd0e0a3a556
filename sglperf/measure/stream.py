"""Streaming POSTs for the load generator: HTTP/1.1 on an asyncio Protocol with httptools' parser (llhttp, as
uvicorn uses), each SSE event handed to a callback from inside `data_received`.

Why not aiohttp here (it stays for everything else): its StreamReader wakes the reading task once per network
read, through a future and a task step, and that, not the JSON, was most of the client's CPU per token. Here a read
is parsed where it lands: no future, no task step, one clock reading per read.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

Event = Callable[[bytes, float], None]  # (an SSE data payload, unstripped; when the read that carried it arrived)


class StreamError(ConnectionError):
    """The connection failed or closed before the answer ended; the words say where."""


@dataclass
class Answer:
    status: int
    content_type: str
    head: bytes  # the first bytes of a body that is not an event stream (an error's words)
    complete: bool  # the whole answer arrived (else the server closed the connection mid-answer)


class _Exchange(asyncio.Protocol):
    """One connection; one request at a time on it."""

    HEAD_BYTES = 500

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.lost: Exception | None = None
        self._reset(None, None)

    def _reset(self, on_event: Event | None, done: asyncio.Future | None) -> None:
        self.on_event, self.done = on_event, done
        self.status, self.ctype, self.head, self.rest, self.got_bytes = 0, "", b"", b"", False
        self.sse = self.keep_alive = False
        self.framed = False  # Content-Length or chunked: else the answer ends when the server closes

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._finish(StreamError("the server switched protocols"))
        except httptools.HttpParserError as e:
            self._finish(StreamError(f"not HTTP/1.1: {e}"))

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.status and not self.framed and exc is None:  # an answer delimited by the close: it is complete
            self._finish(None)
        self._finish(StreamError("the server closed the connection before the answer ended"
                                 + (f" ({exc})" if exc else "")))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.ctype = value.decode("latin-1").split(";")[0].strip().lower()
        elif name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.sse = self.status == 200 and self.ctype == "text/event-stream"

    def on_body(self, body: bytes) -> None:
        if not self.sse:
            if len(self.head) < self.HEAD_BYTES:
                self.head += body[: self.HEAD_BYTES - len(self.head)]
            return
        if self.rest:
            body, self.rest = self.rest + body, b""
        if body.endswith(b"\n\n") and body.startswith(b"data:") and body.find(b"\n") == len(body) - 2:
            self.on_event(body[5:-2], self.clock())  # the usual read: one whole event
            return
        end = body.rfind(b"\n")
        if end < 0:
            self.rest = body
            return
        now = self.clock()
        if end + 1 < len(body):
            body, self.rest = body[:end], body[end + 1:]
        # the payload keeps its leading space and a CR: JSON allows whitespace around a value
        for line in body.split(b"\n"):
            if line.startswith(b"data:"):
                self.on_event(line[5:], now)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, error: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            if error is not None:
                self.lost = error
            self.done.set_result(error is None)


class StreamClient:
    """Streaming POSTs to one server; idle connections are kept and reused unless `fresh` (a server that closes
    its socket after every stream, as llama.cpp does)."""

    def __init__(self, url: str, headers: dict[str, str], *, fresh: bool = False, connect_timeout: float = 30.0,
                 clock: Callable[[], float]):
        u = urlsplit(url)
        self.host, self.tls = u.hostname or "127.0.0.1", u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.fresh, self.connect_timeout, self.clock = fresh, connect_timeout, clock
        host = self.host if u.port is None else f"{self.host}:{self.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "content-type")
        close = "Connection: close\r\n" if fresh else ""
        self._head = (f"Host: {host}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
                      f"{close}")
        self._idle: list[_Exchange] = []
        self._ssl = ssl.create_default_context() if self.tls else None

    async def _connect(self) -> _Exchange:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(
                lambda: _Exchange(self.clock), self.host, self.port, ssl=self._ssl,
                server_hostname=self.host if self.tls else None), self.connect_timeout)
        except asyncio.TimeoutError:
            raise StreamError(f"no connection to {self.host}:{self.port} within {self.connect_timeout:g} s") from None
        except OSError as e:
            if e.errno == errno.EMFILE:  # not the server's doing: the client's own limit (the load generator names it)
                raise
            raise StreamError(f"cannot connect to {self.host}:{self.port}: {e.strerror or e}") from None
        return proto

    async def post(self, path: str, payload: bytes, on_event: Event) -> tuple[Answer, bool]:
        """Send; `on_event` gets each SSE data payload as its read lands. Returns the answer and whether a reused
        connection had been closed by the server (nothing came back) and the request went again on a fresh one."""
        retried = False
        while True:
            reused = bool(self._idle) and not self.fresh
            conn = self._idle.pop() if reused else await self._connect()
            try:
                return await self._exchange(conn, path, payload, on_event), retried
            except StreamError:
                if reused and not conn.got_bytes and not retried:
                    retried = True  # a keep-alive connection the server had already closed: not a measured error
                    continue
                raise

    async def _exchange(self, conn: _Exchange, path: str, payload: bytes, on_event: Event) -> Answer:
        done = asyncio.get_running_loop().create_future()
        conn._reset(on_event, done)
        if conn.closed or conn.transport is None or conn.transport.is_closing():
            raise StreamError("the server had closed the connection")
        conn.transport.write(f"POST {path} HTTP/1.1\r\n{self._head}Content-Length: {len(payload)}\r\n\r\n".encode()
                             + payload)
        try:
            complete = await done
        except BaseException:
            conn.transport.abort()  # cancelled or timed out mid-answer: this connection is in an unknown state
            raise
        if conn.lost is not None:
            err, conn.lost = conn.lost, None
            if conn.status and not conn.sse:  # the error's words arrived before the close: they are the answer
                return Answer(conn.status, conn.ctype, conn.head, False)
            raise err
        answer = Answer(conn.status, conn.ctype, conn.head, complete)
        if not conn.keep_alive or self.fresh or conn.closed:
            conn.transport.close()
        else:
            self._idle.append(conn)
        return answer

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
