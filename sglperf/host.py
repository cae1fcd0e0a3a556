"""The host's other load during a level: CPU used by processes that are neither the client nor the server's
process tree, CPU stolen by the hypervisor, and the load average, sampled through the level like the server scrape.

Why: a neighbour that takes the CPU (a pip install, another test run) slows the client or a CPU-bound server, and a
level measured under it must be named INVALID with the cause in words, never reported as a regression.
"""

from __future__ import annotations

import asyncio
import os
from typing import Callable

import psutil

from .records import HostSample


def _busy_and_steal() -> tuple[float, float]:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is counted in user
    return total - idle - steal, steal


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
                 period: float = 0.5):
        self.clock, self.server_pids, self.period = clock, server_pids or (lambda: []), period
        self.samples: list[HostSample] = []
        self._me = psutil.Process()
        self._pids: list[int] = []

    def sample(self) -> HostSample:
        busy, steal = _busy_and_steal()
        own = self._me.cpu_times()
        own_s = own.user + own.system + own.children_user + own.children_system
        if len(self.samples) % 10 == 0:  # finding the tree scans every process: every 5 s is enough
            self._pids = [p for p in self.server_pids() if p != self._me.pid]
        return HostSample(self.clock(), busy, own_s, _cpu_seconds(self._pids), steal, os.getloadavg()[0])

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await asyncio.to_thread(self.sample))
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except asyncio.TimeoutError:
                pass


def disturbance(samples: list[HostSample], window: tuple[float, float] | None, *, cores: int | None = None,
                max_other_cores: float | None = None, max_steal_cores: float | None = None
                ) -> tuple[dict, list[str]]:
    """(numbers, reasons): other processes' and the hypervisor's share of the CPU inside the window, and why the
    level is disturbed where they pass the thresholds: other processes > max(0.5 core, 25% of the cores), steal >
    10% of the cores."""
    cores = cores or os.cpu_count() or 1
    max_other = max_other_cores if max_other_cores is not None else max(0.5, 0.25 * cores)
    max_steal = max_steal_cores if max_steal_cores is not None else 0.1 * cores
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
    load = max(x.load1 for x in inside)
    numbers = {"other_cores": round(other, 3), "steal_cores": round(steal, 3), "load1_max": round(load, 2),
               "cores": cores}
    reasons = []
    if other > max_other:
        reasons.append(f"disturbed: other processes used {other:.1f} cores of {cores} during the window (the client "
                       f"and the server's processes excluded; limit {max_other:.1f})")
    if steal > max_steal:
        reasons.append(f"disturbed: the hypervisor stole {steal:.1f} cores of {cores} during the window "
                       f"(limit {max_steal:.1f})")
    return numbers, reasons

