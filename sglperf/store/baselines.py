"""Baselines: accepted numbers per (profile, hardware class, config, level, metric), with their noise and tolerance.

One JSON file per profile x hardware class under baselines/<profile>/<hardware-class-slug>.json, reviewed like
code. Loaded with validation (a malformed file, a missing field or an unknown schema version is a BaselineError
naming file and field); written atomically under a lock; a candidate never overwrites the reviewed file.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..categories import UsageError
from ..environment import fingerprint, host_speed
from ..fileio import atomic_write_json, lock_for, read_json
from ..records import GATED, METRICS, Rate, level_name, value_format
from .rundoc import RunDoc

BASELINE_DIR = Path(__file__).resolve().parents[2] / "baselines"
SCHEMA_VERSION = 2  # 2: entries keep their noise (df, within-run part) and the file its pooled prior; 1 is read
READABLE = (1, 2)
# What an entry may hold (records.METRICS, gated): throughput floors, and latency ceilings (lower is better)
Metric = Literal[GATED]


class BaselineError(UsageError):
    pass


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    metric: Metric
    value: float = Field(gt=0)
    tolerance: float = Field(gt=0, lt=1)  # floor = value x (1 - tolerance)
    noise_cv: float | None = Field(None, ge=0)  # run-to-run CV of one run's value, moderated (judge/noise.of)
    runs: int = Field(1, ge=1)
    noise_df: float | None = Field(None, gt=0)  # its degrees of freedom (runs - 1 plus the pool's prior)
    within_cv: float | None = Field(None, ge=0)  # the calibration runs' own within-run part (their intervals' SE)
    own_cv: float | None = Field(None, ge=0)  # this level's own sample CV over its runs, before pooling
    host_cv: float | None = Field(None, ge=0)  # the part of the run-to-run noise that stays with the host
    hosts: int | None = Field(None, ge=0)  # how many hosts the calibration runs came from, where they said
    restart_cv: float | None = Field(None, ge=0)  # what a restart inside one run draws afresh (judge/noise.py)
    restart_df: float | None = Field(None, gt=0)  # its degrees of freedom (restarts, pooled over the levels)
    min_tolerance: float | None = Field(None, ge=0, lt=1)  # the tolerance it was never let below
    taken_at: str  # ISO date or date-time
    source: str  # the run it came from, or the document
    sglperf_version: str
    fingerprint: dict[str, Any] = {}
    note: str | None = None

    @property
    def floor(self) -> float:
        return self.value * (1 - self.tolerance)

    @property
    def ceiling(self) -> float:
        """For latency metrics: value x (1 + tolerance), the same prediction bound on the other side."""
        return self.value * (1 + self.tolerance)

    @property
    def is_latency(self) -> bool:
        return METRICS[self.metric].is_latency


def metric_value(r, metric: str) -> float | None:
    """A level result's value of a baseline metric (records.METRICS says how it is read)."""
    return METRICS[metric].read(r)


class PooledNoise(BaseModel):
    """What calibrate pooled the levels' variances toward: s0 (as a CV), how many degrees of freedom that prior is
    worth (1000: the levels agree), over how many levels, and how."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    metric: str
    cv: float = Field(ge=0)
    prior_df: float = Field(ge=0)
    levels: int = Field(ge=0)
    method: str = "moderated variance (limma, Smyth 2004) of log values over the profile's levels"


class HostSpeed(BaseModel):
    """The CPU speed probe of the runs a baseline came from (environment/host_speed.py): geometric mean, the SD of
    its log over the runs, and how many runs."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    score: float = Field(gt=0)
    cv: float | None = Field(None, ge=0)
    runs: int = Field(ge=1)


class BaselineFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    schema_version: int
    profile: str
    hardware_class: str
    isl: int = Field(gt=0)
    osl: int = Field(gt=0)
    description: str = ""
    # config -> level (as a string, JSON keys) -> metric -> entry
    configs: dict[str, dict[str, dict[Metric, Entry]]]
    pooled: list[PooledNoise] = []
    # config -> the output canary's outputs on this hardware class (ids, else words), one per prompt, in order
    canary: dict[str, list[list[int | str]]] = {}
    canary_fingerprint: dict[str, dict] = {}  # config -> the fingerprint the canary outputs were taken with
    host_speed: HostSpeed | None = None  # the CPU the runs measured (probed before each server start)
    open_loop: bool = False  # its levels are offered rates (r40), not concurrencies (c40)

    @field_validator("configs")
    @classmethod
    def _level_keys(cls, v):
        """A level key is the number alone, as the suite writes it ("8", never "8.0", "08" or "c8"): any other
        spelling would never match a measured level, and its floor would silently judge nothing."""
        for config, levels in v.items():
            for key in levels:
                if not (key.isascii() and key.isdigit() and str(int(key)) == key and int(key) > 0):
                    raise ValueError(f"{config}: level key {key!r} is not a level: write the number alone, as the "
                                     f"suite does (\"8\" for c8 or r8)")
        return v

    def level_name(self, level) -> str:
        """How messages name one of its levels (a key is the number alone)."""
        return level_name(Rate(int(level)) if self.open_loop else level)

    def entries(self, config: str, level: int) -> dict[str, Entry]:
        return dict(self.configs.get(config, {}).get(str(level), {}))


def slug(hardware_class: str) -> str:
    s = hardware_class.lower().replace("×", "x")
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def default_path(profile: str, hardware_class: str) -> Path:
    return BASELINE_DIR / profile / f"{slug(hardware_class)}.json"


def load(path: str | Path) -> BaselineFile:
    path = Path(path)
    raw = read_json(path, "baseline file", BaselineError)
    if not isinstance(raw, dict):
        raise BaselineError(f"{path}: the top level must be an object")
    if "schema_version" not in raw:
        raise BaselineError(f"{path}: schema_version: missing (this sglperf reads version {SCHEMA_VERSION})")
    if raw["schema_version"] not in READABLE:
        raise BaselineError(f"{path}: schema_version: {raw['schema_version']!r} is not supported (this sglperf "
                            f"reads version {SCHEMA_VERSION}); re-create the baseline with "
                            f"`sglperf baseline update` or upgrade sglperf")
    try:
        return BaselineFile.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"])
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{path}: {where}: {msg}")
        raise BaselineError("\n".join(lines)) from None


def check_hardware(bf: BaselineFile, path: Path, hardware_class: str) -> None:
    if bf.hardware_class != hardware_class:
        raise BaselineError(f"{path}: this baseline is for hardware class {bf.hardware_class!r}, but this run is on "
                            f"{hardware_class!r}; a baseline applies only to its hardware class (create one for this "
                            f"machine with --update-baselines)")


def save(path: str | Path, bf: BaselineFile) -> Path:
    """Atomic and locked: concurrent writers serialise, a reader never sees half a file."""
    path = Path(path)
    with lock_for(path):
        return atomic_write_json(path, bf.model_dump(mode="json", exclude_none=True))


def candidate_path(path: Path) -> Path:
    """Where a candidate goes: beside the reviewed file, never on top of it or of an earlier candidate."""
    cand = path.with_name(path.stem + ".candidate.json")
    if not cand.exists():
        return cand
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    for n in range(1000):  # two candidates in one microsecond (or one process) still differ
        cand = path.with_name(f"{path.stem}.candidate-{stamp}{'' if n == 0 else f'-{n}'}.json")
        if not cand.exists():
            return cand
    raise BaselineError(f"too many candidates beside {path}; review and remove them")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def from_run(run: RunDoc, *, tolerance: float, metric: str = "sustained_output_tps", configs: list[str] | None = None,
             levels: list[int] | None = None, isl: int, osl: int) -> BaselineFile:
    """A baseline made of a run's valid levels (invalid levels never become baselines)."""
    out: dict[str, dict[str, dict[str, Entry]]] = {}
    for cname, c in run.configs.items():
        if configs and cname not in configs:
            continue
        for lv, r in c.levels.items():
            if levels and int(lv) not in levels:
                continue
            value = metric_value(r, metric)
            if not r.valid or value is None:
                continue
            out.setdefault(cname, {})[lv] = {metric: Entry(
                metric=metric, value=round(float(value), 2), tolerance=tolerance, noise_cv=None, runs=1,
                taken_at=run.finished or run.started, source=f"run {run.run_id}",
                sglperf_version=run.sglperf_version, fingerprint=run.config_fingerprint(cname),
                note=(f"95% CI ±{r.sustained_output_tps_ci95:.1f}" if metric == "sustained_output_tps"
                      and r.sustained_output_tps_ci95 else None))}
    canary = {cname: [canary_units(o) for o in c.canary.outputs] for cname, c in run.configs.items()
              if c.canary is not None and c.canary.outcome in ("pass", "changed") and (not configs or cname in configs)}
    return BaselineFile(schema_version=SCHEMA_VERSION, profile=run.profile, hardware_class=run.hardware_class,
                        isl=isl, osl=osl, description=f"from run {run.run_id}", configs=out, canary=canary,
                        canary_fingerprint={c: run.config_fingerprint(c) for c in canary},
                        host_speed=runs_host_speed([run]), open_loop=run.open_loop)


def runs_host_speed(runs: list[RunDoc]) -> HostSpeed | None:
    """The runs' CPU speed: per run the geometric mean of its config starts' probes; None where a run has none."""
    per_run = []
    for r in runs:
        scores = [hs["score"] for c in r.configs if (hs := r.config_fingerprint(c).get("host_speed"))
                  and hs.get("score")]
        if not scores:
            return None
        per_run.append(host_speed.summarize(scores)[0])
    score, cv = host_speed.summarize(per_run)
    return HostSpeed(score=round(score, 4), cv=round(cv, 5) if cv is not None else None, runs=len(per_run))


def pooled_host_speed(old: HostSpeed | None, new: HostSpeed | None) -> HostSpeed | None:
    """Two sets of runs' probes as one (their logs' mean and SD over all the runs), or whichever there is."""
    if old is None or new is None:
        return old or new
    n = old.runs + new.runs
    m1, m2 = math.log(old.score), math.log(new.score)
    m = (old.runs * m1 + new.runs * m2) / n
    ss = sum((k - 1) * (cv or 0.0) ** 2 + k * (mi - m) ** 2
             for k, cv, mi in ((old.runs, old.cv, m1), (new.runs, new.cv, m2)))
    return HostSpeed(score=round(math.exp(m), 4), cv=round(math.sqrt(ss / (n - 1)), 5), runs=n)


def host_speed_note(speed: HostSpeed, hardware_class: str) -> str:
    spread = f" ± {speed.cv:.1%} over {speed.runs} runs" if speed.cv is not None else " from 1 run"
    b = host_speed.band(speed.cv, speed.runs)
    if fingerprint.cpu_class(hardware_class):
        return (f"host CPU speed probe: {speed.score:.3g}{spread}; a host outside ±{b:.0%} of it is not judged by "
                f"this baseline's floors and ceilings")
    return (f"host CPU speed probe: {speed.score:.3g}{spread}; on a host more than {b:.0%} slower, a floor the "
            f"server misses by no more than the CPU's share is INVALID naming the host, not a regression")


def canary_units(output: dict) -> list[int | str]:
    """What a canary output is compared by: its ids, else its text's words."""
    ids = output.get("output_ids")
    return list(ids) if ids is not None else (output.get("text") or "").split()


def write_candidate(run: RunDoc, *, tolerance: float, isl: int, osl: int, reviewed: Path | None = None) -> str:
    """A candidate beside the reviewed file (baselines/<profile>/<class>.json, or `reviewed`): its entries updated by
    the run's valid levels, so moving it onto the reviewed file drops no floor. Never overwrites; returns what was
    done, with the diff, in words."""
    if not run.hardware_class:
        return f"no candidate baseline for {run.profile}: no server was measured"
    new = from_run(run, tolerance=tolerance, isl=isl, osl=osl)
    if not new.configs:
        return f"no candidate baseline for {run.profile}: no valid level to take it from"
    target = reviewed or default_path(run.profile, run.hardware_class)
    old = load(target) if target.exists() else None
    cand = merge(old, new)
    path = save(candidate_path(target), cand)
    diff = "\n".join("    " + ln for ln in diff_lines(old, cand, unchanged=True)) or "    (no change)"
    return f"candidate baseline: {path}\n  review it, then move it to {target} and commit:\n{diff}"


def diff_lines(old: BaselineFile | None, new: BaselineFile, unchanged: bool = False) -> list[str]:
    """What `new` adds (+), changes (~) and drops (-) against `old`; with `unchanged`, a count of what it keeps."""
    lines, same = [], 0
    old_entries = {(c, lv, m): e for c, lvls in (old.configs.items() if old else ()) for lv, ms in lvls.items()
                   for m, e in ms.items()}
    new_entries = {(c, lv, m): e for c, lvls in new.configs.items() for lv, ms in lvls.items() for m, e in ms.items()}
    for key in sorted(set(old_entries) | set(new_entries), key=lambda k: (k[0], int(k[1]), k[2])):
        cname, lv, m = key
        before, e = old_entries.get(key), new_entries.get(key)
        if e is None:
            lines.append(f"- {cname} {new.level_name(lv)} {m}: {before.value:{value_format(m)}} REMOVED (the new "
                         f"file has no entry for it)")
        elif before is None:
            lines.append(f"+ {cname} {new.level_name(lv)} {m}: {e.value:{value_format(m)}} "
                         f"(tolerance {e.tolerance:.1%})")
        elif before.value != e.value or before.tolerance != e.tolerance:
            lines.append(f"~ {cname} {new.level_name(lv)} {m}: {before.value:,.1f} → {e.value:,.1f} "
                         f"({e.value / before.value - 1:+.1%}), tolerance {before.tolerance:.1%} → "
                         f"{e.tolerance:.1%}")
        else:
            same += 1
    if unchanged and same:
        lines.append(f"= {same} entr{'y' if same == 1 else 'ies'} unchanged")
    return lines


def merge(old: BaselineFile | None, new: BaselineFile) -> BaselineFile:
    """Replace the (config, level, metric) entries `new` has; keep everything else of `old`. The host's speed is
    that of the runs behind the floors: `new`'s where it brings floors, `old`'s where it brings only a canary (one
    run's probe replaced five runs' band, ±10% became ±17%)."""
    if old is None:
        return new
    if old.hardware_class != new.hardware_class or old.profile != new.profile:
        raise BaselineError(f"cannot merge a baseline for {new.profile}/{new.hardware_class!r} into one for "
                            f"{old.profile}/{old.hardware_class!r}")
    configs = {c: {lv: dict(m) for lv, m in lvls.items()} for c, lvls in old.configs.items()}
    for c, lvls in new.configs.items():
        for lv, metrics in lvls.items():
            configs.setdefault(c, {}).setdefault(lv, {}).update(metrics)
    pooled = [p for p in old.pooled if p.metric not in {q.metric for q in new.pooled}] + list(new.pooled)
    return old.model_copy(update={"configs": configs, "pooled": pooled, "schema_version": SCHEMA_VERSION,
                                  "host_speed": (new.host_speed if new.configs else None) or old.host_speed,
                                  "open_loop": new.open_loop or old.open_loop,
                                  "canary": {**old.canary, **new.canary},
                                  "canary_fingerprint": {**old.canary_fingerprint, **new.canary_fingerprint}})
