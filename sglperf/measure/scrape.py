"""Periodic sampling of the server's own view during a level: Prometheus /metrics read through the engine
adapter's series, else the adapter's load endpoint (SGLang's /v1/loads); servers with neither are reported as
unavailable.

Why: a client-side number is corroborated by the server's counters over the same window (metrics.server_view).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Callable

import aiohttp

from ..redact import auth_headers
from ..records import ServerSample


class Scraper:
    """Samples every `interval` seconds until stopped; `source` says what answered ("metrics", "loads", None)."""

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

    async def sample_once(self, session: aiohttp.ClientSession) -> ServerSample | None:
        t_send = self.clock()
        sources = [self.source] if self.source else ["metrics"] + (["loads"] if self.engine.loads_path else [])
        for source in sources:
            path = "/metrics" if source == "metrics" else self.engine.loads_path
            try:
                async with session.get(self.url + path, headers=self.headers) as r:
                    if r.status != 200:
                        if self.source is not None:  # it answered before: a failure (else: not exposed here)
                            self.errors += 1
                            self.last_error = f"{path}: HTTP {r.status}: {(await r.text())[:200].strip()}"
                        continue
                    t_recv = self.clock()
                    t = (t_send + t_recv) / 2
                    s = (self.engine.parse_metrics(await r.text(), t) if source == "metrics"
                         else self.engine.parse_loads(await r.json(), t))
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
                return s
        return None

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
