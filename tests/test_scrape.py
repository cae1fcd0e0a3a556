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


def test_a_page_of_other_series_is_read_only_for_the_engines_own_lines_with_the_same_sample():
    """A real SGLang 0.5.17 page with 4 MB of other, valid series appended: the engine's lines alone give the same
    sample (the prefilter keeps the parser off the rest)."""
    from pathlib import Path

    from sglperf import engines
    from sglperf.sim.routes import _padding

    real = (Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17" / "metrics.txt").read_text()
    e = engines.get("sglang")
    assert e.parse_metrics(real + _padding(4), 1.0) == e.parse_metrics(real, 1.0)
    assert len(e.own_lines(real + _padding(4))) <= len(real) + 1


def test_a_large_metrics_page_is_named_as_the_servers_and_costs_the_load_nothing(start_sim, tmp_path):
    """The simulator with 5 MB of other series on its /metrics page: the level stays valid, its count agrees, and its
    warnings name the page's size and parse time (it was blamed on the client's event loop, -78%)."""
    import json
    import subprocess
    import sys

    srv = start_sim("--enable-metrics", "--fault-metrics-padding", "5")
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "sglperf.cli", "bench", "--url", srv.url, "--levels", "16", "--isl", "32",
                        "--osl", "32", "--max-seconds", "12", "--json", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lv = json.loads(out.read_text())["configs"]["bench"]["levels"]["16"]
    assert lv["valid"] and abs(lv["server_ratio"] - 1) < 0.02, lv["invalid_reasons"]
    assert any(w.startswith("the server's /metrics page is 5.") and "off the load generator's loop" in w
               for w in lv["warnings"]), lv["warnings"]
