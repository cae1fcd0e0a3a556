"""Drive 3,072 concurrent streams against the simulator's `ci` preset; print the server's CPU use and errors.

    python benchmarks/sim_3072_streams.py [--seconds 60] [--concurrency 3072]

Why: the simulator must serve the seed's highest level without errors, and the client must hold that many streams
without a connection-pool cap. Zero errors expected. (At the ci preset 48 requests run and the rest queue, as
SGLang queues past its KV ceiling, so each request lives ~35 s: the level here is not meant to be a valid
measurement, only load.)
"""

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import psutil

from sglperf import engines
from sglperf.measure.client import Target, Workload
from sglperf.run.launch import LaunchSpec, launch
from sglperf.measure.level import LevelSpec, measure_level
from sglperf.measure.metrics import MeasurementPolicy


def tree_cpu(pid: int) -> float:
    total = 0.0
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--concurrency", type=int, default=3072)
    a = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="sglperf-bench-"))
    srv = launch(LaunchSpec("sim-ci", [sys.executable, "-m", "sglperf.sim", "--preset", "ci", "--random-seed", "1",
                                       "--enable-metrics"], logs, launch_timeout_s=60))
    try:
        cpu0, t0, me0 = tree_cpu(srv.pid), time.monotonic(), time.process_time()
        m = asyncio.run(measure_level(Target(srv.url), Workload(32, 32), LevelSpec(
            concurrency=a.concurrency, max_seconds=a.seconds, drain_timeout_s=0, stall_timeout_s=30),
            MeasurementPolicy(ci_target=0.0), engine=engines.get("sim")))
        wall = time.monotonic() - t0
        server_cpu, client_cpu = tree_cpu(srv.pid) - cpu0, time.process_time() - me0
        r = m.result
        errors = sum(r.errors.values())
        print(f"concurrency {a.concurrency}: {wall:.1f} s, {r.requests_sent} requests sent, {r.completed} completed, "
              f"{r.cancelled} still open at the end (cancelled by the client), errors {errors} {r.errors or ''}")
        print(f"peak in flight (client) {max(1, round(r.achieved_concurrency or 0))}, server running "
              f"{r.server_max_running}, queued {r.server_mean_queued and round(r.server_mean_queued)}")
        print(f"server CPU {server_cpu / wall:.0%} of one core, client CPU {client_cpu / wall:.0%}, "
              f"client event-loop lag p99 {r.client_lag_p99_ms} ms")
        print(f"output {sum(rec.output_tokens for rec in m.records) / wall:,.0f} tok/s over the run")
        return 0 if errors == 0 else 1
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
