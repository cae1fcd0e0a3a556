"""The main job (`pytest perf_tests -m sim`) under emulated hosts of other kinds: the same command on one pinned
core, under a CPU quota (cgroup v1 cpu controller), beside a neighbour that keeps a core just under the disturbance
limit busy, and idle. Prints each run's outcome and the c8 latencies its verdicts read, so a threshold can be checked
against hosts this machine is not. Runs as root (cgroups); everything it starts it ends.

    python benchmarks/host_emulation.py [--runs 1] [--levels 8] [--slowdowns] [-- extra pytest args]

--slowdowns: after each emulation's clean runs, one run with each planted slowdown the main job must still fail
(a 50% slower prefill: LATENCY REGRESSION; 15% slower steps: THROUGHPUT REGRESSION).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup/cpu")
SLOWDOWNS = [("--prefill-slowdown=0.5", "LATENCY REGRESSION"), ("--slowdown=0.85", "THROUGHPUT REGRESSION")]


def _spin(share: float, stop) -> None:
    """A neighbour that is busy `share` of each 10 ms on one core."""
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.01 * share:
            pass
        time.sleep(0.01 * (1 - share))


@contextlib.contextmanager
def neighbour(share: float):
    stop = mp.Event()
    p = mp.Process(target=_spin, args=(share, stop), daemon=True)
    p.start()
    try:
        yield
    finally:
        stop.set()
        p.join(5)
        if p.is_alive():
            p.kill()


@contextlib.contextmanager
def quota(cores: float):
    """A cgroup whose tasks get `cores` of CPU time per period: the slower host."""
    group = CGROUP / f"sglperf-emul-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
        yield group
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run(cmd: list[str], reports: Path, prefix: list[str] = (), group: Path | None = None) -> tuple[int, str]:
    def enter():
        if group is not None:
            (group / "tasks").write_text(str(os.getpid()))
    p = subprocess.run([*prefix, *cmd, "--reports-dir", str(reports)], cwd=ROOT, capture_output=True, text=True,
                       preexec_fn=enter, timeout=1800)
    return p.returncode, p.stdout + p.stderr


def summary(out: str, reports: Path) -> str:
    last = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    cats = sorted(set(re.findall(r"^(THROUGHPUT REGRESSION|LATENCY REGRESSION|INVALID MEASUREMENT|INCONCLUSIVE)",
                                 out, re.M)))
    c8 = []
    for f in sorted((reports / "runs").glob("*.json")):
        doc = json.loads(f.read_text())
        for cname, c in doc["configs"].items():
            r = c["levels"].get("8")
            if r:
                c8.append(f"{cname} c8 TTFT mean {r['ttft_ms']['mean']:.1f} ms "
                          f"(server's {r['server_ttft_ms']['mean']:.1f}), TPOT p50 {r['tpot_ms']['median']:.1f}, "
                          f"{r['sustained_output_tps']:.0f} tok/s")
    return f"{last[-1].strip('= ') if last else '?'}  {', '.join(cats) or '-'}\n      " + "\n      ".join(c8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--levels", default=None)
    ap.add_argument("--only", default=None, help="comma-separated emulations to run")
    ap.add_argument("--slowdowns", action="store_true", help="also one run per planted slowdown per emulation")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-m", "sim", "-q", "-p", "no:randomly",
           *(["--levels", a.levels] if a.levels else []), *a.extra]
    emulations = {
        "this host, idle": dict(),
        "one pinned core (client and server share it)": dict(prefix=["taskset", "-c", "0"]),
        "a CPU quota of 1.5 cores": dict(quota=1.5),
        "a neighbour busy 40% of a core": dict(share=0.4),
    }
    for name, how in emulations.items():
        if a.only and not any(k in name for k in a.only.split(",")):
            continue
        runs = [(f"run {i + 1}", []) for i in range(a.runs)]
        if a.slowdowns:
            runs += [(f"slowed ({s}, expect {want})", [f"--server-arg={s}"]) for s, want in SLOWDOWNS]
        for label, args in runs:
            reports = Path(tempfile.mkdtemp(prefix="sglperf-emul-"))
            with contextlib.ExitStack() as stack:
                group = stack.enter_context(quota(how["quota"])) if "quota" in how else None
                if "share" in how:
                    stack.enter_context(neighbour(how["share"]))
                rc, out = run(cmd + args, reports, how.get("prefix", []), group)
            print(f"{name}, {label}: exit {rc}: {summary(out, reports)}", flush=True)


if __name__ == "__main__":
    main()
