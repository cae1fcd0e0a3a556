"""Fingerprint: what the numbers depend on outside the code (GPU, driver, CUDA, kernel, library versions, model,
server args), and the hardware class a baseline applies to (GPU model x count).

Why: after a driver, CUDA, kernel or SGLang upgrade the user must see what changed next to how much throughput moved.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from ..categories import UsageError
from . import gpu
from ..redact import SECRET_FLAGS, redact_argv
from ..sim.args import ACCEPT_PIN_ENV, read_accept_pin

# Packages whose versions matter on the server side (PyPI names; the first installed one of each group is used).
PACKAGES = {
    "sglang": ["sglang"],
    "sgl_kernel": ["sglang-kernel", "sgl-kernel"],
    "flashinfer": ["flashinfer-python", "flashinfer"],
    "torch": ["torch"],
    "nccl": ["nvidia-nccl-cu13", "nvidia-nccl-cu12"],
    "transformers": ["transformers"],
    "llama_cpp_python": ["llama-cpp-python"],
}
def os_name() -> str:
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def package_versions() -> dict[str, str | None]:
    out = {}
    for key, names in PACKAGES.items():
        out[key] = None
        for n in names:
            try:
                out[key] = metadata.version(n)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def args_hash(argv: list[str]) -> str:
    """sha256 of the launch command as the profile writes it: placeholders ({python}, {llama_server}, …) unresolved,
    without host/port and the secret flags (redact.SECRET_FLAGS). So the same config hashes the same in every
    checkout, venv and cache, and a hash says nothing of a key."""
    skip, kept, dropped = False, [], ("--host", "--port", *SECRET_FLAGS)
    for a in argv:
        if skip:
            skip = False
            continue
        if a in dropped:
            skip = True
            continue
        if a.startswith(tuple(f + "=" for f in dropped)):
            continue
        kept.append(a)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class FingerprintError(UsageError):
    pass


def overrides_from_env() -> dict:
    """SGLPERF_FINGERPRINT_OVERRIDES: a JSON object whose fields replace measured ones (tests, what-if runs)."""
    text = os.environ.get("SGLPERF_FINGERPRINT_OVERRIDES")
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise FingerprintError(f"SGLPERF_FINGERPRINT_OVERRIDES is not valid JSON ({e.msg} at column "
                               f"{e.colno})") from None
    if not isinstance(obj, dict):
        raise FingerprintError("SGLPERF_FINGERPRINT_OVERRIDES must be a JSON object of fingerprint fields")
    return obj


def cpu_class(hardware_class: str) -> bool:
    """Whether a hardware class is the host's CPU (a server wholly as fast as it), not a GPU's or the simulator's."""
    return hardware_class.startswith("cpu:")


def collect(engine, server_info: dict | None, argv_template: list[str], model_path: str | None,
            server_env: dict | None = None, overrides: dict | None = None, host_speed: dict | None = None,
            workload: str | None = None) -> dict:
    """The run's fingerprint. `engine` is the adapter (it says which hardware the server runs on); `argv_template`
    is the launch command as the profile writes it (hashed); `server_env` is what the server was started with;
    `host_speed` the CPU's speed probe taken before the server started (environment/host_speed.py)."""
    rows = gpu.visible(gpu.inventory(), {**os.environ, **(server_env or {})})
    first = rows[0] if rows else {}
    info = server_info or {}
    fp = {
        "hardware_class": engine.hardware_class(info, argv_template, rows),
        # the GPUs whose telemetry a level samples (gpu.GpuMonitor): the server's, where it uses any
        "gpu_indices": [int(r["index"]) for r in rows if str(r.get("index", "")).isdigit()]
        if engine.uses_gpu(argv_template) else [],
        "gpu_name": first.get("name"), "gpu_count": len(rows), "gpu_memory_mib": first.get("memory_mib"),
        "gpu_max_sm_clock_mhz": first.get("max_sm_clock_mhz"), "gpu_power_limit_w": first.get("power_limit_w"),
        "gpu_ecc": first.get("ecc"), "gpu_mig": first.get("mig"),
        "driver": first.get("driver"), "cuda": gpu.cuda_version() if rows else None,
        "kernel": platform.release(), "os": os_name(), "python": platform.python_version(),
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "host_id": host_id(rows), "host_speed": host_speed,
        **package_versions(),
        "server_version": info.get("version"),
        "model_path": model_path or info.get("model_path"),
        "model_revision": info.get("revision"),
        "server_args_hash": args_hash(argv_template),
        # as the profile writes them, secrets' values replaced: a regression names what changed
        "server_args": " ".join(redact_argv(argv_template[1:])),
        "engine": engine.name,
        "python_executable": sys.executable,
        # speculative decoding's acceptance pinned (SGLang's SGLANG_SIMULATE_ACC_LEN): throughput then measures the
        # verify step alone, and a baseline taken with one pin never judges a run with another
        "spec_accept_pin": accept_pin(server_env),
        # what load the levels sent (profiles.WorkloadSection.describe): a baseline of one workload never judges
        # another
        "workload": workload,
    }
    fp.update(overrides_from_env())
    if overrides:
        fp.update(overrides)
    return fp


def accept_pin(server_env: dict | None) -> float | None:
    """The acceptance length the server is started pinned to (the profile's server env, else this environment), or
    None. A value the server would refuse, or an infinite one (SGLang clamps it to the draft width, which the run
    file could not tell from a pin at the width), is a usage error naming the variable, before anything starts."""
    raw = (server_env or {}).get(ACCEPT_PIN_ENV) or os.environ.get(ACCEPT_PIN_ENV)
    try:
        pin = read_accept_pin(raw)
    except ValueError as e:
        raise UsageError(f"{ACCEPT_PIN_ENV}={raw!r}: {e}, which SGLang refuses at start") from None
    if pin is not None and math.isinf(pin):
        raise UsageError(f"{ACCEPT_PIN_ENV}={raw!r}: pin a finite acceptance length (1 up to the draft's tokens + 1; "
                         f"0 or less turns the pin off)")
    return pin


def host_id(gpu_rows: list[dict]) -> str | None:
    """Which machine: a hash of its GPUs' UUIDs (one physical GPU is one host, whatever VM it is lent in), else of
    /etc/machine-id. What calibrate groups runs by, to tell the host's part of the noise from a restart's."""
    parts = []
    if gpu_rows:
        try:
            uuids = {r.get("index"): r.get("uuid") for r in gpu.query("gpu", "index,uuid")}
            parts = sorted(u for i, u in uuids.items() if u and i in {r.get("index") for r in gpu_rows})
        except (OSError, ValueError):
            parts = []
    if not parts:
        try:
            parts = [Path("/etc/machine-id").read_text().strip()]
        except OSError:
            return None
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12] if any(parts) else None


# Fields whose change is worth naming next to a regression, in the order a reader cares about.
MATTERS = ("hardware_class", "cpu", "cpu_count", "driver", "cuda", "sglang", "sgl_kernel", "flashinfer", "torch",
           "nccl", "transformers",
           "server_version", "kernel", "gpu_power_limit_w", "gpu_max_sm_clock_mhz", "gpu_ecc", "gpu_mig",
           "model_path", "model_revision", "server_args", "server_args_hash", "os", "python", "llama_cpp_python",
           "spec_accept_pin", "workload")


def diff(old: dict, new: dict) -> list[tuple[str, object, object]]:
    return [(k, old.get(k), new.get(k)) for k in MATTERS
            if k in old and k in new and old.get(k) != new.get(k)]


def describe_diff(old: dict, new: dict, lead: str = "environment changed since the baseline") -> str:
    d = diff(old, new)
    if any(k == "server_args" for k, _, _ in d):  # the arguments themselves say more than their hash
        d = [x for x in d if x[0] != "server_args_hash"]
    if any(k == "hardware_class" and str(a).startswith("cpu:") for k, a, _ in d):  # its CPU and cores: named once
        d = [x for x in d if x[0] not in ("cpu", "cpu_count")]
    if not d:
        return ""
    return f"{lead}: " + ", ".join(
        f"server_args {args_change(str(a), str(b))}" if k == "server_args" else f"{k} {a} → {b}" for k, a, b in d)


def args_change(old: str, new: str) -> str:
    """What differs between two command lines, as the arguments removed (-) and added (+)."""
    import difflib

    a, b = old.split(), new.split()
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            parts.append("- " + " ".join(a[i1:i2]))
        if op in ("insert", "replace"):
            parts.append("+ " + " ".join(b[j1:j2]))
    return "(" + "; ".join(parts) + ")" if parts else f"{old} → {new}"
