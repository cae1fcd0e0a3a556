"""The host's other load during a level: CPU used by processes that are neither the client nor the server's
process tree, CPU stolen by the hypervisor, and the load average, sampled through the level like the server scrape.

Why: a neighbour that takes the CPU (a pip install, another test run) slows the client or a CPU-bound server, and a
level measured under it must be named INVALID with the cause in words, never reported as a regression. Memory
pressure does the same by other means (reclaim stalls, swapping): the kernel's pressure-stall information
(/proc/pressure/memory, Linux >= 4.20) says how long tasks waited for memory; where it is missing, swap-ins say it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable

import psutil

from ..records import HostSample


def _busy_and_steal() -> tuple[float, float]:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is counted in user
    return total - idle - steal, steal


PSI_MEMORY = "/proc/pressure/memory"


def parse_psi_total(text: str) -> float | None:
    """Seconds of the "some" line's total (microseconds) of a /proc/pressure file, or None."""
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total="):
                    return int(part[6:]) / 1e6
    return None


def _memory() -> tuple[float | None, float | None, float | None]:
    try:
        with open(PSI_MEMORY) as f:
            stall = parse_psi_total(f.read())
    except OSError:
        stall = None
    vm = psutil.virtual_memory()
    try:
        swap_in = psutil.swap_memory().sin / 2**20
    except (psutil.Error, OSError, RuntimeError):
        swap_in = None
    return stall, vm.available / 2**20, swap_in


def _cpu_seconds(pids: list[int]) -> float:
    out = 0.0
    for pid in pids:
        try:
            c = psutil.Process(pid).cpu_times()
            out += c.user + c.system
        except psutil.Error:
            continue
    return out


class HostMonitor:
    """Samples every `period` seconds until stopped. `server_pids` lists the server's process tree where it runs on
    this host ([] for a remote server: then all other load is the neighbours')."""

    def __init__(self, clock: Callable[[], float], server_pids: Callable[[], list[int]] | None = None,
                 period: float = 0.5, client_pids: Callable[[], list[int]] | None = None):
        self.clock, self.server_pids, self.period = clock, server_pids or (lambda: []), period
        self.client_pids = client_pids or (lambda: [])  # the client's own worker processes (--client-procs)
        self.samples: list[HostSample] = []
        self.error: str | None = None
        self._me = psutil.Process()
        self._pids: list[int] = []

    def sample(self) -> HostSample:
        busy, steal = _busy_and_steal()
        own = self._me.cpu_times()
        own_s = own.user + own.system + own.children_user + own.children_system + _cpu_seconds(self.client_pids())
        if len(self.samples) % 10 == 0:  # finding the tree scans every process: every 5 s is enough
            self._pids = [p for p in self.server_pids() if p != self._me.pid]
        return HostSample(self.clock(), busy, own_s, _cpu_seconds(self._pids), steal, os.getloadavg()[0],
                          *_memory())

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                self.samples.append(await asyncio.to_thread(self.sample))
            except OSError as e:  # out of open files, say: the level's own checks name it; sampling goes on
                self.error = f"host sampling failed: {e}"
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except asyncio.TimeoutError:
                pass


FD_RESERVE = 64  # open files the suite needs beside its streams: logs, pipes, scrapes, /proc reads, a shard's own


def kernel_open_files_max() -> int | None:
    """The most open files the kernel lets one process have (fs.nr_open), where it says."""
    try:
        return int(Path("/proc/sys/fs/nr_open").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def open_files_problem(concurrency: int, procs: int, option: str, *, rate: bool = False) -> str | None:
    """Why a level of `concurrency` streams (over `procs` client processes: one connection each) cannot be held
    within this process's hard open-file limit, or None. (The load generator raises its soft limit to the hard one,
    as load generators do: only the hard limit bounds a level.) With `rate`, `concurrency` is an offered rate (req/s),
    whose requests in flight are at least one second of its arrivals once each takes a second: the least it holds."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 16
    need = -(-concurrency // max(1, procs)) + open_now + FD_RESERVE
    if hard == resource.RLIM_INFINITY or need <= hard:
        return None
    ceiling = kernel_open_files_max()
    if ceiling is not None and need > ceiling:  # no ulimit reaches it: raising one is no advice
        what = (f"an offered rate of {concurrency:,} req/s holds at least {concurrency:,} requests in flight (a "
                f"second of its arrivals) and" if rate else f"{concurrency:,} concurrent requests")
        return (f"{option}: {what} would need about {need:,} open files in one client "
                f"process, past the most this kernel lets any process open ({ceiling:,}, /proc/sys/fs/nr_open): "
                f"measure fewer, or spread them over processes with --client-procs")
    what = (f"an offered rate of {concurrency:,} req/s (at least a second of its arrivals in flight)" if rate
            else f"a level of {concurrency:,} streams")
    return (f"{option}: {what} needs about {need:,} open files in one client process "
            f"(one connection per stream, {open_now + FD_RESERVE} for the suite), but this process may open at most "
            f"{hard:,} (ulimit -n, hard limit): raise it (ulimit -n {need} as root, LimitNOFILE= in a systemd unit, "
            f"nofile in /etc/security/limits.conf), or measure fewer streams, or spread them with --client-procs")


MAX_MEM_STALL_SHARE = 0.10  # tasks waiting for memory more than 10% of the window
MAX_SWAP_IN_MB_S = 10.0  # where the kernel has no pressure information: sustained swap-ins
STEAL_REASON = "disturbed: the hypervisor stole"  # how a steal disturbance begins (disturbance.beyond_steal reads)


def steal_limit(wanted: float, share: float = 0.05) -> float:
    """The steal (cores) that disturbs a level whose work wanted `wanted` cores: `share` of it, at least of two
    cores' worth (a level of little work is not disturbed by a tick or two of steal)."""
    return share * max(2.0, wanted)


def disturbance(samples: list[HostSample], window: tuple[float, float] | None, *, cores: int | None = None,
                max_other_cores: float | None = None, max_steal_cores: float | None = None,
                max_steal_share: float = 0.05) -> tuple[dict, list[str]]:
    """(numbers, reasons): other processes' and the hypervisor's share of the CPU inside the window, memory
    pressure, and why the level is disturbed where they pass the thresholds: other processes > max(0.5 core, 25% of
    the cores), steal > `max_steal_share` (5%) of the CPU time that wanted to run, at least two cores' worth (0.1
    core at 5%), some task stalled on memory > 10% of
    the window (else, without pressure information, swap-ins > 10 MB/s).

    Steal is measured against the work, not the cores: a vCPU accrues steal only while it has work, and the server's
    step loop is one thread the GPU waits on: a few % of the work stolen costs a GPU server more than that share of its
    throughput, while healthy starts see next to none (docs/measurement.md, "Where the code's rules came from")."""
    cores = cores or os.cpu_count() or 1
    max_other = max_other_cores if max_other_cores is not None else max(0.5, 0.25 * cores)
    if window is None:
        return {}, []
    inside = [x for x in samples if window[0] <= x.time <= window[1]]
    if len(inside) < 2:
        return {}, []
    a, b = inside[0], inside[-1]
    dt = b.time - a.time
    if dt <= 0:
        return {}, []
    other = max(0.0, ((b.busy_s - a.busy_s) - (b.client_s - a.client_s) - (b.server_s - a.server_s)) / dt)
    steal = max(0.0, (b.steal_s - a.steal_s) / dt)
    wanted = max(0.0, (b.busy_s - a.busy_s) / dt) + steal
    max_steal = max_steal_cores if max_steal_cores is not None else steal_limit(wanted, max_steal_share)
    load = max(x.load1 for x in inside)
    numbers = {"other_cores": round(other, 3), "steal_cores": round(steal, 3), "load1_max": round(load, 2),
               "cores": cores, "client_cores": round(max(0.0, (b.client_s - a.client_s) / dt), 3),
               "server_cores": round(max(0.0, (b.server_s - a.server_s) / dt), 3)}
    reasons = []
    if other > max_other:
        reasons.append(f"disturbed: other processes used {other:.1f} cores of {cores} during the window (the client "
                       f"and the server's processes excluded; limit {max_other:.1f})")
    if steal > max_steal:
        reasons.append(f"{STEAL_REASON} {steal:.2f} cores of the {wanted:.2f} this host's work "
                       f"wanted during the window ({steal / wanted:.0%}; limit {max_steal:.2f}: the server's step loop "
                       f"waits for the CPU it is denied)")
    avail = [x.mem_available_mb for x in inside if x.mem_available_mb is not None]
    if avail:
        numbers["mem_available_mb_min"] = round(min(avail), 1)
    stall, swap = _rate(a, b, "mem_stall_s", dt), _rate(a, b, "swap_in_mb", dt)
    if stall is not None:
        numbers["mem_stall_share"] = round(stall, 4)
        if stall > MAX_MEM_STALL_SHARE:
            reasons.append(f"disturbed: tasks waited for memory {stall:.0%} of the window (/proc/pressure/memory; "
                           f"limit {MAX_MEM_STALL_SHARE:.0%})")
    elif swap is not None:  # no pressure information: swap-ins say it
        numbers["swap_in_mb_s"] = round(swap, 2)
        if swap > MAX_SWAP_IN_MB_S:
            reasons.append(f"disturbed: the host swapped in {swap:.0f} MB/s during the window (limit "
                           f"{MAX_SWAP_IN_MB_S:.0f} MB/s)")
    return numbers, reasons


def _rate(a: HostSample, b: HostSample, attr: str, dt: float) -> float | None:
    """How fast a cumulative counter grew between two samples, per second (None where the kernel lacks it)."""
    x, y = getattr(a, attr), getattr(b, attr)
    return None if x is None or y is None else max(0.0, (y - x) / dt)

