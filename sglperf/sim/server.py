"""The simulator's process: SGLang's start-up log lines and timing, a child process standing in for the
schedulers, the listening socket, signals and graceful shutdown, and the injected process faults (crash, hang,
slow or failed start-up). State lives in state.py, the HTTP surface in routes.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
import traceback

from aiohttp import web

from . import args as sim_args
from .routes import build_app
from .state import SimServer, log, log_sched


class SchedFormatter(logging.Formatter):
    def __init__(self, tp: int):
        super().__init__()
        self.tp = tp

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        prefix = " TP0" if self.tp > 1 and record.name.startswith("sglang.scheduler") else ""
        return f"[{ts}{prefix}] {record.getMessage()}"


def setup_logging(level: str, tp: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(SchedFormatter(tp))
    root = logging.getLogger("sglang")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65535
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def serve(res: sim_args.Resolved) -> int:
    a = res.args
    srv = SimServer(res)
    loop = asyncio.get_running_loop()
    # as SGLang 0.5.23 does: every server arg in clear, secrets included (keeping them out of files is the suite's job)
    log.info("server_args=%s", json.dumps(res.server_args(), default=str))
    for w in res.warnings:
        log.warning(w)
    # A child process stands in for SGLang's scheduler/detokenizer processes, so launchers must end a whole tree.
    srv.children.append(subprocess.Popen([sys.executable, "-m", "sglperf.sim.child", str(os.getpid())],
                                         stdin=subprocess.DEVNULL))
    log_sched("Load weight begin. avail mem=%.2f GB", res.preset.gpu_mem_gib)
    await asyncio.sleep((res.preset.startup_s + a.fault_slow_start) / a.time_scale)
    if a.fault_startup_fail:
        print("Traceback (most recent call last):\n"
              '  File "sglang/srt/entrypoints/engine.py", line 917, in _launch_subprocesses\n'
              "    raise RuntimeError(\n"
              "RuntimeError: Rank 0 scheduler died during initialization (exit code: 1). "
              "Injected start-up failure (--fault-startup-fail).", file=sys.stderr, flush=True)
        return 1
    _log_loaded(res)
    raise_nofile()
    app = build_app(srv)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, a.host, a.port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log.error("[Errno %s] error while attempting to bind on address (%r, %d): %s", e.errno, a.host, a.port,
                  e.strerror.lower() if e.strerror else e)
        await runner.cleanup()
        return 1
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", a.host, a.port)
    engine_task = asyncio.create_task(srv.engine_loop())
    stop = asyncio.Event()

    def on_sigterm() -> None:
        log.info("Received sigterm; shutting down gracefully after in-flight requests finish.")
        srv.shutting_down = True
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    if not a.skip_server_warmup:
        st = srv.new_stream(7, 8, "warmup")
        async for _ in srv.events(st):
            pass
        srv.drop(st)
        log.info('127.0.0.1:0 - "POST /generate HTTP/1.1" 200')
    srv.status = "Up"
    srv.ready_at = time.time()
    log.info("The server is fired up and ready to roll!")
    faults = _injected_faults(srv, a)
    await stop.wait()
    await _shut_down(srv, runner, [engine_task, *faults])
    return 0


def _log_loaded(res: sim_args.Resolved) -> None:
    """SGLang's scheduler lines once its weights and KV pool are in place, in its words and numbers."""
    a = res.args
    log_sched("Load weight end. elapsed=%.2f s, type=%s, quant=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
              res.preset.startup_s, res.preset.architectures[0], a.quantization, res.preset.gpu_mem_gib
              - res.preset.weights_gib_per_gpu, res.preset.weights_gib_per_gpu)
    log_sched("KV Cache is allocated. dtype: %s, #tokens: %d, KV size: %.2f GB", res.kv_cache_dtype,
              res.max_total_num_tokens, res.mem_fraction_static * res.preset.gpu_mem_gib
              - res.preset.weights_gib_per_gpu)
    log_sched("max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
              "context_len=%d, available_gpu_mem=%.2f GB", res.max_total_num_tokens, res.chunked_prefill_size,
              a.max_prefill_tokens, res.max_running_requests, res.context_len,
              res.preset.gpu_mem_gib * (1 - res.mem_fraction_static))


def _injected_faults(srv: SimServer, a) -> list[asyncio.Task]:
    """--fault-crash-after (the scheduler dies: SIGKILL, as SGLang's crash path ends) and --fault-hang-after."""
    faults = []
    if a.fault_crash_after is not None:
        async def crash() -> None:
            await asyncio.sleep(a.fault_crash_after)
            log.error("Subprocess scheduler_0 (pid=%d) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
                      srv.children[0].pid)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        faults.append(asyncio.create_task(crash()))
    if a.fault_hang_after is not None:
        async def hang() -> None:
            await asyncio.sleep(a.fault_hang_after)
            log.warning("Injected hang (--fault-hang-after): the engine stops producing tokens.")
            srv.hung = True
        faults.append(asyncio.create_task(hang()))
    return faults


async def _shut_down(srv: SimServer, runner, tasks: list[asyncio.Task]) -> None:
    """SIGTERM drains in-flight requests (up to 30 s, unless hung or SGL_FORCE_SHUTDOWN), then the HTTP server and
    the child processes end."""
    if srv.shutting_down and not os.environ.get("SGL_FORCE_SHUTDOWN"):
        end = time.monotonic() + 30
        while srv.streams and time.monotonic() < end and not srv.hung:
            await asyncio.sleep(0.1)
    for t in tasks:
        t.cancel()
    await runner.cleanup()
    for c in srv.children:
        c.terminate()
        try:
            c.wait(5)
        except subprocess.TimeoutExpired:
            c.kill()
    log.info("Shutdown complete.")


def main(argv: list[str] | None = None) -> int:
    parser = sim_args.build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level if hasattr(logging, args.log_level.upper()) else "info", args.tp_size)
    try:
        res = sim_args.resolve(args)
    except Exception:  # resolution errors: traceback and exit 1, like SGLang
        traceback.print_exc()
        return 1
    return asyncio.run(serve(res))


if __name__ == "__main__":
    sys.exit(main())
