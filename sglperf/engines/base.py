"""What every engine adapter answers, with the defaults of a plain OpenAI-compatible server.

Why adapters: what differs between engines (launch argv, readiness, server info and capacity, cache flush,
server-side series, connection policy, accepted request shapes, hardware) lives in one class per engine; the
client, level runner, verdicts, fingerprint, CLI and suite ask the adapter and never which engine it is.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field, replace

from urllib.parse import urlsplit

import requests
from prometheus_client.parser import text_string_to_metric_families

from ..categories import InfraError, UsageError
from ..records import FULL, Ceiling, ServerSample, Shape
from ..redact import auth_headers, redact, redact_url, without_userinfo


@dataclass(frozen=True)
class Series:
    """One Prometheus sample an engine exposes, read into a canonical ServerSample field."""

    sample: str
    labels: dict = field(default_factory=dict)  # a value ending in "*" matches every value with that prefix
    combine: str = "sum"  # over label sets (TP/DP ranks, is_streaming): "sum" for counts, "mean" for ratios

    def matches(self, name: str, labels: dict) -> bool:
        return name == self.sample and all(
            labels.get(k, "").startswith(v[:-1]) if v.endswith("*") else labels.get(k) == v
            for k, v in self.labels.items())


@dataclass(frozen=True)
class FlagCheck:
    """Which parser judged a launch command, and what it found (warnings: the engine itself has the last word)."""

    source: str
    problems: tuple[str, ...] = ()


def describe_status(r: requests.Response) -> str:
    text = " ".join(r.text[:200].split()) or "(empty body)"
    hint = " (is SGLPERF_API_KEY set, and right?)" if r.status_code in (401, 403) else ""
    return f"HTTP {r.status_code}: {text}{hint}"


def http_get(url: str, api_key: str | None, timeout: float) -> requests.Response:
    """GET with a bounded wait; what went wrong, in words, as an InfraError."""
    where = urlsplit(url).netloc
    try:
        return requests.get(url, headers=auth_headers(api_key), timeout=timeout)
    except requests.exceptions.SSLError as e:
        raise InfraError(f"TLS handshake with {where} failed ({e.__class__.__name__}): is the server "
                         f"http://?") from None
    except requests.exceptions.ConnectTimeout:
        raise InfraError(f"no connection to {where} within {timeout:g} s") from None
    except requests.exceptions.ReadTimeout:
        raise InfraError(f"{url}: no response within {timeout:g} s (the connection was accepted)") from None
    except requests.exceptions.ConnectionError as e:
        text = str(e)
        if "Connection refused" in text:
            raise InfraError(f"connection refused at {where}: nothing listens there") from None
        if "Name or service not known" in text or "nodename nor servname" in text:
            raise InfraError(f"cannot resolve the host of {where}") from None
        raise InfraError(f"cannot talk to {where}: {text[:200]}") from None
    except requests.RequestException as e:
        raise InfraError(f"{url}: {e.__class__.__name__}: {str(e)[:200]}") from None


def check_url(url: str, what: str = "--server-url") -> str:
    """A server's base URL, or a UsageError naming what is wrong with it."""
    shown = redact_url(url)  # its password, if any, never in a message
    try:
        parts = urlsplit(without_userinfo(url)[1])
        port = parts.port
    except ValueError as e:
        raise UsageError(f"{what} {shown!r}: {redact(str(e))}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what} {shown!r} must look like http://HOST[:PORT] (https works too)")
    if port == 0:
        raise UsageError(f"{what} {shown!r}: port 0 is not a server's port")
    return url.rstrip("/")


def server_count(info: dict, key: str, *, where: str = "/server_info", low: int = 1, high: int = 1 << 40) -> int | None:
    """A count a server says of itself (a KV pool, a cap, a page size), checked: None where it does not say it,
    the whole number where it is one in [low, high], an InfraError naming the field and value otherwise (a server
    that says its KV pool holds -4096 or "abc" tokens cannot be measured against its own ceiling)."""
    v = info.get(key) if isinstance(info, dict) else None
    if v is None:
        return None
    n = v if isinstance(v, int) and not isinstance(v, bool) else (
        int(v) if isinstance(v, float) and v.is_integer() else None)
    if n is None or not low <= n <= high:
        raise InfraError(f"{where} says {key} = {json.dumps(v)[:80]}: not a whole number in [{low:,}, {high:,}]; "
                         f"the server's answer about itself cannot be trusted")
    return n


class Engine:
    """The defaults: an OpenAI-compatible server we know nothing more about."""

    name = "openai"
    wire = "openai"  # the wire format it speaks natively (measure/wire.py names them)
    shape: Shape = FULL  # optional request fields it accepts (ignore_eos, usage on every chunk)
    negotiates = False  # a server we know nothing of: find out what it accepts before the first level
    new_connection_per_request = False  # reuse keep-alive connections
    ready_path = "/health"
    ready_line: str | None = None  # what its log prints once it serves (launch.LaunchSpec.ready_line)
    info_paths: tuple[str, ...] = ()  # GETs that describe the server, first 200 wins
    flush_path: str | None = None  # POST that empties prefix caches between levels
    loads_path: str | None = None  # a JSON load endpoint, scraped where /metrics is off
    series: dict[str, Series] = {}
    # its speed rides on the host's CPU, on a GPU too (scheduler, tokenizer, HTTP): the suite probes the CPU before
    # each server start, and before each level of a GPU server (environment/host_speed.py)
    host_cpu_matters = True

    def prepare(self, argv: list[str]) -> None:
        """Make what the launch template `argv` (placeholders unresolved) needs: builds, models. Raises InfraError
        when it cannot."""

    def resolve(self, part: str) -> str:
        """A profile's placeholder as this machine spells it: "{python}" is this interpreter."""
        return sys.executable if part == "{python}" else part

    # ------------------------------------------------------------------ talking to a running server
    def reach(self, url: str, api_key: str | None, timeout: float = 5.0) -> None:
        """Is anything there, and does it answer? InfraError in words within `timeout` seconds if not."""
        r = http_get(url + self.ready_path, api_key, timeout)
        if r.status_code not in (200, 404):  # 404: no health endpoint here; the requests will tell
            raise InfraError(f"{url}{self.ready_path} answered {describe_status(r)}")

    def server_info(self, url: str, api_key: str | None, timeout: float = 5.0) -> dict:
        """The first info endpoint that answers a JSON object; {} where none does. A refused key or a server that
        does not answer is an InfraError in words, not a silent {}."""
        for path in self.info_paths:
            r = http_get(url + path, api_key, timeout)
            if r.status_code in (401, 403):
                raise InfraError(f"{url}{path} answered {describe_status(r)}")
            if r.status_code == 200:
                try:
                    obj = r.json()
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    return obj
        return {}

    def served_model(self, url: str, api_key: str | None, info: dict, timeout: float = 10.0) -> str | None:
        """The OpenAI `model` field to send: the first model /v1/models lists."""
        try:
            r = requests.get(url + "/v1/models", headers=auth_headers(api_key), timeout=timeout)
            data = r.json().get("data") if r.status_code == 200 else None
            return data[0].get("id") if data else None
        except (requests.RequestException, ValueError, AttributeError, IndexError, TypeError):
            return None

    def vocab_size(self, url: str, api_key: str | None, info: dict, timeout: float = 10.0) -> int | None:
        """The served model's vocabulary, where the server says it: /v1/models data[0].meta.n_vocab (llama.cpp);
        None where it does not."""
        try:
            r = requests.get(url + "/v1/models", headers=auth_headers(api_key), timeout=timeout)
            data = r.json().get("data") if r.status_code == 200 else None
            n = (data[0].get("meta") or {}).get("n_vocab") if data else None
        except (requests.RequestException, ValueError, AttributeError, IndexError, TypeError):
            return None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def flush(self, url: str, api_key: str | None, timeout: float = 60.0) -> str:
        if not self.flush_path:
            return "not supported"
        try:
            r = requests.post(url + self.flush_path, params={"timeout": timeout}, headers=auth_headers(api_key),
                              timeout=timeout + 30)
            return f"HTTP {r.status_code}"
        except requests.RequestException as e:
            return f"failed: {e}"

    def ceiling(self, info: dict, isl: int, osl: int) -> Ceiling | None:
        """The concurrency where throughput must plateau, or None when the server does not say."""
        return None

    def parse_metrics(self, text: str, t: float) -> ServerSample | None:
        """One /metrics scrape as a ServerSample; None when none of this engine's series is there."""
        if not self.series:
            return None
        acc: dict[str, list[float]] = {}
        families, refused = metric_families(self.own_lines(text))
        for fam in families:
            for key, spec in self.series.items():
                for s in fam.samples:
                    if spec.matches(s.name, s.labels) and math.isfinite(s.value) and s.value >= 0:
                        acc.setdefault(key, []).append(float(s.value))  # NaN, inf or below 0: not a reading
        if not acc:
            return None
        values = {k: (sum(v) / len(v) if self.series[k].combine == "mean" else sum(v)) for k, v in acc.items()}
        s = self.sample_from(values, t)
        return replace(s, unparsed_lines=len(refused), unparsed_example=refused[0][:200]) if refused else s

    def own_lines(self, text: str) -> str:
        """Only the lines of this engine's series (and their # HELP / # TYPE): a page of many other metrics (a
        large deployment's, an exporter's) is not parsed sample by sample. A name without a namespace keeps all."""
        spaces = {spec.sample.split(":")[0] + ":" for spec in self.series.values() if ":" in spec.sample}
        if not spaces or any(":" not in spec.sample for spec in self.series.values()):
            return text
        keep = tuple(spaces) + tuple(f"# {kind} {sp}" for sp in spaces for kind in ("HELP", "TYPE"))
        return "\n".join(ln for ln in text.splitlines() if ln.startswith(keep)) + "\n"

    def sample_from(self, values: dict[str, float], t: float) -> ServerSample:
        """The sample from this engine's series, by ServerSample field; engines that expose a field only as a
        product of two series derive it here."""
        return ServerSample(time=t, **values)

    def parse_loads(self, obj: dict, t: float) -> ServerSample | None:
        return None

    # ------------------------------------------------------------------ what it runs on
    def uses_gpu(self, argv: list[str]) -> bool:
        return True

    def hardware_class(self, info: dict, argv: list[str], gpu_rows: list[dict]) -> str:
        """The class a baseline applies to: the GPUs the server uses (model x count), else the CPU."""
        from ..environment.fingerprint import cpu_model
        from ..environment.gpu import gpu_class

        if gpu_rows and self.uses_gpu(argv):
            return gpu_class(gpu_rows)
        return f"cpu:{cpu_model()} x {os.cpu_count()}"

    def check_flags(self, argv: list[str]) -> FlagCheck:
        return FlagCheck("not checked (no flag list for this engine)")

    def describe(self) -> dict:
        return {"engine": self.name, "wire": self.wire, "new_connection_per_request":
                self.new_connection_per_request}


def metric_families(text: str) -> tuple[list, list[str]]:
    """The page's metric families, and the lines the Prometheus parser refused. A page that parses whole is read
    whole; one that does not is read a family at a time (its # TYPE and # HELP lines with each sample line), so one
    malformed sample costs that sample only, and is named."""
    try:
        return list(text_string_to_metric_families(text)), []
    except ValueError:
        pass
    families, refused, head = [], [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            head = head + [line] if head and head[-1].split()[2:3] == line.split()[2:3] else [line]
            continue
        try:
            families += list(text_string_to_metric_families("\n".join(head + [line]) + "\n"))
        except ValueError:
            refused.append(line)
    return families, refused
