"""RunRecorder: the only writer of a run's document (rundoc.RunDoc) under reports/runs/, with the raw records
beside it.

Why rewritten after every level: a run interrupted mid-way (crash, Ctrl-C, SIGTERM from CI) still leaves a
readable file, marked incomplete, with every level measured so far.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import uuid
from pathlib import Path

from .. import __version__
from ..fileio import atomic_write_json, write_jsonl
from ..records import LevelResult, level_name
from ..redact import redact
from .rundoc import ABDoc, CanaryDoc, ConfigDoc, LevelDoc, PlateauDoc, RunDoc, ServerDoc, load_run

CI_VARIABLES = ("GITHUB_RUN_ID", "GITHUB_RUN_NUMBER", "GITHUB_SHA", "GITHUB_REF_NAME", "GITHUB_WORKFLOW")


def new_run_id() -> str:
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class RunRecorder:
    def __init__(self, reports_dir: Path, profile: str, engine: str, options: dict, run_id: str | None = None,
                 notes: list[str] = (), kind: str = "suite", path: Path | None = None):
        """A suite run's file goes to <reports_dir>/runs/<run-id>.json with its raw records beside it; `path`
        puts the document elsewhere (sglperf bench --json) and keeps no raw records beside it; a bench run without a
        path keeps its document in memory only. A write that fails (a full disk) never stops the run: what it
        could not write is kept in `unwritten`, in words naming the file, and the document stays in memory."""
        self.reports_dir = Path(reports_dir)
        self.run_id = run_id or new_run_id()
        bench = kind == "bench"
        self.path = Path(path) if path else None if bench else self.reports_dir / "runs" / f"{self.run_id}.json"
        self.raw_dir = None if path or bench else self.reports_dir / "runs" / self.run_id
        self.unwritten: dict[str, str] = {}  # path -> why it could not be written
        self.doc = RunDoc(run_id=self.run_id, kind=kind, profile=profile, engine=engine, sglperf_version=__version__,
                          started=now_iso(), options=redact(options), notes=list(notes), pid=os.getpid(),
                          host=socket.gethostname(),
                          ci={k: v for k, v in os.environ.items() if k in CI_VARIABLES})

    def config(self, name: str) -> ConfigDoc:
        return self.doc.config(name)

    def set_fingerprint(self, fingerprint: dict, config: str | None = None) -> None:
        self.doc.fingerprint, self.doc.hardware_class = redact(fingerprint), fingerprint["hardware_class"]
        if config is not None:
            self.config(config).fingerprint = redact(fingerprint)

    def set_server(self, config: str, server: ServerDoc) -> None:
        self.config(config).server = ServerDoc.model_validate(redact(server.model_dump()))
        self.flush()

    def add_problem(self, config: str, text: str) -> None:
        self.config(config).problems.append(redact(text))
        self.flush()

    def set_teardown(self, config: str, teardown: dict) -> None:
        self.config(config).teardown = teardown
        self.flush()

    def set_canary(self, config: str, canary: CanaryDoc) -> None:
        self.config(config).canary = CanaryDoc.model_validate(redact(canary.model_dump()))
        self.flush()

    def canary_failed(self) -> list[str]:
        return self.doc.canary_failures()

    def set_plateau(self, config: str, plateau: PlateauDoc) -> None:
        self.config(config).plateau = plateau
        self.flush()

    def set_faster(self, config: str, level: int | str, text: str) -> None:
        self.config(config).faster[str(level)] = text
        self.flush()

    def set_ab(self, ab: ABDoc) -> None:
        self.doc.ab = ab
        self.flush()

    def add_level(self, config: str, level: int | str, result: LevelResult, records, server_samples,
                  stop_reason: str, scrape_source: str | None, epoch_ms: tuple[int, int] | None = None,
                  server_start: int | None = None) -> None:
        files = self._raw(f"{config}-{level_name(level)}", records, server_samples)
        self.config(config).levels[str(level)] = LevelDoc(
            **result.to_dict(), stop_reason=stop_reason, scrape_source=scrape_source, epoch_ms=epoch_ms,
            server_start=server_start, **files)
        self.flush()

    def add_replicate(self, config: str, level: int, result: LevelResult, records, server_samples, stop_reason: str,
                      scrape_source: str | None, epoch_ms: tuple[int, int] | None, why: str,
                      server_start: int | None = None) -> None:
        """The level measured again after a server restart: kept beside its first start, with the reason."""
        c = self.config(config)
        n = len(c.replicates.get(str(level), [])) + 2
        files = self._raw(f"{config}-{level_name(level)}-start{n}", records, server_samples)
        c.replicates.setdefault(str(level), []).append(LevelDoc(
            **result.to_dict(), stop_reason=stop_reason, scrape_source=scrape_source, epoch_ms=epoch_ms,
            server_start=server_start, **files))
        c.replicate_reasons[str(level)] = redact(why)
        self.flush()

    def _raw(self, stem: str, records, server_samples) -> dict:
        """A level's raw records and server samples beside the run file, where they can be written."""
        if self.raw_dir is None:
            return {}
        files = {}
        for key, name, rows in (("records_file", f"{stem}.records.jsonl.gz", records),
                                ("server_samples_file", f"{stem}.server.jsonl.gz", server_samples)):
            path = self._try(self.raw_dir / name, lambda path=self.raw_dir / name, rows=rows: (
                self.raw_dir.mkdir(parents=True, exist_ok=True), write_jsonl(path, rows))[1])
            if path is not None:
                files[key] = str(path.relative_to(self.reports_dir))
        return files

    def _try(self, path: Path, write):
        try:
            out = write()
        except OSError as e:
            self.unwritten[str(path)] = f"{e.strerror or type(e).__name__}" + (f" ({e.errno})" if e.errno else "")
            return None
        self.unwritten.pop(str(path), None)  # written after all (space freed): nothing lost
        return out

    def flush(self) -> None:
        if self.path is None:
            return
        self._try(self.path, lambda: atomic_write_json(self.path, redact(self.doc.model_dump(mode="json"))))

    def finish(self, status: str, complete: bool) -> Path:
        """Closed as `status`, or as "failed" where anything of it could not be written (what was measured is kept
        in the file where the file itself fits)."""
        self.doc.finished = now_iso()
        self.doc.status, self.doc.complete = status, complete
        if not self.unwritten:
            self.flush()
        if self.unwritten:  # what it could not write, in the file itself where the file still fits
            self.doc.status, self.doc.complete = "failed", False
            self.doc.notes.append("could not write: " + "; ".join(f"{p}: {w}" for p, w in self.unwritten.items()))
            self.flush()
        return self.path


def mark_abandoned(reports_dir: Path) -> list[str]:
    """Run files left "running" by a process that is gone become "abandoned" (rewritten in place)."""
    marked = []
    for path in sorted((Path(reports_dir) / "runs").glob("*.json")):
        try:
            if json.loads(path.read_text()).get("status") != "running":
                continue
            doc = load_run(path)
        except (OSError, ValueError):
            continue  # not ours to judge here; its readers name what is wrong
        if doc.status == "abandoned":
            atomic_write_json(path, doc.model_dump(mode="json"))
            marked.append(f"{path}: its run (pid {doc.pid}) died while running; marked abandoned")
    return marked
