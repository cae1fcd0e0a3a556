"""How much CPU the client spends per streamed chunk, and the chunk rate one client process sustains before its
own event-loop lag grows.

    python benchmarks/client_chunk_cost.py [--seconds 8] [--concurrency 64] [--scales 1,2,4,8,16,200]

Against the simulator's ci preset at increasing --time-scale (200 = near-zero step time), so the offered chunk rate
rises until the client (or the server: both share this machine's two cores) saturates; the table says who was busy.
"""

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from sglperf import engines
from sglperf.client import Target, Workload
from sglperf.launch import LaunchSpec, launch
from sglperf.level import LevelSpec, measure_level
from sglperf.metrics import MeasurementPolicy


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--scales", default="1,2,4,8,16,200")
    a = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="sglperf-bench-"))
    print(f"{'scale':>6} {'chunks/s':>10} {'client CPU':>10} {'µs CPU/chunk':>13} {'loop lag p99':>13} "
          f"{'server CPU':>10}")
    c = a.concurrency
    for scale in a.scales.split(","):
        srv = launch(LaunchSpec("sim-fast", [sys.executable, "-m", "sglperf.sim", "--preset", "ci", "--random-seed",
                                             "1", "--time-scale", scale], logs, launch_timeout_s=60))
        proc = psutil.Process(srv.pid)
        try:
            s0, c0, t0 = proc.cpu_times(), time.process_time(), time.monotonic()
            m = asyncio.run(measure_level(Target(srv.url), Workload(32, 64), LevelSpec(
                concurrency=c, max_seconds=a.seconds, drain_timeout_s=5), MeasurementPolicy(ci_target=0.0),
                engine=engines.get("sim")))
            wall = time.monotonic() - t0
            s1 = proc.cpu_times()
            client = time.process_time() - c0
            chunks = sum(len(r.chunk_times) for r in m.records)
            lag = np.percentile([x.loop_lag_s for x in m.client_samples], 99) * 1e3
            server = (s1.user + s1.system - s0.user - s0.system) / wall
            print(f"{scale:>6} {chunks / wall:>10,.0f} {client / wall:>10.0%} {client / chunks * 1e6:>13.1f} "
                  f"{lag:>10.1f} ms {server:>10.0%}", flush=True)
        finally:
            srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
