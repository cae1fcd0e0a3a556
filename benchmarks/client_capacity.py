"""The chunk rate the client streams before its own event loop lags: one process, and N (--client-procs).

    python benchmarks/client_capacity.py [--seconds 8] [--concurrency 128] [--scales 1,4,16,64,1000] [--procs 1,2]

Against the simulator's ci preset at increasing --time-scale (1000 = near-zero step time), so the offered chunk
rate rises until the client (or the server: they share this machine's cores) saturates; the table says who was
busy. Past the simulator's own limit (~30,000 chunks/s on one 2-core CI machine's core), `--server chunks` streams
pre-shaped chunks from benchmarks/chunk_server.py at --scales tokens/s per stream. A process's capacity is the
highest rate whose loop lag p99 stays under 50 ms (shards.CHUNKS_PER_PROC keeps a margin below it). Lag and CPU
are the worst process's. To compare with an older sglperf, run this script with that checkout first on PYTHONPATH
(--procs 1: older versions have no --client-procs).
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import psutil

from sglperf import engines
from sglperf.measure.client import Target, Workload
from sglperf.run.launch import LaunchSpec, launch
from sglperf.measure.level import LevelSpec, measure_level
from sglperf.measure.metrics import MeasurementPolicy, client_health

try:
    from sglperf.measure.client import run_loop
except ImportError:  # an older sglperf
    import asyncio

    run_loop = asyncio.run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--scales", default="1,4,16,64,1000")
    ap.add_argument("--procs", default="1,2")
    ap.add_argument("--server", choices=("sim", "chunks"), default="sim",
                    help="sim: the simulator, --scales are its --time-scale; chunks: benchmarks/chunk_server.py, "
                         "--scales are each stream's tokens/s (for rates past the simulator's own limit)")
    a = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="sglperf-bench-"))
    print(f"{'procs':>5} {'scale':>6} {'chunks/s':>10} {'client CPU':>10} {'µs CPU/chunk':>13} {'loop lag p99':>13} "
          f"{'server CPU':>10}")
    c = a.concurrency
    for procs in (int(x) for x in a.procs.split(",")):
        for scale in a.scales.split(","):
            argv = ([sys.executable, "-m", "sglperf.sim", "--preset", "ci", "--random-seed", "1", "--time-scale",
                     scale] if a.server == "sim" else
                    [sys.executable, str(Path(__file__).with_name("chunk_server.py")), "--tokens-per-s", scale])
            srv = launch(LaunchSpec(a.server, argv, logs, launch_timeout_s=60))
            proc = psutil.Process(srv.pid)
            try:
                s0, t0 = proc.cpu_times(), time.monotonic()
                kw = {"client_procs": procs} if procs > 1 else {}
                m = run_loop(measure_level(Target(srv.url), Workload(32, 64), LevelSpec(
                    concurrency=c, max_seconds=a.seconds, drain_timeout_s=5), MeasurementPolicy(ci_target=0.0),
                    engine=engines.get("sim"), **kw))
                wall = time.monotonic() - t0
                s1 = proc.cpu_times()
                chunks = sum(len(r.chunk_times) for r in m.records)
                span = max(r.end_time for r in m.records) - min(r.send_time for r in m.records)
                # the worst process's lag p99 and CPU share, over the whole level
                samples = m.client_samples
                lag, _, cpu = client_health(samples, (samples[0].time, samples[-1].time))
                server = (s1.user + s1.system - s0.user - s0.system) / wall
                print(f"{procs:>5} {scale:>6} {chunks / span:>10,.0f} {cpu:>10.0%} "
                      f"{cpu * procs / (chunks / span) * 1e6:>13.1f} {lag:>10.1f} ms "
                      f"{server:>10.0%}", flush=True)
            finally:
                srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
