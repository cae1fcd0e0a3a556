"""Periodic sampling of the server's own view during a level: Prometheus /metrics read through the engine
adapter's series, else the adapter's load endpoint (SGLang's /v1/loads); servers with neither are reported as
unavailable.

Why: a client-side number is corroborated by the server's counters over the same window (measure/server_view.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable

import aiohttp

from ..redact import auth_headers
from ..records import ServerSample


MAX_PAGE = 16 * 2**20  # a /metrics page past this is not scraped: named as the server's, never read for minutes
OFF_LOOP = 256 * 2**10  # a page past this is parsed in a thread: the load generator's loop keeps its schedule


async def _read_page(r) -> bytes:
    """The whole page, or its first MAX_PAGE + 1 bytes where it is longer (one read returns what has arrived)."""
    parts, size = [], 0
    async for part in r.content.iter_chunked(1 << 16):
        parts.append(part)
        size += len(part)
        if size > MAX_PAGE:
            break
    return b"".join(parts)


class Scraper:
    """Samples every `interval` seconds until stopped; `source` says what answered ("metrics", "loads", None).
    `page_bytes` and `parse_s`: the largest /metrics page seen and the longest parse, for the level's words."""

    def __init__(self, url: str, engine, *, interval: float = 0.5, api_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.url = url.rstrip("/")
        self.engine = engine
        self.interval = interval
        self.headers = auth_headers(api_key)
        self.clock = clock
        self.samples: list[ServerSample] = []
        self.source: str | None = None
        self.errors = 0
        self.last_error: str | None = None
        self.unparsed = 0  # pages read with lines the parser refused dropped
        self.unparsed_example: str | None = None
        self.page_bytes = 0
        self.parse_s = 0.0
        self.too_big = False

    async def sample_once(self, session: aiohttp.ClientSession) -> ServerSample | None:
        t_send = self.clock()
        sources = [self.source] if self.source else ["metrics"] + (["loads"] if self.engine.loads_path else [])
        if self.too_big:
            sources = [x for x in sources if x != "metrics"] or (["loads"] if self.engine.loads_path else [])
        for source in sources:
            path = "/metrics" if source == "metrics" else self.engine.loads_path
            try:
                async with session.get(self.url + path, headers=self.headers) as r:
                    if r.status != 200:
                        if self.source is not None:  # it answered before: a failure (else: not exposed here)
                            self.errors += 1
                            self.last_error = f"{path}: HTTP {r.status}: {(await r.text())[:200].strip()}"
                        continue
                    if source == "metrics":
                        body = await _read_page(r)
                        t_recv = self.clock()
                        s = await self._parse(body, (t_send + t_recv) / 2)
                    else:
                        t_recv = self.clock()
                        s = self.engine.parse_loads(await r.json(), (t_send + t_recv) / 2)
                    if s is not None:
                        s = dataclasses.replace(s, time_uncertainty_s=(t_recv - t_send) / 2)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                self.errors += 1
                self.last_error = f"{path}: {type(e).__name__}" + (f": {e}" if str(e) else
                                                                   f" (no answer within {self.timeout_s:g} s)")
                continue
            if s is not None:
                self.source = source
                self.samples.append(s)
                if s.unparsed_lines:
                    self.unparsed += 1
                    self.unparsed_example = self.unparsed_example or s.unparsed_example
                return s
        return None

    async def _parse(self, body: bytes, t: float) -> ServerSample | None:
        """The page through the engine's series; a large one in a thread, a page past MAX_PAGE not at all."""
        self.page_bytes = max(self.page_bytes, len(body))
        if len(body) > MAX_PAGE:
            self.too_big = True
            raise ValueError(f"the server's /metrics page is over {MAX_PAGE / 2**20:.0f} MB: not scraped from here on "
                             f"(the server's page, not the load: trim what it exports)")
        started = time.perf_counter()
        text = body.decode(errors="replace")
        if len(body) > OFF_LOOP:
            s = await asyncio.to_thread(self.engine.parse_metrics, text, t)
        else:
            s = self.engine.parse_metrics(text, t)
        self.parse_s = max(self.parse_s, time.perf_counter() - started)
        return s

    def page_words(self) -> str | None:
        """What a large page cost, where it is large enough to name (over OFF_LOOP)."""
        if self.page_bytes <= OFF_LOOP:
            return None
        return (f"the server's /metrics page is {self.page_bytes / 2**20:.1f} MB, parsed in up to "
                f"{self.parse_s * 1e3:.0f} ms each {self.interval:g} s (off the load generator's loop, only the "
                f"engine's own series read)")

    @property
    def timeout_s(self) -> float:
        return max(2.0, self.interval * 4)

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(10**9):
                await self.sample_once(session)
                try:
                    await asyncio.wait_for(stop.wait(), self.interval)
                    await self.sample_once(session)  # one last sample after the level stops
                    return
                except asyncio.TimeoutError:
                    pass
