"""GPU faults during a level, judged from what real drivers answered (an H200's NVML and nvidia-smi recordings in
tests/data/gpu) with a fault planted on top: a healthy GPU is quiet, an Xid, an ECC count that moves or a lost GPU
makes the level INVALID naming it. NVML's constants and error kinds are nvidia-ml-py's own."""

import asyncio
import json
import time
import types
from pathlib import Path

import pynvml
import pytest

from sglperf import engines
from sglperf.environment import gpu_faults
from sglperf.environment.gpu_faults import FaultWatch, GpuHealth, NvmlFaults, faults_between
from sglperf.measure.client import Target, Workload, run_loop
from sglperf.measure.level import LevelSpec, ServerWatch, measure_level
from sglperf.measure.metrics import MeasurementPolicy

DATA = Path(__file__).parent / "data" / "gpu"


def replay(recording: dict, *, xids=(), ecc_later: int | None = None, lost_later: bool = False):
    """An NVML that answers as the recorded GPU did. Planted: critical Xid events (each wait returns the next),
    and from the second health reading on, another volatile uncorrected ECC count or a lost GPU."""
    dev = recording["devices"][0]
    events, reads = list(xids), {"n": 0}

    def answer(key):
        v = dev[key]
        if isinstance(v, str) and v.startswith("NVMLError: "):
            code = {"Not Supported": pynvml.NVML_ERROR_NOT_SUPPORTED, "Timeout": pynvml.NVML_ERROR_TIMEOUT}
            raise pynvml.NVMLError(code[v.split(": ", 1)[1]])
        return v

    def later():
        if lost_later and reads["n"] > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def ecc(h, error_type, counter):
        reads["n"] += 1
        later()
        assert (error_type, counter) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return ecc_later if ecc_later is not None and reads["n"] > 1 else answer("ecc_volatile_uncorrected")

    def wait(es, ms):
        if events:
            return types.SimpleNamespace(device=0, eventData=events.pop(0))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    consts = {k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML_", "nvmlEventType"))}
    return types.SimpleNamespace(
        **consts, NVMLError=pynvml.NVMLError,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetIndex=lambda h: h,
        nvmlEventSetCreate=lambda: "set", nvmlEventSetFree=lambda es: None,
        nvmlDeviceRegisterEvents=lambda h, kinds, es: None, nvmlEventSetWait_v2=wait,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRetiredPages=lambda h, cause: answer(f"retired_pages_{'sbe' if cause == 0 else 'dbe'}"),
        nvmlDeviceGetRetiredPagesPendingStatus=lambda h: answer("retired_pages_pending"),
        nvmlDeviceGetRemappedRows=lambda h: (later(), answer("remapped_rows"))[1])


@pytest.fixture
def h200():
    return json.loads((DATA / "h200-nvml-health.json").read_text())


def watch(source, seconds=0.3) -> FaultWatch:
    w = FaultWatch(time.monotonic, [0], period=0.1, source=source)

    async def level():
        stop = asyncio.Event()
        task = asyncio.create_task(w.run(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await task
    asyncio.run(level())
    return w


def test_the_healthy_h200_as_recorded_reports_no_fault(h200):
    src = NvmlFaults(replay(h200), [0])
    assert src.health() == [GpuHealth(0, ecc_uncorrected=0, retired_pages=None, pages_pending=None,
                                      remap_pending=False, remap_failed=False)]
    w = watch(src)
    assert w.faults == [] and w.error is None


def test_an_xid_during_the_level_is_named_with_its_meaning(h200):
    w = watch(NvmlFaults(replay(h200, xids=[79]), [0]))
    assert len(w.faults) == 1
    assert w.faults[0].startswith("GPU 0: Xid 79 (GPU has fallen off the bus)") and "s into the level" in w.faults[0]


def test_an_uncorrected_ecc_count_that_moves_is_a_fault_and_a_steady_one_is_not(h200):
    w = watch(NvmlFaults(replay(h200, ecc_later=2), [0]))
    assert w.faults == ["GPU 0: 2 volatile uncorrected ECC error(s) during the level (count 0 -> 2)"]
    assert watch(NvmlFaults(replay(h200, ecc_later=0), [0])).faults == []


def test_a_gpu_that_stops_answering_is_lost_in_nvmls_words(h200):
    w = watch(NvmlFaults(replay(h200, lost_later=True), [0]))
    assert w.faults == ["GPU 0 no longer answers (fallen off the bus?): NVML: GPU is lost"]


def test_pending_retirements_and_failed_remaps_are_faults_wherever_they_show():
    before = GpuHealth(0, 0, 3, False, False, False)
    assert faults_between(before, GpuHealth(0, 0, 3, False, False, False)) == []  # old retired pages: history
    assert faults_between(before, GpuHealth(0, 0, 4, True, True, True)) == [
        "GPU 0 retired 1 memory page(s) during the level (3 -> 4)",
        "GPU 0 has a memory page retirement pending (the driver needs a GPU reset)",
        "GPU 0 has a memory row remapping pending (the driver needs a GPU reset)",
        "GPU 0: a memory row remapping failed"]


def test_nvidia_smi_health_as_the_h200_printed_it():
    fields = gpu_faults.HEALTH_FIELDS
    (h,) = gpu_faults.parse_smi_health((DATA / "h200-smi-health.csv").read_text(), fields)
    assert h == GpuHealth(0, ecc_uncorrected=0, retired_pages=None, pages_pending=None, remap_pending=False,
                          remap_failed=False)
    assert gpu_faults.parse_smi_health("0, 1, 0, 2, Yes, No, No\n", fields) == [
        GpuHealth(0, ecc_uncorrected=1, retired_pages=2, pages_pending=True, remap_pending=False, remap_failed=False)]


def test_kernel_log_xids_map_to_the_gpu_by_its_pci_address():
    (pci,) = [line.split(", ")[1].strip() for line in (DATA / "h200-smi-pci.csv").read_text().splitlines()]
    line = "3,1024,912345678,-;NVRM: Xid (PCI:0000:00:06): 48, pid=4242, name=python3, Ch 00000008"
    (got,) = gpu_faults.parse_kmsg_xids(["6,1,2,-;NVRM: loading NVIDIA UNIX Open Kernel Module", line])
    assert got == ("0000:00:06", 48, "pid=4242, name=python3, Ch 00000008")
    assert gpu_faults.pci_key(got[0]) == gpu_faults.pci_key(pci) == "00:06"
    assert gpu_faults.xid_words(48) == "Xid 48 (double bit ECC error)"


def test_a_level_during_which_the_gpu_faulted_is_invalid_naming_it(start_sim, h200, monkeypatch):
    """The simulator serves; the fault watch reads the replayed H200 with an Xid 79 planted: the numbers may look
    fine, the level is INVALID and says why."""
    monkeypatch.setattr(gpu_faults, "open_faults", lambda indices: NvmlFaults(replay(h200, xids=[79]), indices))
    srv = start_sim("--max-running-requests", "8")
    meas = run_loop(measure_level(Target(srv.url), Workload(32, 32), LevelSpec(concurrency=8, max_seconds=15),
                                  MeasurementPolicy(ci_target=0.05), engine=engines.get("sim"),
                                  watch=ServerWatch(pids=srv.tree_pids, gpus=[0])))
    r = meas.result
    assert not r.valid and r.sustained_output_tps  # measured and shown, never passed
    assert [x for x in r.invalid_reasons if x.startswith("GPU fault: GPU 0: Xid 79 (GPU has fallen off the bus)")]
    assert r.gpu_faults and r.gpu_faults[0] in r.invalid_reasons
