"""GPU telemetry is read from what real drivers print (recorded on an H200, tests/data/gpu) and judged by the
documented thresholds; where there is no GPU it skips cleanly."""

import asyncio
import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from sglperf.environment import gpu
from sglperf.report.drift import gpu_changes
from sglperf.report.plots import level_disturbance
from sglperf.records import GpuSample, HostSample, LevelResult
from sglperf.judge.floor import check_floor
from tests.rundocs import result

DATA = Path(__file__).parent / "data" / "gpu"


def test_the_h200_line_from_the_issue_parses_into_the_fingerprint():
    rows = gpu.parse_inventory("0, NVIDIA H200, 143771, 580.159.04, 1980, 700.00, Enabled, Disabled\n")
    assert rows == [dict(index="0", name="NVIDIA H200", memory_mib="143771", driver="580.159.04",
                         max_sm_clock_mhz="1980", power_limit_w="700.00", ecc="Enabled", mig="Disabled")]


def test_an_idle_h200_reads_as_idle_with_its_clocks_and_power():
    (row,) = gpu.parse_smi((DATA / "h200-idle.csv").read_text())
    assert row["index"] == 0 and row["uuid"].startswith("GPU-71df217d")
    assert (row["sm_mhz"], row["mem_mhz"], row["power_w"], row["power_limit_w"], row["temp_c"]) == \
        (345.0, 3201.0, 78.52, 700.0, 34.0)
    assert gpu.reason_names(row["reasons"]) == ["idle"]


def test_a_busy_h200_at_its_power_limit_is_power_capped_but_not_disturbed():
    rows = [r for line in (DATA / "h200-bf16-gemm.csv").read_text().splitlines() for r in gpu.parse_smi(line)]
    assert len(rows) == 10 and all(gpu.reason_names(r["reasons"]) == ["SW power cap"] for r in rows)
    samples = [GpuSample(float(t), r["index"], r["sm_mhz"], r["mem_mhz"], r["power_w"], r["power_limit_w"],
                         r["temp_c"], r["util_pct"], r["reasons"]) for t, r in enumerate(rows)]
    numbers, reasons = gpu.summarize(samples, (0.0, 9.0))
    assert reasons == []  # capping is how a busy GPU runs (measured): named, never a disturbance
    g = numbers["0"]
    assert g["reasons"] == {"SW power cap": 1.0} and g["samples"] == 10
    assert 1485 <= g["sm_mhz_min"] < g["sm_mhz_mean"] < 1980 and 680 < g["power_w_mean"] < 700
    assert gpu.describe(numbers).startswith("GPU 0: SM 1,530 MHz mean (min 1,485); 690 W of 700 W; 59 C max; "
                                            "clock events: SW power cap 100% of the window")


def test_thermal_slowdown_past_ten_percent_of_the_window_disturbs_the_level_in_words():
    hot = [GpuSample(float(t), 3, 1200.0, 3201.0, 500.0, 700.0, 91.0, 99.0, 0x40 if t < 4 else 0x0)
           for t in range(10)]
    _, reasons = gpu.summarize(hot, (0.0, 9.0))
    assert reasons == ["disturbed: GPU 3 HW thermal slowdown active 40% of the window (limit 10%)"]
    _, none = gpu.summarize(hot[3:], (3.0, 9.0))  # one hot sample of seven: 14% still disturbs
    assert len(none) == 1
    _, quiet = gpu.summarize(hot[4:], (4.0, 9.0))
    assert quiet == []


def test_another_compute_process_on_the_servers_gpu_is_named_unless_it_is_ours_or_invisible():
    rows = gpu.parse_smi((DATA / "h200-idle.csv").read_text())
    uuid = rows[0]["uuid"]
    apps = gpu.parse_apps((DATA / "h200-compute-apps.csv").read_text())
    assert apps == [(uuid, 454, "python3", 874.0)]
    mine = os.getpid()
    visible = [(uuid, mine, "python3", 874.0)]
    assert gpu.samples_from(rows, visible, 1.0, [0], ours={mine})[0].foreign == ()
    (s,) = gpu.samples_from(rows, visible, 1.0, [0], ours=set())
    assert s.foreign == (f"pid {mine} python3 874 MiB",)
    _, reasons = gpu.summarize([s, s], (0.0, 2.0))
    assert reasons == [f"disturbed: GPU 0 ran another compute process during the window: pid {mine} python3 874 MiB"]
    # a pid from another PID namespace (a container's neighbour) cannot be judged: recorded by nvidia-smi, left out
    ghost = [(uuid, 2**22 + 17, "python3", 874.0)]
    assert gpu.samples_from(rows, ghost, 1.0, [0], ours=set())[0].foreign == ()
    assert gpu.samples_from(rows, visible, 1.0, [1], ours=set()) == []  # not one of the server's GPUs


def test_na_fields_and_old_drivers_masks_read_as_unknown_not_as_zero():
    line = "1, GPU-x, NVIDIA H200, 0:0:7.0, [N/A], 3201, 1980, [N/A], 700.00, [Not Supported], 40, 0, 0, 143771, 0x1"
    (row,) = gpu.parse_smi(line)
    assert row["sm_mhz"] is None and row["power_w"] is None and row["power_limit_w"] == 700.0
    assert gpu.parse_smi("garbage\n") == []


def test_nvml_source_reads_the_same_numbers_as_nvidia_smi(monkeypatch):
    """NvmlSource against a stand-in module holding the values nvidia-ml-py returned on the H200 (h200-nvml.txt)."""
    class Err(Exception):
        pass

    class Proc:
        pid, usedGpuMemory = 454, 916455424

    fake = type("pynvml", (), dict(
        NVMLError=Err, NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetCount=staticmethod(lambda: 1), nvmlDeviceGetHandleByIndex=staticmethod(lambda i: i),
        nvmlDeviceGetUUID=staticmethod(lambda h: "GPU-71df217d-3eb4-82a4-7696-59cbac5c3134"),
        nvmlDeviceGetPowerUsage=staticmethod(lambda h: 690691),
        nvmlDeviceGetEnforcedPowerLimit=staticmethod(lambda h: 700000),
        nvmlDeviceGetUtilizationRates=staticmethod(lambda h: (_ for _ in ()).throw(Err("not supported"))),
        nvmlDeviceGetClockInfo=staticmethod(lambda h, k: 1500 if k == 0 else 3201),
        nvmlDeviceGetTemperature=staticmethod(lambda h, k: 59),
        nvmlDeviceGetCurrentClocksEventReasons=staticmethod(lambda h: 0x4),
        nvmlDeviceGetComputeRunningProcesses=staticmethod(lambda h: [Proc()])))
    rows, apps = gpu.NvmlSource(fake).read()
    assert rows == [dict(index=0, uuid="GPU-71df217d-3eb4-82a4-7696-59cbac5c3134", sm_mhz=1500, mem_mhz=3201,
                         power_w=690.691, power_limit_w=700.0, temp_c=59, util_pct=None, reasons=4)]
    assert apps == [("GPU-71df217d-3eb4-82a4-7696-59cbac5c3134", 454, "", 874.0)]


def test_without_a_gpu_the_monitor_records_nothing_and_raises_nothing(monkeypatch):
    monkeypatch.setattr(gpu, "open_source", lambda: None)
    mon = gpu.GpuMonitor(lambda: 0.0, [0])
    stop = asyncio.Event()
    asyncio.run(mon.run(stop))  # returns at once: nothing to sample
    assert mon.samples == [] and mon.error is None


@pytest.mark.skipif(not shutil.which("nvidia-smi"), reason="no NVIDIA GPU here (nvidia-smi not found)")
def test_a_real_gpu_answers_with_a_sample_per_gpu():
    src = gpu.open_source()
    assert src is not None
    rows, _ = src.read()
    assert rows and all(r["sm_mhz"] is not None for r in rows)


def _level(value, ci, g):
    return dataclasses.replace(result(value=value, ci=ci), gpu=g)


def test_a_regression_message_names_what_the_gpu_clocks_did():
    from sglperf.store.baselines import Entry

    g = {"0": dict(samples=10, sm_mhz_mean=1320.0, sm_mhz_min=1200.0, power_w_mean=699.0, power_limit_w=700.0,
                   temp_c_max=60.0, reasons={"SW power cap": 1.0}, foreign=[])}
    entry = Entry(metric="sustained_output_tps", value=1000.0, tolerance=0.05, taken_at="t", source="s",
                  sglperf_version="0")
    v = check_floor(_level(800.0, 10.0, g), entry, where="p/c c8", baseline_source="b.json", log_path=None)
    assert v.outcome == "regression"
    assert "GPU telemetry: GPU 0: SM 1,320 MHz mean (min 1,200); 699 W of 700 W" in v.message
    assert "SW power cap 100% of the window" in v.message
    ok = check_floor(_level(1000.0, 10.0, g), entry, where="p/c c8", baseline_source="b.json", log_path=None)
    assert "GPU telemetry" not in ok.message


def test_drift_names_a_clock_drop_and_a_new_throttle_reason_at_the_step():
    def rec(clock, cap):
        return {"levels": [{"config": "a", "level": 8, "gpu": {"0": {"sm_mhz_mean": clock,
                                                                     "reasons": {"SW power cap": cap}}}}]}
    before, after = [rec(1980, 0.0)] * 4, [rec(1500, 0.9)] * 4
    assert gpu_changes(before, after, "a", 8) == ["SM clock 1,980 → 1,500 MHz mean",
                                                  "SW power cap 0% → 90% of the window"]
    assert gpu_changes(before, before, "a", 8) == []


def test_the_disturbance_plot_draws_host_load_and_gpu_clocks():
    host = [HostSample(float(t), busy_s=1.5 * t, client_s=0.2 * t, server_s=0.3 * t, steal_s=0.0, load1=1.0)
            for t in range(6)]
    gpus = [GpuSample(float(t), 0, 1500.0 + t, 3201.0, 690.0, 700.0, 58.0, 97.0, 0x4) for t in range(6)]
    r: LevelResult = _level(1000.0, 10.0, {})
    png = level_disturbance(0.0, host, [], gpus, r)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_the_host_id_is_the_gpus_uuids_hashed_and_without_gpus_the_machine_id(monkeypatch):
    """One physical GPU is one host whatever VM it is lent in (the H200s of 2026-12-01: one UUID per host start)."""
    from sglperf.environment import fingerprint

    rows = [{"index": "0"}, {"index": "1"}]
    answer = [{"index": "0", "uuid": "GPU-80a8df55"}, {"index": "1", "uuid": "GPU-aef2eb3b"}, {"index": "2",
                                                                                                "uuid": "GPU-other"}]
    monkeypatch.setattr(gpu, "query", lambda what, fields: answer)
    both = fingerprint.host_id(rows)
    assert both == fingerprint.host_id(list(reversed(rows))) and both != fingerprint.host_id(rows[:1])
    assert len(both) == 12 and "GPU" not in both
    if Path("/etc/machine-id").exists():
        assert fingerprint.host_id([]) not in (None, both)
