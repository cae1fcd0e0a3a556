"""GPU faults during a level: Xid errors, volatile uncorrected ECC errors that increase, retired or pending memory
pages and remapped rows, a GPU that no longer answers (fallen off the bus). NVML (nvidia-ml-py) where it imports,
else nvidia-smi for the counters and the kernel log (/dev/kmsg, where this user may read it) for Xids; nothing where
there is no GPU.

Why: a kernel, driver or GPU that breaks can make the server faster. A level during which the GPU reported a fault
measured a broken machine: it is INVALID naming the fault, never a pass, a regression or a baseline point. Any one
fault is enough: a healthy GPU reports none (docs/gpu-proof.md).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

from .gpu import parse_query, smi

# The Xids a serving GPU meets, in the words of NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors). The ones a
# program causes (13, 31, 43) are named too: a kernel that faults is the software under test breaking.
XID_MEANING = {
    8: "GPU stopped processing", 13: "graphics engine exception", 31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream", 38: "driver firmware error", 43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors", 48: "double bit ECC error", 56: "display engine error",
    57: "error programming video memory interface", 61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 68: "video processor exception",
    69: "graphics engine class error", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    109: "context switch timeout error", 119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link corrected error",
    140: "unrecovered ECC error", 143: "GPU initialization failure", 154: "GPU recovery action changed",
}

HEALTH_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "retired_pages.sbe", "retired_pages.dbe",
                 "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure")
KMSG_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)(?:, (.*))?")
LOST_WORDS = ("gpu is lost", "fallen off the bus", "unknown error")


def xid_words(xid: int) -> str:
    return f"Xid {xid} ({XID_MEANING.get(xid, 'see the Xid catalog')})"


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's fault counters at one moment; None where the driver does not say (e.g. no ECC, no retirement)."""

    index: int
    ecc_uncorrected: int | None = None  # volatile: since the driver loaded
    retired_pages: int | None = None  # single- and double-bit causes together
    pages_pending: bool | None = None  # a page retirement waits for a GPU reset
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    lost: str | None = None  # the driver's words where the GPU no longer answers


def faults_between(before: GpuHealth | None, after: GpuHealth) -> list[str]:
    """What went wrong on one GPU between two readings (a pending retirement or remap counts wherever it shows)."""
    g, out = after.index, []
    if after.lost:
        out.append(f"GPU {g} no longer answers (fallen off the bus?): {after.lost}")
        return out
    b = before or GpuHealth(g)
    if None not in (b.ecc_uncorrected, after.ecc_uncorrected) and after.ecc_uncorrected > b.ecc_uncorrected:
        out.append(f"GPU {g}: {after.ecc_uncorrected - b.ecc_uncorrected} volatile uncorrected ECC error(s) during "
                   f"the level (count {b.ecc_uncorrected} -> {after.ecc_uncorrected})")
    if None not in (b.retired_pages, after.retired_pages) and after.retired_pages > b.retired_pages:
        out.append(f"GPU {g} retired {after.retired_pages - b.retired_pages} memory page(s) during the level "
                   f"({b.retired_pages} -> {after.retired_pages})")
    if after.pages_pending:
        out.append(f"GPU {g} has a memory page retirement pending (the driver needs a GPU reset)")
    if after.remap_pending:
        out.append(f"GPU {g} has a memory row remapping pending (the driver needs a GPU reset)")
    if after.remap_failed and not b.remap_failed:
        out.append(f"GPU {g}: a memory row remapping failed")
    return out


# --------------------------------------------------------------------------- NVML
class NvmlFaults:
    """Counters by query, Xids by NVML's event set for critical Xid errors (registered where the GPU supports it)."""

    name = "nvml"

    def __init__(self, nvml, indices: list[int]):
        self.n, self.indices = nvml, indices
        self.handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        self.events = None
        try:
            es = nvml.nvmlEventSetCreate()
            registered = 0
            for h in self.handles.values():
                try:
                    nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
                    registered += 1
                except nvml.NVMLError:
                    pass  # NOT_SUPPORTED on some boards: their counters are still read
            self.events = es if registered else None
            if not registered:
                nvml.nvmlEventSetFree(es)
        except nvml.NVMLError:
            pass

    def _code(self, e) -> int | None:
        return getattr(e, "value", None)

    def _lost(self, e) -> str | None:
        return str(e) if self._code(e) in (self.n.NVML_ERROR_GPU_IS_LOST, self.n.NVML_ERROR_UNKNOWN) else None

    def health(self) -> list[GpuHealth]:
        n, out = self.n, []
        for i, h in self.handles.items():
            def get(f, *a):
                try:
                    return f(h, *a)
                except n.NVMLError as e:
                    if self._lost(e):
                        raise
                    return None
            try:
                ecc = get(n.nvmlDeviceGetTotalEccErrors, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
                pages = [get(n.nvmlDeviceGetRetiredPages, c) for c in
                         (n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                          n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)]
                pending = get(n.nvmlDeviceGetRetiredPagesPendingStatus)
                rows = get(n.nvmlDeviceGetRemappedRows)  # (correctable, uncorrectable, pending, failure)
            except n.NVMLError as e:
                out.append(GpuHealth(i, lost=f"NVML: {e}"))
                continue
            out.append(GpuHealth(
                i, ecc_uncorrected=None if ecc is None else int(ecc),
                retired_pages=None if None in pages else sum(len(p) for p in pages),
                pages_pending=None if pending is None else bool(pending),
                remap_pending=None if rows is None else bool(rows[2]),
                remap_failed=None if rows is None else bool(rows[3])))
        return out

    def xids(self, wait_ms: int) -> list[tuple[int | None, int, str]]:
        """(GPU index, Xid, words) for each critical Xid event, waiting up to `wait_ms` for the first."""
        if self.events is None:
            return []
        n, out = self.n, []
        for _ in range(64):  # bounded: a storm of Xids is named by its first 64
            try:
                ev = n.nvmlEventSetWait_v2(self.events, wait_ms if not out else 0)
            except n.NVMLError as e:
                if self._code(e) == n.NVML_ERROR_TIMEOUT:
                    break
                out.append((None, 0, f"NVML stopped reporting events: {e}"))
                break
            try:
                idx = int(n.nvmlDeviceGetIndex(ev.device))
            except n.NVMLError:
                idx = None
            if idx is None or idx in self.indices:
                out.append((idx, int(ev.eventData), xid_words(int(ev.eventData))))
        return out

    def close(self) -> None:
        if self.events is not None:
            try:
                self.n.nvmlEventSetFree(self.events)
            except self.n.NVMLError:
                pass
            self.events = None


# --------------------------------------------------------------------------- nvidia-smi and the kernel log
def _int(x: str) -> int | None:
    try:
        return int(float(x.strip()))
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _yes(x: str) -> bool | None:
    x = x.strip().lower()
    return True if x == "yes" else False if x == "no" else None


def parse_smi_health(text: str, fields: tuple[str, ...]) -> list[GpuHealth]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` with FIELDS a subset of HEALTH_FIELDS."""
    out = []
    for d in parse_query(text, ",".join(fields)):
        idx = _int(d["index"])
        if idx is None:
            continue
        sbe, dbe = _int(d.get("retired_pages.sbe", "")), _int(d.get("retired_pages.dbe", ""))
        out.append(GpuHealth(
            idx, ecc_uncorrected=_int(d.get("ecc.errors.uncorrected.volatile.total", "")),
            retired_pages=None if sbe is None or dbe is None else sbe + dbe,
            pages_pending=_yes(d.get("retired_pages.pending", "")),
            remap_pending=_yes(d.get("remapped_rows.pending", "")),
            remap_failed=_yes(d.get("remapped_rows.failure", ""))))
    return out


def parse_kmsg_xids(records: list[str]) -> list[tuple[str, int, str]]:
    """(PCI address, Xid, the driver's words) from kernel log lines ("NVRM: Xid (PCI:0000:3b:00): 79, pid=...")."""
    out = []
    for line in records:
        m = KMSG_XID.search(line)
        if m:
            out.append((m.group(1).lower(), int(m.group(2)), (m.group(3) or "").strip()))
    return out


def pci_key(bus_id: str) -> str:
    """'00000000:3B:00.0' and '0000:3b:00' -> '3b:00' (the kernel log drops the domain's high digits)."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


class KernelLog:
    """New records of /dev/kmsg since it was opened (each read() returns one record; EAGAIN: none left)."""

    def __init__(self, path: str = "/dev/kmsg"):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def read(self) -> list[str]:
        out = []
        for _ in range(10000):
            try:
                out.append(os.read(self.fd, 8192).decode("utf-8", "replace"))
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them: go on from the next
                    continue
                raise
        return out

    def close(self) -> None:
        os.close(self.fd)


_SMI_FIELDS: tuple[str, ...] | None = None


def smi_health_fields() -> tuple[str, ...]:
    """The HEALTH_FIELDS this driver's nvidia-smi knows (an unknown field fails the whole query), asked once."""
    global _SMI_FIELDS
    if _SMI_FIELDS is None:
        known = []
        for f in HEALTH_FIELDS:
            try:
                smi(f"--query-gpu={f}", "--format=csv,noheader,nounits", timeout=10)
                known.append(f)
            except OSError:
                pass
        _SMI_FIELDS = tuple(known)
    return _SMI_FIELDS


class SmiFaults:
    name = "nvidia-smi"

    def __init__(self, indices: list[int]):
        self.indices, self.fields = indices, smi_health_fields()
        self.pci = {pci_key(d["pci.bus_id"]): int(d["index"])
                    for d in parse_query(smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader"),
                                         "index,pci.bus_id") if d["index"].isdigit()}
        try:
            self.kmsg: KernelLog | None = KernelLog()
            self.name = "nvidia-smi and the kernel log"
        except OSError:
            self.kmsg = None
            self.name = "nvidia-smi (no Xid source: the kernel log is not readable here)"

    def health(self) -> list[GpuHealth]:
        if "index" not in self.fields:
            return []
        try:
            text = smi(f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits", timeout=10)
        except OSError as e:
            if any(w in str(e).lower() for w in LOST_WORDS):
                return [GpuHealth(i, lost=f"nvidia-smi: {e}") for i in self.indices]
            raise
        return [h for h in parse_smi_health(text, self.fields) if h.index in self.indices]

    def xids(self, wait_ms: int) -> list[tuple[int | None, int, str]]:
        if self.kmsg is None:
            return []
        out = []
        for pci, xid, words in parse_kmsg_xids(self.kmsg.read()):
            idx = self.pci.get(pci_key(pci))
            if idx is None or idx in self.indices:
                out.append((idx, xid, xid_words(xid) + (f": {words}" if words else "")))
        return out

    def close(self) -> None:
        if self.kmsg is not None:
            self.kmsg.close()
            self.kmsg = None


def open_faults(indices: list[int]):
    """NVML, else nvidia-smi, else None (no GPU here: nothing to watch)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlFaults(pynvml, indices)
    except Exception:  # no library, no driver, no device: NVML raises its own error kinds for each
        pass
    if shutil.which("nvidia-smi"):
        try:
            return SmiFaults(indices)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


class FaultWatch:
    """Watches the server's GPUs through a level: counters read at its start and end, Xid events as they come.
    `faults` says what went wrong, in words; empty on a healthy GPU."""

    def __init__(self, clock: Callable[[], float], indices: list[int], period: float = 1.0, source=None):
        self.clock, self.indices, self.period, self.source = clock, indices, period, source
        self.faults: list[str] = []
        self.error: str | None = None
        self.started: float | None = None

    def _xids(self, wait_ms: int) -> None:
        for idx, xid, words in self.source.xids(wait_ms):
            at = f" {self.clock() - self.started:.1f} s into the level" if self.started is not None else ""
            fault = f"GPU {'?' if idx is None else idx}: {words}{at}" if xid else words
            if fault not in self.faults:
                self.faults.append(fault)

    async def run(self, stop: asyncio.Event) -> None:
        if self.source is None:
            self.source = await asyncio.to_thread(open_faults, self.indices)
            if self.source is None:
                return
        self.started = self.clock()
        try:
            before = {h.index: h for h in await asyncio.to_thread(self.source.health)}
            while not stop.is_set():
                await asyncio.to_thread(self._xids, int(self.period * 500))
                try:
                    await asyncio.wait_for(stop.wait(), self.period / 2)
                except asyncio.TimeoutError:
                    pass
            await asyncio.to_thread(self._xids, 0)
            for h in await asyncio.to_thread(self.source.health):
                self.faults += [f for f in faults_between(before.get(h.index), h) if f not in self.faults]
        except (OSError, subprocess.TimeoutExpired) as e:
            self.error = f"GPU fault watch stopped: {e}"  # recorded, never fatal to the level
        finally:
            await asyncio.to_thread(self.source.close)
