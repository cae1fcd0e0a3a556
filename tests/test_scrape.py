"""The scraper: what it says when the server's own view cannot be read, and how well a sample is placed in time."""

import asyncio

import aiohttp
from aiohttp import web

from sglperf import engines
from sglperf.measure.scrape import Scraper

METRICS = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"


def scrape(app: web.Application, engine: str, times: int = 3) -> Scraper:
    """`times` scrapes of a loopback server running `app`, as the given engine's adapter reads it."""
    async def main():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        s = Scraper(f"http://127.0.0.1:{port}", engines.get(engine), interval=0.05)
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(times):
                    await s.sample_once(session)
        finally:
            await runner.cleanup()
        return s

    return asyncio.run(main())


def test_a_metrics_endpoint_that_starts_failing_is_counted_with_the_servers_words():
    answers = iter([(200, METRICS), (503, "server busy: 64 requests deferred"), (200, METRICS)])

    async def metrics(_):
        status, text = next(answers)
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    s = scrape(app, "sglang")
    assert [x.running for x in s.samples] == [3, 3]
    assert s.errors == 1 and s.last_error == "/metrics: HTTP 503: server busy: 64 requests deferred"
    assert all(0 <= x.time_uncertainty_s < 1 for x in s.samples), "half the round trip of each answered scrape"


def test_a_server_that_exposes_no_metrics_is_not_a_failing_one():
    s = scrape(web.Application(), "openai")
    assert s.samples == [] and s.source is None and s.errors == 0
