"""GPU telemetry through a level, about once a second: SM and memory clocks, power draw and limit, temperature, the
clock-event (throttle) reasons, and compute processes that are not the server's. NVML (nvidia-ml-py) where it
imports, else nvidia-smi; nothing (and no error) where there is no GPU.

Why: a GPU that slows down for its environment (too hot, a power brake, another job on it) must make its level
INVALID with the cause in words, never a regression; and a clock or power-cap change that the software under test
caused (a driver that throttles) is a real cause that regression messages and drift name.

Thresholds: thermal slowdowns, HW slowdown and the HW power brake active in more than 10% of a window's samples
disturb it; so does any compute process on the server's GPUs that is visible here and neither the server's nor ours.
The SW power cap does not (a busy GPU runs capped: docs/measurement.md); its share is named beside the clocks.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from typing import Callable

import psutil

from ..categories import InfraError, Unavailable
from ..records import GpuSample

# NVML's nvmlClocksEventReason* bits (nvml.h); nvidia-smi prints the same mask as clocks_event_reasons.active.
REASONS = {0x1: "idle", 0x2: "applications clocks setting", 0x4: "SW power cap", 0x8: "HW slowdown",
           0x10: "sync boost", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake",
           0x100: "display clock setting"}
DISTURBING = 0x8 | 0x20 | 0x40 | 0x80  # the machine's environment slowing the GPU, not the software under test
MAX_DISTURBED_SHARE = 0.10

SMI_FIELDS = ("index,uuid,name,pci.bus_id,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,"
              "enforced.power.limit,temperature.gpu,utilization.gpu,memory.used,memory.total,"
              "clocks_event_reasons.active")
OLD_REASONS_FIELD = "clocks_throttle_reasons.active"  # drivers before 535 name it so
APPS_FIELDS = "gpu_uuid,pid,process_name,used_memory"


def _num(x: str) -> float | None:
    x = x.strip()
    try:
        return float(x)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _mask(x: str) -> int | None:
    x = x.strip()
    try:
        return int(x, 16) if x.lower().startswith("0x") else int(x)
    except ValueError:
        return None


def smi(*args: str, timeout: float = 30.0) -> str:
    """The one way nvidia-smi is run here; OSError (with its words) where it is missing, fails or hangs."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise OSError(f"nvidia-smi {' '.join(args)}: no answer within {timeout:g} s") from None
    if out.returncode != 0:
        raise OSError(out.stdout.strip() or out.stderr.strip() or f"nvidia-smi exited {out.returncode}")
    return out.stdout


def parse_query(text: str, fields: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` (or --query-compute-apps): one dict per row,
    keyed by field; a row of another width is skipped."""
    keys = fields.split(",")
    rows = []
    for line in text.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == len(keys):
            rows.append(dict(zip(keys, parts)))
    return rows


def query(what: str, fields: str) -> list[dict[str, str]]:
    """`what` is "gpu" or "compute-apps"."""
    return parse_query(smi(f"--query-{what}={fields}", "--format=csv,noheader,nounits"), fields)


def parse_smi(text: str) -> list[dict]:
    """Telemetry rows (SMI_FIELDS), numbers as numbers."""
    rows = []
    for d in parse_query(text, SMI_FIELDS):
        try:
            index = int(d["index"])
        except ValueError:
            continue
        rows.append(dict(index=index, uuid=d["uuid"], sm_mhz=_num(d["clocks.sm"]),
                         mem_mhz=_num(d["clocks.mem"]), power_w=_num(d["power.draw"]),
                         power_limit_w=_num(d["enforced.power.limit"]) or _num(d["power.limit"]),
                         temp_c=_num(d["temperature.gpu"]), util_pct=_num(d["utilization.gpu"]),
                         reasons=_mask(d["clocks_event_reasons.active"])))
    return rows


def parse_apps(text: str) -> list[tuple[str, int, str, float | None]]:
    """`--query-compute-apps=APPS_FIELDS`: (gpu uuid, pid, name, MiB)."""
    return [(d["gpu_uuid"], int(d["pid"]), d["process_name"], _num(d["used_memory"]))
            for d in parse_query(text, APPS_FIELDS) if d["pid"].isdigit()]


# --------------------------------------------------------------------------- what is there (fingerprint, preflight)
INVENTORY_FIELDS = "index,name,memory.total,driver_version,clocks.max.sm,power.limit,ecc.mode.current,mig.mode.current"
INVENTORY_KEYS = ["index", "name", "memory_mib", "driver", "max_sm_clock_mhz", "power_limit_w", "ecc", "mig"]
EDITION = re.compile(r"\s+(Server|Workstation|Max-Q Workstation)\s+Edition$", re.I)


def parse_inventory(text: str) -> list[dict]:
    """The fingerprint's GPU rows: INVENTORY_FIELDS under the fingerprint's names."""
    return [dict(zip(INVENTORY_KEYS, d.values())) for d in parse_query(text, INVENTORY_FIELDS)]


def inventory() -> list[dict]:
    """One row per GPU, or [] where there is none (or nvidia-smi does not answer)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        return parse_inventory(smi(f"--query-gpu={INVENTORY_FIELDS}", "--format=csv,noheader,nounits"))
    except OSError:
        return []


def visible(rows: list[dict], env: dict | None = None) -> list[dict]:
    """The GPUs a process started with `env` sees: CUDA_VISIBLE_DEVICES (indices) filters them."""
    env = os.environ if env is None else env
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return rows
    wanted = [x.strip() for x in spec.split(",") if x.strip()]
    return [r for r in rows if r.get("index") in wanted]


def gpu_model(name: str) -> str:
    """'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'NVIDIA RTX PRO 6000 Blackwell'."""
    return EDITION.sub("", name.strip())


def gpu_class(rows: list[dict]) -> str:
    names = {gpu_model(g["name"]) for g in rows}
    return f"{len(rows)} x {' + '.join(sorted(names))}"


def cuda_version() -> str | None:
    try:
        m = re.search(r"CUDA Version:\s*([\d.]+)", smi()) if shutil.which("nvidia-smi") else None
    except OSError:
        return None
    return m.group(1) if m else None


def compute_apps() -> list[tuple[str, int, str, float | None]]:
    """Every compute process on this host's GPUs: (gpu uuid, pid, name, MiB); [] where nvidia-smi does not say."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        return parse_apps(smi(f"--query-compute-apps={APPS_FIELDS}", "--format=csv,noheader,nounits", timeout=10))
    except OSError:
        return []


def preflight(count: int, kind: str | None) -> None:
    """The GPUs a profile needs: absent -> Unavailable (skip with the reason); present but wrong or busy -> fail."""
    want = f"{count} {kind or 'NVIDIA'} GPU{'s' if count != 1 else ''}"
    if not shutil.which("nvidia-smi"):
        raise Unavailable(f"no NVIDIA GPU here (nvidia-smi not found): this profile needs {want}; run "
                          f"`pytest perf_tests -m sim` for the simulator")
    rows = visible(inventory())
    if not rows:
        raise Unavailable(f"nvidia-smi found but it lists no GPU: this profile needs {want}")
    names = sorted({r["name"] for r in rows})
    if len(rows) < count or not all((kind or "").lower() in r["name"].lower() for r in rows):
        raise InfraError(f"this profile needs {want}; this machine shows {len(rows)}: {names}")
    apps = compute_apps()
    if apps:
        raise InfraError("foreign processes hold GPU memory, measurements would be wrong:\n" + "\n".join(
            f"pid {pid} {name} {'' if mib is None else f'{mib:.0f} MiB'}" for _, pid, name, mib in apps))


def wait_for_release(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """Where GPUs exist, wait until none of `pids` holds GPU memory (driver teardown is asynchronous); the pids
    still holding it when the wait gives up."""
    if not shutil.which("nvidia-smi") or not pids:
        return []
    deadline = time.monotonic() + timeout_s
    holding: list[int] = []
    while time.monotonic() < deadline:
        holding = sorted({pid for _, pid, _, _ in compute_apps()} & set(pids))
        if not holding:
            return []
        time.sleep(1.0)
    return holding


# --------------------------------------------------------------------------- telemetry sources
class SmiSource:
    name = "nvidia-smi"

    def __init__(self):
        self.fields = SMI_FIELDS

    def read(self) -> tuple[list[dict], list[tuple[str, int, str, float | None]]]:
        try:
            text = smi(f"--query-gpu={self.fields}", "--format=csv,noheader,nounits", timeout=10)
        except OSError:
            if self.fields != SMI_FIELDS:
                raise
            self.fields = SMI_FIELDS.replace("clocks_event_reasons.active", OLD_REASONS_FIELD)
            text = smi(f"--query-gpu={self.fields}", "--format=csv,noheader,nounits", timeout=10)
        return parse_smi(text), parse_apps(smi(f"--query-compute-apps={APPS_FIELDS}", "--format=csv,noheader,nounits",
                                               timeout=10))


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml):
        self.n = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def _try(self, f, *a):
        try:
            return f(*a)
        except self.n.NVMLError:
            return None

    def read(self) -> tuple[list[dict], list[tuple[str, int, str, float | None]]]:
        n, rows, apps = self.n, [], []
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        for i, h in enumerate(self.handles):
            uuid = self._try(n.nvmlDeviceGetUUID, h) or str(i)
            power, limit = self._try(n.nvmlDeviceGetPowerUsage, h), self._try(n.nvmlDeviceGetEnforcedPowerLimit, h)
            util = self._try(n.nvmlDeviceGetUtilizationRates, h)
            rows.append(dict(index=i, uuid=uuid, sm_mhz=self._try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                             mem_mhz=self._try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
                             power_w=None if power is None else power / 1000,
                             power_limit_w=None if limit is None else limit / 1000,
                             temp_c=self._try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
                             util_pct=None if util is None else util.gpu, reasons=self._try(reasons, h)))
            for p in self._try(n.nvmlDeviceGetComputeRunningProcesses, h) or []:
                mem = p.usedGpuMemory
                apps.append((uuid, p.pid, "", None if mem is None else mem / 2**20))
        return rows, apps


def open_source():
    """NVML, else nvidia-smi, else None (no GPU here: telemetry is skipped, not failed)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            return NvmlSource(pynvml)
    except Exception:  # no library, no driver, no device: NVML raises its own error kinds for each
        pass
    if shutil.which("nvidia-smi"):
        try:
            src = SmiSource()
            if src.read()[0]:
                return src
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def samples_from(rows: list[dict], apps: list[tuple[str, int, str, float | None]], t: float,
                 indices: list[int] | None, ours: set[int]) -> list[GpuSample]:
    """GpuSamples for the GPUs in `indices` (all where None). A compute process is foreign when this host can see
    it and it is neither ours nor the server's; one from another PID namespace cannot be judged and is left out."""
    out = []
    for r in rows:
        if indices is not None and r["index"] not in indices:
            continue
        foreign = tuple(f"pid {pid}{' ' + name if name else ''}{'' if mib is None else f' {mib:.0f} MiB'}"
                        for uuid, pid, name, mib in apps
                        if uuid == r["uuid"] and pid not in ours and psutil.pid_exists(pid))
        out.append(GpuSample(t, r["index"], r["sm_mhz"], r["mem_mhz"], r["power_w"], r["power_limit_w"],
                             r["temp_c"], r["util_pct"], r["reasons"], foreign))
    return out


class GpuMonitor:
    """Samples the server's GPUs every `period` seconds until stopped; does nothing where no GPU answers."""

    def __init__(self, clock: Callable[[], float], indices: list[int] | None,
                 server_pids: Callable[[], list[int]] | None = None, period: float = 1.0, source=None):
        self.clock, self.indices, self.period = clock, indices, period
        self.server_pids = server_pids or (lambda: [])
        self.source = source
        self.samples: list[GpuSample] = []
        self.error: str | None = None

    def sample(self) -> list[GpuSample]:
        rows, apps = self.source.read()
        ours = {os.getpid(), *self.server_pids()}
        return samples_from(rows, apps, self.clock(), self.indices, ours)

    async def run(self, stop: asyncio.Event) -> None:
        if self.source is None:
            self.source = await asyncio.to_thread(open_source)
            if self.source is None:
                return
        while not stop.is_set():
            try:
                self.samples.extend(await asyncio.to_thread(self.sample))
            except (OSError, subprocess.TimeoutExpired) as e:
                self.error = f"GPU telemetry stopped: {e}"  # recorded, never fatal to the level
                return
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except asyncio.TimeoutError:
                pass


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def summarize(samples: list[GpuSample], window: tuple[float, float] | None) -> tuple[dict, list[str]]:
    """(numbers per GPU index, disturbance reasons) inside the window."""
    if window is None:
        return {}, []
    inside = [s for s in samples if window[0] <= s.time <= window[1]]
    numbers, reasons = {}, []
    for idx in sorted({s.index for s in inside}):
        mine = [s for s in inside if s.index == idx]
        masks = [s.reasons for s in mine if s.reasons is not None]
        shares = {name: round(sum(1 for m in masks if m & bit) / len(masks), 3)
                  for bit, name in REASONS.items() if any(m & bit for m in masks)} if masks else {}

        def col(attr):
            return [getattr(s, attr) for s in mine if getattr(s, attr) is not None]

        sm, power, limit, temp = col("sm_mhz"), col("power_w"), col("power_limit_w"), col("temp_c")
        foreign = sorted({f for s in mine for f in s.foreign})
        numbers[str(idx)] = dict(
            samples=len(mine), sm_mhz_mean=_mean(sm), sm_mhz_min=min(sm, default=None),
            mem_mhz_mean=_mean(col("mem_mhz")), power_w_mean=_mean(power),
            power_limit_w=max(limit, default=None), temp_c_max=max(temp, default=None),
            util_pct_mean=_mean(col("util_pct")), reasons=shares, foreign=foreign)
        for bit, name in REASONS.items():
            if bit & DISTURBING and masks:
                share = sum(1 for m in masks if m & bit) / len(masks)
                if share > MAX_DISTURBED_SHARE:
                    reasons.append(f"disturbed: GPU {idx} {name} active {share:.0%} of the window "
                                   f"(limit {MAX_DISTURBED_SHARE:.0%})")
        if foreign:
            reasons.append(f"disturbed: GPU {idx} ran another compute process during the window: "
                           + ", ".join(foreign))
    return numbers, reasons


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 1) if xs else None


def describe(numbers: dict) -> str:
    """One line per GPU for regression messages and drift: clocks, power and the active clock-event reasons."""
    parts = []
    for idx, g in sorted(numbers.items()):
        bits = []
        if g.get("sm_mhz_mean") is not None:
            bits.append(f"SM {g['sm_mhz_mean']:,.0f} MHz mean (min {g['sm_mhz_min']:,.0f})")
        if g.get("power_w_mean") is not None:
            lim = g.get("power_limit_w")
            bits.append(f"{g['power_w_mean']:,.0f} W" + (f" of {lim:,.0f} W" if lim else ""))
        if g.get("temp_c_max") is not None:
            bits.append(f"{g['temp_c_max']:.0f} C max")
        active = [f"{name} {share:.0%}" for name, share in g.get("reasons", {}).items() if name != "idle"]
        if active:
            bits.append("clock events: " + ", ".join(active) + " of the window")
        if bits:
            parts.append(f"GPU {idx}: " + "; ".join(bits))
    return " | ".join(parts)
