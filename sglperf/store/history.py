"""Run history: one JSON line per run (fingerprint + every level's result and validity), appended under a lock.

Why JSONL: appends are cheap, and a run killed mid-write can only tear the last line, which the reader detects and
skips with a warning. Invalid levels are recorded as invalid with no value, so they never become data.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

from pydantic import ValidationError

from ..categories import UsageError
from ..fileio import lock_for
from ..records import METRICS, SCHEMA_VERSION, Rate
from .rundoc import HistoryLevel, HistoryRecord, RunDoc, explain

HISTORY_ENV = "SGLPERF_HISTORY"


class HistoryError(UsageError):
    pass


class TornLineWarning(UserWarning):
    pass


def default_path(reports_dir: Path) -> Path:
    return Path(os.environ.get(HISTORY_ENV) or reports_dir / "history.jsonl")


def record_from_run(run: RunDoc) -> HistoryRecord:
    """The history line of a run: per level the gated numbers, or None when the level was invalid."""
    levels = []
    for cname, c in run.configs.items():
        for lv, r in sorted(c.levels.items(), key=lambda kv: int(kv[0])):
            ok = bool(r.valid)
            levels.append(HistoryLevel(
                config=cname, level=int(lv), valid=ok, invalid_reasons=list(r.invalid_reasons),
                sustained_output_tps_ci95=r.sustained_output_tps_ci95 if ok else None,
                disturbances=list(r.disturbances), gpu=dict(r.gpu), faster=c.faster.get(str(lv)),
                by_turn=r.by_turn if ok else None,
                **{name: (m.read(r) if ok else None) for name, m in METRICS.items()}))
    return HistoryRecord(run_id=run.run_id, time=run.finished or run.started, profile=run.profile,
                         engine=run.engine, hardware_class=run.hardware_class, complete=run.complete,
                         status=run.status, fingerprint=run.fingerprint or {}, open_loop=run.open_loop,
                         levels=levels)


def append(path: str | Path, record: HistoryRecord) -> None:
    """Locked append of one whole line, or none: a write the disk refuses (full, over a size limit) is cut back to
    where the file ended, so no torn half line is left for `sglperf drift` to blame on a killed run, and the error
    names the file. A torn last line left by a killed writer is closed off first."""
    from ..redact import redact

    path = Path(path)
    line = json.dumps(redact(record.model_dump(mode="json")), separators=(",", ":")).encode() + b"\n"
    with lock_for(path), open(path, "ab", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        if end > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    line = b"\n" + line  # the torn line stays torn (and is skipped), the new one starts clean
        try:
            view = memoryview(line)
            while view:
                wrote = f.write(view)
                if not wrote:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[wrote:]
            os.fsync(f.fileno())
        except OSError as e:
            os.ftruncate(f.fileno(), end)
            raise OSError(e.errno, f"history file {path}: this run's line was not appended ({e.strerror}); the "
                                   f"file is as it was") from None


def read(path: str | Path) -> list[dict]:
    """Every record, validated (as plain dicts); a torn line (the trace of a killed run) or a malformed one is
    skipped with a warning naming file, line and field."""
    path = Path(path)
    if not path.exists():
        raise HistoryError(f"history file {path} does not exist (a suite run creates it; see --history-file)")
    if path.is_dir():
        raise HistoryError(f"history file {path} is a directory; give the JSONL file (e.g. {path / 'history.jsonl'})")
    out = []
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise HistoryError(f"history file {path} cannot be read: {e.strerror or e}") from None
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "levels" not in rec:
                raise ValueError("not a history record")
        except ValueError as e:
            warnings.warn(f"{path}:{no}: skipped a torn or malformed line ({e}); a killed run can leave one",
                          TornLineWarning, stacklevel=2)
            continue
        if rec.get("schema_version") != SCHEMA_VERSION:
            warnings.warn(f"{path}:{no}: skipped a record of schema_version {rec.get('schema_version')!r} (this "
                          f"sglperf reads {SCHEMA_VERSION})", TornLineWarning, stacklevel=2)
            continue
        try:
            out.append(HistoryRecord.model_validate(rec).model_dump())
        except ValidationError as e:
            warnings.warn(f"skipped a malformed record: {explain(e, f'{path}:{no}')}", TornLineWarning,
                          stacklevel=2)
    return out


def series(records: list[dict], *, metric: str = "sustained_output_tps") -> dict[tuple, list[tuple[dict, float]]]:
    """(profile, hardware_class, config, level) -> [(record, value)] of valid levels, in file (time) order. A level
    of an open-loop run is a records.Rate, so that messages name it r40, not c40."""
    out: dict[tuple, list[tuple[dict, float]]] = {}
    for rec in records:
        kind = Rate if rec.get("open_loop") else int
        for lv in rec["levels"]:
            if not lv.get("valid") or lv.get(metric) is None:
                continue
            key = (rec["profile"], rec.get("hardware_class"), lv["config"], kind(lv["level"]))
            out.setdefault(key, []).append((rec, float(lv[metric])))
    return out
