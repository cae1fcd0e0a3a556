"""RunResult: everything one suite run measured, as JSON under reports/runs/, with the raw records beside it.

Why rewritten after every level: a run interrupted mid-way (crash, Ctrl-C, SIGTERM from CI) still leaves a
readable file, marked incomplete, with every level measured so far.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import uuid
from pathlib import Path

from . import __version__
from .fileio import atomic_write_json, read_json, write_jsonl
from .records import SCHEMA_VERSION, LevelResult
from .redact import redact


def new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


class RunRecorder:
    def __init__(self, reports_dir: Path, profile: str, engine: str, options: dict, run_id: str | None = None):
        self.reports_dir = Path(reports_dir)
        self.run_id = run_id or new_run_id()
        self.path = self.reports_dir / "runs" / f"{self.run_id}.json"
        self.raw_dir = self.reports_dir / "runs" / self.run_id
        self.doc = {
            "schema_version": SCHEMA_VERSION, "kind": "suite", "run_id": self.run_id, "profile": profile,
            "engine": engine, "sglperf_version": __version__,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "finished": None,
            "complete": False, "status": "running", "options": options, "fingerprint": None,
            "hardware_class": None, "configs": {}, "ab": None, "notes": [],
            "ci": {k: v for k, v in os.environ.items() if k in ("GITHUB_RUN_ID", "GITHUB_RUN_NUMBER", "GITHUB_SHA",
                                                                 "GITHUB_REF_NAME", "GITHUB_WORKFLOW")},
        }

    def config(self, name: str) -> dict:
        return self.doc["configs"].setdefault(name, {"levels": {}, "server": None, "ceiling": None,
                                                     "plateau": None, "problems": []})

    def set_server(self, config: str, info: dict) -> None:
        self.config(config)["server"] = redact(info)
        self.flush()

    def add_level(self, config: str, level: int, result: LevelResult, records, server_samples, stop_reason: str,
                  scrape_source: str | None) -> Path:
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        rec_path = write_jsonl(self.raw_dir / f"{config}-c{level}.records.jsonl.gz",
                               (dataclasses.asdict(r) for r in records))
        samp_path = write_jsonl(self.raw_dir / f"{config}-c{level}.server.jsonl.gz",
                                (dataclasses.asdict(s) for s in server_samples))
        self.config(config)["levels"][str(level)] = {
            **result.to_dict(), "stop_reason": stop_reason, "scrape_source": scrape_source,
            "records_file": str(rec_path.relative_to(self.reports_dir)),
            "server_samples_file": str(samp_path.relative_to(self.reports_dir)),
        }
        self.flush()
        return rec_path

    def flush(self) -> None:
        atomic_write_json(self.path, redact(self.doc))

    def finish(self, status: str, complete: bool) -> Path:
        self.doc["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.doc["status"], self.doc["complete"] = status, complete
        self.flush()
        return self.path


def load_run(path: str | Path) -> dict:
    path = Path(path)
    doc = read_json(path, "run file")
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION or "configs" not in doc:
        raise ValueError(f"{path}: not an sglperf run file (schema_version {SCHEMA_VERSION} with 'configs')")
    return doc
