"""Periodic sampling of the server's own view during a level: Prometheus /metrics (SGLang's sglang:* series or
llama.cpp's llamacpp:* series), else /v1/loads; servers with neither are reported as unavailable.

Why: a client-side number is corroborated by the server's counters over the same window (metrics.server_view).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .records import ServerSample

# canonical field -> (family name as the parser reports it, sample name, label filter)
SGLANG = {
    "decode_tokens_total": ("sglang:realtime_tokens", "sglang:realtime_tokens_total", {"mode": "decode"}),
    "first_tokens_total": ("sglang:time_to_first_token_seconds", "sglang:time_to_first_token_seconds_count", {}),
    "running": ("sglang:num_running_reqs", "sglang:num_running_reqs", {}),
    "queued": ("sglang:num_queue_reqs", "sglang:num_queue_reqs", {}),
    "token_usage": ("sglang:token_usage", "sglang:token_usage", {}),
    "used_tokens": ("sglang:num_used_tokens", "sglang:num_used_tokens", {}),
    "max_total_tokens": ("sglang:max_total_num_tokens", "sglang:max_total_num_tokens", {}),
    "retracted_total": ("sglang:num_retracted_requests", "sglang:num_retracted_requests_total", {}),
    "gen_throughput": ("sglang:gen_throughput", "sglang:gen_throughput", {}),
}
LLAMACPP = {
    "output_tokens_total": ("llamacpp:tokens_predicted", "llamacpp:tokens_predicted_total", {}),
    "running": ("llamacpp:requests_processing", "llamacpp:requests_processing", {}),
    "queued": ("llamacpp:requests_deferred", "llamacpp:requests_deferred", {}),
}


def parse_metrics(text: str, t: float) -> ServerSample | None:
    """Sum each series over its label sets (TP ranks, is_streaming); None if no known series is present."""
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for spec in (SGLANG, LLAMACPP):
            for key, (_fam, sample_name, labels) in spec.items():
                for s in fam.samples:
                    if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                        values[key] = values.get(key, 0.0) + float(s.value)
    if not values:
        return None
    return ServerSample(time=t, **values)


def parse_loads(obj: dict, t: float) -> ServerSample | None:
    loads = obj.get("loads") if isinstance(obj, dict) else None
    if not loads:
        return None

    def total(key):
        vals = [x.get(key) for x in loads if isinstance(x.get(key), (int, float))]
        return float(sum(vals)) if vals else None

    usage = [x.get("token_usage") for x in loads if isinstance(x.get("token_usage"), (int, float))]
    return ServerSample(time=t, running=total("num_running_reqs"), queued=total("num_waiting_reqs"),
                        used_tokens=total("num_used_tokens"), max_total_tokens=total("max_total_num_tokens"),
                        token_usage=sum(usage) / len(usage) if usage else None,
                        gen_throughput=total("gen_throughput"))


class Scraper:
    """Samples every `interval` seconds until stopped; `source` says what answered ("metrics", "loads", None)."""

    def __init__(self, url: str, *, interval: float = 0.5, api_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.url = url.rstrip("/")
        self.interval = interval
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.clock = clock
        self.samples: list[ServerSample] = []
        self.source: str | None = None
        self.errors = 0
        self.last_error: str | None = None

    async def sample_once(self, session: aiohttp.ClientSession) -> ServerSample | None:
        t_send = self.clock()
        for source in ([self.source] if self.source else ["metrics", "loads"]):
            path = "/metrics" if source == "metrics" else "/v1/loads"
            try:
                async with session.get(self.url + path, headers=self.headers) as r:
                    if r.status != 200:
                        continue
                    t = (t_send + self.clock()) / 2
                    s = parse_metrics(await r.text(), t) if source == "metrics" else parse_loads(await r.json(), t)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
                continue
            if s is not None:
                self.source = source
                self.samples.append(s)
                return s
        return None

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval * 4))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for _ in range(10**9):
                await self.sample_once(session)
                try:
                    await asyncio.wait_for(stop.wait(), self.interval)
                    await self.sample_once(session)  # one last sample after the level stops
                    return
                except asyncio.TimeoutError:
                    pass
