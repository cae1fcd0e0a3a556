"""The run document and the history record as typed, versioned models: written only through the recorder
(results.RunRecorder), validated by every reader, so a file from another version or a hand-edited one is a clear
error naming file and field, never a KeyError three modules later.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from ..categories import UsageError
from ..fileio import read_json
from ..records import METRICS, SCHEMA_VERSION, LevelResult, load_name


class RunFileError(UsageError):
    pass


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _level_fields() -> dict:
    hints = typing.get_type_hints(LevelResult)
    out = {}
    for f in dataclasses.fields(LevelResult):
        if f.default_factory is not dataclasses.MISSING:  # fields added later default, so older files validate
            out[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            out[f.name] = (hints[f.name], f.default if f.default is not dataclasses.MISSING else ...)
    return out


SIGNED = {"ci_ar1", "window_start", "window_end", "sim_behind_share"}  # may be below zero; every number is finite
MOST = 1e12  # past any rate, latency or count a level measures: a number above it is damage, not a measurement


class _Level(Strict):
    """Every number a level stores is a measurement: finite, not below zero (but the few that may be), and below
    MOST. A run file with NaN, Infinity, a negative rate or 1e308 tok/s is refused naming the field, never
    averaged into a baseline."""

    @property
    def name(self) -> str:
        """c32 for a closed-loop level, r40 for an open-loop one."""
        return load_name(self.concurrency, self.rate)

    @model_validator(mode="after")
    def _plausible(self):
        for name, value in self:
            # a dataclass's own fields, not dataclasses.asdict: its deep copy was most of the time spent validating
            if isinstance(value, (int, float)):
                values = [("", value)]
            elif isinstance(value, dict):
                values = value.items()
            elif dataclasses.is_dataclass(value):
                values = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
            else:
                continue
            for sub, v in values:
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                field = f"{name}.{sub}" if sub else name
                if not math.isfinite(v):
                    raise ValueError(f"{field} is {v}: not a measurement")
                if (v < 0 and name not in SIGNED) or abs(v) > MOST:
                    raise ValueError(f"{field} is {v:g}: outside what a level measures (0 .. {MOST:g})")
        return self


# One measured level as the run file stores it: every LevelResult field, plus where its raw data went.
LevelDoc = create_model(
    "LevelDoc", __base__=_Level, **_level_fields(),
    stop_reason=(str, ...), scrape_source=(str | None, None), records_file=(str | None, None),
    server_samples_file=(str | None, None), epoch_ms=(tuple[int, int] | None, None),
    # which of its config's server starts measured it (1: the first); None in files written before it was kept
    server_start=(int | None, None),
)


class ServerDoc(Strict):
    url: str
    argv: list[str]  # redacted
    log: str | None = None
    server_info: dict[str, Any] = {}
    ceiling: dict[str, Any] | None = None
    engine: dict[str, Any] = {}  # what the adapter says of itself (wire, connection policy)
    flag_check: dict[str, Any] | None = None  # which parser judged the launch flags, and what it found


class PlateauDoc(Strict):
    passed: bool
    attributed_to: str | None
    reference_level: int | None
    levels: list[int]
    lines: list[str]
    problems: list[str]
    ceiling: dict[str, Any]
    outcome: str | None = None  # pass | violated | inconclusive (None in files written before it existed)
    unsure: list[str] = []
    disturbed: list[str] = []  # what the host did to the levels of ratios left unjudged ("c128: disturbed: ...")


class CanaryDoc(Strict):
    """The output canary of one config: what each greedy prompt gave, and the verdict on it."""

    outputs: list[dict[str, Any]]  # CanaryOutput fields
    outcome: str | None = None  # pass | degenerate | changed | wrong (None until judged)
    problems: list[str] = []
    seconds: float = 0.0


class ABDoc(Strict):
    base: str
    tuned: str
    passed: bool
    gains: dict[str, Any]
    lines: list[str]
    problems: list[str]
    outcome: str | None = None  # pass | regression | inconclusive
    unsure: list[str] = []


class ConfigDoc(Strict):
    levels: dict[str, LevelDoc] = {}  # type: ignore[valid-type]
    # a level measured again after server restarts (its first start is in `levels`), and why it was
    replicates: dict[str, list[LevelDoc]] = {}  # type: ignore[valid-type]
    replicate_reasons: dict[str, str] = {}
    server: ServerDoc | None = None
    # this config's own fingerprint: its server args differ from the other configs' (the run's is the last one's)
    fingerprint: dict[str, Any] | None = None
    plateau: PlateauDoc | None = None
    # levels whose whole interval lay above their baseline by more than the tolerance (judge/floor.faster): news
    faster: dict[str, str] = {}
    canary: CanaryDoc | None = None
    problems: list[str] = []
    teardown: dict[str, Any] | None = None


class RunDoc(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["suite", "bench"] = "suite"  # bench: `sglperf bench --json` (profile "bench", one config)
    run_id: str
    profile: str
    engine: str
    sglperf_version: str
    started: str
    finished: str | None = None
    complete: bool = False
    status: Literal["running", "finished", "interrupted", "abandoned", "failed"] = "running"
    pid: int | None = None  # the process writing it: a "running" file whose writer is gone is "abandoned"
    host: str | None = None
    options: dict[str, Any] = {}
    fingerprint: dict[str, Any] | None = None
    hardware_class: str | None = None
    configs: dict[str, ConfigDoc] = {}
    ab: ABDoc | None = None
    notes: list[str] = []
    ci: dict[str, str] = {}

    def config(self, name: str) -> ConfigDoc:
        return self.configs.setdefault(name, ConfigDoc())

    def canary_failures(self) -> list[str]:
        """'config: outcome' for each config whose canary was judged and failed (fast but wrong: never data)."""
        return [f"{name}: {c.canary.outcome}" for name, c in self.configs.items()
                if c.canary is not None and c.canary.outcome not in (None, "pass")]

    @property
    def open_loop(self) -> bool:
        """Its levels are offered rates (an open loop), not concurrencies."""
        return any(lv.concurrency is None for c in self.configs.values() for lv in c.levels.values())

    def config_fingerprint(self, name: str) -> dict[str, Any]:
        """What a baseline entry of this config keeps: the config's own fingerprint. Files written before configs had
        one hold only the run's, whose server args are the last config's: those are left out, not misattributed."""
        c = self.configs.get(name)
        if c is not None and c.fingerprint:
            return c.fingerprint
        return {k: v for k, v in (self.fingerprint or {}).items() if k not in ("server_args", "server_args_hash")}


# One level of a history line: validity, every metric of records.METRICS (None when the level was invalid), the
# sustained interval, and what disturbed it.
HistoryLevel = create_model(
    "HistoryLevel", __base__=Strict, config=(str, ...), level=(int, ...), valid=(bool, ...),
    invalid_reasons=(list[str], []), sustained_output_tps_ci95=(float | None, None),
    disturbances=(list[str], []),
    gpu=(dict[str, Any], {}),  # per GPU index: clocks, power and clock-event reasons in the window (gpu.summarize)
    faster=(str | None, None),  # the level beat its baseline by more than the tolerance (judge/floor.faster)
    by_turn=(dict[str, dict[str, float | None]] | None, None),  # a conversation workload, by turn depth
    **{name: (float | None, None) for name in METRICS},
)


class HistoryRecord(Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    time: str
    profile: str
    engine: str | None = None
    hardware_class: str | None = None
    complete: bool
    status: str | None = None
    fingerprint: dict[str, Any] = {}
    open_loop: bool = False  # its levels are offered rates (r40), not concurrencies (c40): how drift names them
    levels: list[HistoryLevel]


def explain(e: ValidationError, where: str) -> str:
    lines = []
    for err in e.errors()[:8]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{where}: {loc}: {msg}")
    return "\n".join(lines)


def load_run(path: str | Path) -> RunDoc:
    """A run file, validated: another schema version or a malformed file is a RunFileError naming file and field."""
    path = Path(path)
    raw = read_json(path, "run file", RunFileError)
    if not isinstance(raw, dict) or "configs" not in raw:
        raise RunFileError(f"{path}: not an sglperf run file (an object with 'configs')")
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise RunFileError(f"{path}: schema_version: {raw.get('schema_version')!r} is not supported (this sglperf "
                           f"reads run files of version {SCHEMA_VERSION})")
    try:
        doc = RunDoc.model_validate(raw)
    except ValidationError as e:
        raise RunFileError(explain(e, str(path))) from None
    if writer_gone(doc):
        doc.status = "abandoned"
    return doc


def writer_gone(doc: RunDoc) -> bool:
    """A file still "running" whose writer died (killed, machine reset) on this host."""
    import socket

    import psutil

    if doc.status != "running" or doc.pid is None or doc.host != socket.gethostname():
        return False
    try:
        proc = psutil.Process(doc.pid)
        return proc.status() == psutil.STATUS_ZOMBIE or "python" not in proc.name().lower()
    except psutil.Error:
        return True
