"""Closed-loop streams sharded over client processes (--client-procs N), each with its own event loop.

Why: one Python process streams a few thousand chunks per second before its own event loop lags; an 8-GPU node
streams tens of thousands. Worker w drives streams w, w + N, w + 2N, ... (the same prompts per stream whatever N
is: client.LoadGenerator.closed_loop) and sends the parent its raw request records, its in-flight requests as they
stand, and its lag/CPU samples, four times a second. The parent merges them: the steady-state window comes from the
merged in-flight timeline, percentiles from every record (exact, no histograms), and a level is client-bound if any
worker is. CLOCK_MONOTONIC is one clock for every process on the host, so the records' times line up.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback

from ..categories import InfraError, UsageError
from .client import ClientMonitor, LoadGenerator, Target, Workload, run_loop
from ..records import ClientSample, LevelResult, RequestRecord

UPDATE_S = 0.25
START_TIMEOUT_S = 120.0  # a spawned worker imports numpy, aiohttp and sglperf: seconds on a busy host


# Chunks/s one client process streams with its loop's lag p99 under 50 ms, with a margin for slower CPUs and busier
# levels (benchmarks/client_capacity.py; docs/measurement.md).
CHUNKS_PER_PROC = 6000.0


def parse_client_procs(value: str | int | None, where: str = "--client-procs") -> int | str | None:
    """A count >= 1 or "auto"; None: not given."""
    if value is None or value == "auto":
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise UsageError(f"{where} {value!r}: give a number of client processes >= 1, or auto")
    return n


def resolve_client_procs(setting: int | str | None, concurrency: int, previous: LevelResult | None = None) -> int:
    """How many client processes a level gets. `auto`: enough that none streams more than CHUNKS_PER_PROC chunks/s,
    expecting this level's chunk rate from the previous level's output rate scaled by concurrency (an upper bound:
    throughput plateaus; a server streams at most one chunk per token), and no more than the cores the server and
    this parent process leave free (the server's from the previous level's CPU use, measured). Without a previous
    level: one process."""
    if setting is None:
        return 1
    if setting != "auto":
        return max(1, min(int(setting), concurrency))
    if previous is None or not previous.sustained_output_tps or not previous.concurrency:
        return 1
    expected = previous.sustained_output_tps * concurrency / previous.concurrency
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    server = math.ceil((previous.host or {}).get("server_cores", 0.0))
    free = max(1, cores - server - 1)
    return max(1, min(free, concurrency, math.ceil(expected / CHUNKS_PER_PROC)))


def _worker_main(cmd, out, target: Target, workload: Workload, concurrency: int, worker: int, procs: int,
                 stream_id: int, request_timeout: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent hears Ctrl-C and tells its workers what to do
    try:
        run_loop(_worker(cmd, out, target, workload, concurrency, worker, procs, stream_id, request_timeout))
    except BaseException:
        out.send(("error", worker, traceback.format_exc()[-2000:]))


async def _worker(cmd, out, target, workload, concurrency, worker, procs, stream_id, request_timeout) -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def listen() -> None:  # a thread with blocking reads: an event loop's reader makes the pipe non-blocking
        while True:
            try:
                what = cmd.recv()
            except (EOFError, OSError):
                what = "cancel"  # the parent is gone
            loop.call_soon_threadsafe(commands.put_nowait, what)
            if what == "cancel":
                return

    threading.Thread(target=listen, daemon=True).start()
    async with LoadGenerator(target, workload, stream_id=stream_id, request_timeout=request_timeout) as gen:
        monitor = ClientMonitor(time.monotonic, worker=worker)
        stop, stop_monitor = asyncio.Event(), asyncio.Event()
        out.send(("ready", worker, os.getpid()))
        if await commands.get() != "go":
            return
        mon = asyncio.create_task(monitor.run(stop_monitor))
        load = asyncio.create_task(gen.closed_loop(concurrency, stop, range(worker, concurrency, procs)))
        sent_records = sent_samples = 0

        def update(kind: str) -> None:
            nonlocal sent_records, sent_samples
            now = time.monotonic()
            out.send((kind, worker, gen.records[sent_records:], [p.record(now, cancelled=True)
                                                                 for p in gen.in_flight.values()],
                      gen.last_chunk_time, gen.last_end_time, gen.connection_retries,
                      monitor.samples[sent_samples:]))
            sent_records, sent_samples = len(gen.records), len(monitor.samples)

        next_command = asyncio.ensure_future(commands.get())
        while not load.done():
            done, _ = await asyncio.wait({next_command, load}, timeout=UPDATE_S)
            if next_command in done:
                if next_command.result() == "stop":
                    stop.set()  # no new requests; the ones in flight finish (the parent bounds the drain)
                else:
                    load.cancel()
                next_command = asyncio.ensure_future(commands.get())
            if not load.done():
                update("update")
        next_command.cancel()
        await asyncio.gather(load, return_exceptions=True)
        stop_monitor.set()
        await mon
        update("done")


class ShardedLoad:
    """The load generator's face (records, in_flight, snapshot, last chunk/end times, retries) over N worker
    processes. Use as an async context manager: workers start (and import) before the level's clock starts."""

    def __init__(self, target: Target, workload: Workload, concurrency: int, procs: int, *, stream_id: int = 0,
                 request_timeout: float = 3600.0):
        self.procs = min(procs, concurrency)
        ctx = mp.get_context("spawn")  # never fork a process with a running event loop and threads
        self._cmds, self._outs, self._procs = [], [], []
        for w in range(self.procs):
            cmd_r, cmd_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            self._procs.append(ctx.Process(target=_worker_main, name=f"sglperf-client-{w}", daemon=True,
                                           args=(cmd_r, out_w, target, workload, concurrency, w, self.procs,
                                                 stream_id, request_timeout)))
            self._cmds.append(cmd_w)
            self._outs.append(out_r)
        self.records: list[RequestRecord] = []
        self.samples: list[ClientSample] = []
        self._in_flight: dict[int, list[RequestRecord]] = {}
        self._retries: dict[int, int] = {}
        self.last_chunk_time: float | None = None
        self.last_end_time: float | None = None
        self._ready: dict[int, int] = {}
        self._done: set[int] = set()
        self._error: str | None = None
        self._changed = asyncio.Event()

    @property
    def pids(self) -> list[int]:
        return list(self._ready.values())

    @property
    def in_flight(self) -> list[RequestRecord]:
        return [r for rs in self._in_flight.values() for r in rs]

    @property
    def connection_retries(self) -> int:
        return sum(self._retries.values())

    def snapshot(self, now: float) -> list[RequestRecord]:
        return self.records + self.in_flight

    # ------------------------------------------------------------------ messages from the workers
    def _listen(self, i: int, loop: asyncio.AbstractEventLoop) -> None:
        """A thread per worker, blocking on its pipe (a message can be larger than the pipe's buffer)."""
        conn = self._outs[i]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError) as e:
                loop.call_soon_threadsafe(self._lost, i, e)
                return
            loop.call_soon_threadsafe(self._receive, msg)
            if msg[0] in ("done", "error"):
                return

    def _lost(self, i: int, e: Exception) -> None:
        if i not in self._done and self._error is None:
            self._error = (f"client process {i} exited (code {self._procs[i].exitcode}) before it finished "
                           f"({type(e).__name__}: {e})")
        self._changed.set()

    def _receive(self, msg) -> None:
        kind, w = msg[0], msg[1]
        if kind == "ready":
            self._ready[w] = msg[2]
        elif kind == "error":
            self._error = f"client process {w} failed:\n{msg[2]}"
        else:
            records, flight, last_chunk, last_end, retries, samples = msg[2:]
            self.records.extend(records)
            self._in_flight[w] = flight
            self.samples.extend(samples)
            self._retries[w] = retries
            if last_chunk is not None:
                self.last_chunk_time = max(self.last_chunk_time or last_chunk, last_chunk)
            if last_end is not None:
                self.last_end_time = max(self.last_end_time or last_end, last_end)
            if kind == "done":
                self._done.add(w)
        self._changed.set()

    async def _until(self, cond, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not cond():
            if self._error:
                raise InfraError(self._error)
            self._changed.clear()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True

    def _tell(self, what: str) -> None:
        for c in self._cmds:
            try:
                c.send(what)
            except (BrokenPipeError, OSError):
                pass

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "ShardedLoad":
        loop = asyncio.get_running_loop()
        for i, p in enumerate(self._procs):
            p.start()
            threading.Thread(target=self._listen, args=(i, loop), daemon=True).start()
        if not await self._until(lambda: len(self._ready) == self.procs, START_TIMEOUT_S):
            raise InfraError(f"{self.procs - len(self._ready)} of {self.procs} client processes did not start within "
                             f"{START_TIMEOUT_S:g} s")
        return self

    async def closed_loop(self, concurrency: int, stop: asyncio.Event) -> None:
        """Until `stop`: the workers stream; then they stop sending and their requests in flight finish. Cancelled
        (the level's drain ran out, or Ctrl-C): the workers cancel theirs and report them, marked cancelled."""
        self._tell("go")
        try:
            stopped = asyncio.ensure_future(stop.wait())
            failed = asyncio.ensure_future(self._until(lambda: False))
            done, _ = await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
            failed.cancel()
            if failed in done:
                failed.result()  # a worker's failure surfaces here, as a generator bug does in one process
            self._tell("stop")
            await self._until(lambda: len(self._done) == self.procs)
        except asyncio.CancelledError:
            self._tell("cancel")
            try:  # keep what the workers measured; one that died (SIGTERM to the group) has nothing more to say
                await asyncio.shield(self._until(lambda: len(self._done) == self.procs, 10.0))
            except InfraError:
                pass
            raise

    async def __aexit__(self, *exc) -> None:
        self._tell("cancel")
        for p in self._procs:
            await asyncio.to_thread(p.join, 10)
            if p.is_alive():
                p.kill()  # ours, by its handle: a worker that would not stop
                await asyncio.to_thread(p.join, 5)
        for c in self._cmds + self._outs:
            c.close()
