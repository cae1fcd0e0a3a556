"""Atomic, locked file writes: a reader never sees half a file, and a killed writer leaves the old one intact."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

from filelock import FileLock
from orjson import OPT_APPEND_NEWLINE, dumps

from .categories import UsageError


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_json(path: str | Path, obj, *, indent: int | None = 2) -> Path:
    data = json.dumps(obj, indent=indent, sort_keys=False, default=str).encode() + b"\n"
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    return atomic_write_bytes(path, data)


def cache_dir() -> Path:
    """Where sglperf keeps what it builds or prepares once per machine ($SGLPERF_CACHE, else ~/.cache/sglperf)."""
    base = os.environ.get("SGLPERF_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "sglperf")
    return Path(base)


def check_writable(d: str | Path, what: str, option: str) -> None:
    """A directory this run will write into can be written now (created if missing): a usage error naming the
    option that chose it otherwise, before anything is measured."""
    try:
        Path(d).mkdir(parents=True, exist_ok=True)
        probe = Path(d) / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{what} {d} is not writable ({e.strerror or e}); choose another with {option}") from None


def check_file_target(path: str | Path, option: str) -> Path:
    """A file the user named for writing: its directory exists and takes a file now, and the path is not a
    directory; a usage error naming the option otherwise (nothing is created on the user's behalf)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {p}: is a directory; give a file path")
    d = p.parent
    if not d.is_dir():
        raise UsageError(f"{option} {p}: the directory {d} does not exist")
    probe = d / f".write-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"{option} {p}: the directory {d} is not writable ({e.strerror or e})") from None
    return p


def lock_for(path: str | Path, timeout: float = 60.0) -> FileLock:
    """The lock every writer of `path` takes (a sibling .lock file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock", timeout=timeout)


def jsonl(rows) -> bytes:
    """One compact JSON object per line; dataclass rows as their fields. orjson: a level's records are one object per
    request with a time per chunk, written per streamed token's worth of data (docs/measurement.md)."""
    return b"".join(dumps(r, default=str, option=OPT_APPEND_NEWLINE) for r in rows)


def write_jsonl(path: str | Path, rows) -> Path:
    data = jsonl(rows)
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    return atomic_write_bytes(path, data)


def read_json(path: str | Path, what: str, error: type[Exception] = ValueError):
    """Parse a JSON file; a missing or malformed file is `error` naming the file (and line) in words."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
