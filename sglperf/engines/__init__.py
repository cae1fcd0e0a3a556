"""Engine adapters: one module per engine. `get(name)` for a profile's engine, `detect(url)` for a running server.

Nothing outside this package asks which engine it is: it asks the adapter.
"""

from __future__ import annotations

from ..categories import InfraError
from .base import Engine, FlagCheck, Series, check_url, describe_status, http_get
from .llamacpp import LlamaCpp
from .openai import OpenAI
from .sglang import SGLang
from .sim import Sim

ENGINES: dict[str, type[Engine]] = {e.name: e for e in (SGLang, Sim, LlamaCpp, OpenAI)}
NAMES = tuple(ENGINES)


def get(name: str) -> Engine:
    try:
        return ENGINES[name]()
    except KeyError:
        raise ValueError(f"unknown engine {name!r} (known: {', '.join(NAMES)})") from None


def detect(url: str, api_key: str | None = None, timeout: float = 5.0) -> Engine:
    """Which engine serves `url`: SGLang's /server_info (the simulator adds its own block), llama.cpp's /props,
    else a plain OpenAI-compatible server. Nothing there, or no answer, is an InfraError in words."""
    for path in ("/server_info", "/props"):
        r = http_get(url.rstrip("/") + path, api_key, timeout)
        if r.status_code in (401, 403):  # a refused key is not "some other server"
            raise InfraError(f"{url.rstrip('/')}{path} answered {describe_status(r)}")
        try:
            obj = r.json() if r.status_code == 200 else None
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if path == "/server_info" and "max_total_num_tokens" in obj:
            return Sim() if "sglperf_simulator" in obj else SGLang()
        if path == "/props" and "total_slots" in obj:
            return LlamaCpp()
    return OpenAI()


__all__ = ["ENGINES", "NAMES", "Engine", "FlagCheck", "Series", "check_url", "detect", "get"]
