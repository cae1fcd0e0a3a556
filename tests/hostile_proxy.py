"""A hostile server for the tests: a loopback proxy in front of a real server (the simulator) that passes every
request through, streams included, but answers /server_info with fields overridden and /metrics with counters
scaled (a server that over- or under-counts what it streamed).
Run: python tests/hostile_proxy.py --port P --upstream URL --set max_total_num_tokens='"abc"'
     python tests/hostile_proxy.py --port P --upstream URL --scale sglang:generation_tokens_total=0.926"""

from __future__ import annotations

import argparse
import json

import aiohttp
from aiohttp import web


def scaled(page: str, scale: dict[str, float]) -> str:
    """A /metrics page with the samples of each named metric multiplied."""
    out = []
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line.startswith("#") and name in scale:
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * scale[name]!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def build_app(upstream: str, overrides: dict, scale: dict[str, float] | None = None) -> web.Application:
    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with request.app["client"].request(request.method, upstream + request.path_qs, data=body,
                                                 headers=headers) as up:
            if request.path == "/server_info" and up.status == 200:
                obj = await up.json()
                obj.update(overrides)
                return web.json_response(obj)
            if request.path == "/metrics" and up.status == 200 and scale:
                return web.Response(text=scaled(await up.text(), scale), content_type="text/plain")
            resp = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() in ("content-type", "cache-control")})
            await resp.prepare(request)
            async for part in up.content.iter_any():
                await resp.write(part)
            await resp.write_eof()
            return resp

    async def start(app):
        app["client"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def stop(app):
        await app["client"].close()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--set", action="append", default=[], help="FIELD=JSON on /server_info")
    ap.add_argument("--scale", action="append", default=[], help="METRIC=FACTOR on /metrics")
    a = ap.parse_args()
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    scale = {k: float(v) for k, v in (s.split("=", 1) for s in a.scale)}
    web.run_app(build_app(a.upstream.rstrip("/"), overrides, scale), host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
