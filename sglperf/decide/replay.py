"""A stored run judged again by the very claims that judged it live: one config of a run file as Evidence (its
levels' starts as recorded; no start is left to take), against a baseline of the caller's choosing. The suite's own
tests replay real GPU runs through it, so the loop that decides a live level and the one that decides a recorded
one are the same code."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..categories import Category
from ..records import Ceiling, LevelResult, Rate, start_allowed
from . import evidence
from .evidence import Evidence
from .health import canary_words, start_failure


@dataclass
class Start:
    """One recorded start of a level, as a claim reads it."""

    result: LevelResult
    records: list = field(default_factory=list)
    scrape_source: str | None = "recorded"


def as_result(doc) -> LevelResult:
    """A stored level (store/rundoc.LevelDoc) as the suite held it."""
    return LevelResult(**{f.name: getattr(doc, f.name) for f in dataclasses.fields(LevelResult)})


# Between two levels of one server start lie a flush and a warm-up (seconds); a restart of a real engine takes a
# minute or more. Files written before each level kept its server start have it inferred from that gap.
RESTART_GAP_S = 45.0


def server_starts(doc) -> dict[int, dict[str, object]]:
    """A stored config's level docs by the server start that measured them: {start: {level: doc}}. From each doc's
    `server_start`, else inferred in time order: a new start where a level comes again, or after a gap longer than
    RESTART_GAP_S between one level's window end and the next one's start."""
    docs = [(k, d) for k, d in doc.levels.items()] + [(k, d) for k, ds in doc.replicates.items() for d in ds]
    if all(d.server_start is not None for _, d in docs):
        out: dict[int, dict[str, object]] = {}
        for k, d in docs:
            out.setdefault(d.server_start, {})[k] = d
        return out
    out, n, end = {1: {}}, 1, None
    for k, d in sorted(docs, key=lambda kd: kd[1].window_start or 0.0):
        gap = (d.window_start - end) if end is not None and d.window_start is not None else 0.0
        if k in out[n] or gap > RESTART_GAP_S:
            n += 1
            out[n] = {}
        out[n][k], end = d, d.window_end
    return out


class RecordedConfig:
    """Config `name` of the stored `run`, judged against `bf` (named `source` in messages). `profile`: the run's
    profile (its measurement section's starts, margins and agreement). `where`: how messages name the config
    (default profile/config). `slow_host`: the host's slowness as the live run probed it. `restate`: a function
    applied to each stored level first (a rule applied afresh to what the level recorded)."""

    def __init__(self, run, name: str, bf, profile, *, source: str = "the baseline", where: str | None = None,
                 slow_host=None, restate=None):
        self.run, self.name, self.bf, self.profile, self.source = run, name, bf, profile, source
        self.doc = run.configs[name]
        self._where = where or f"{run.profile}/{name}"
        self.slow_host, self.restate = slow_host, restate or (lambda doc: doc)
        self.hardware_class = run.hardware_class or ""
        self.fingerprint = run.config_fingerprint(name)
        server = self.doc.server
        self.ceiling = Ceiling(**server.ceiling) if server is not None and server.ceiling else None
        self.starts = 1
        self.recorded: dict = {}
        self.family: dict[str, RecordedConfig] = {name: self}  # the run's configs, as RecordedRun makes them
        self.levels = sorted(Rate(int(k)) if d.concurrency is None else int(k) for k, d in self.doc.levels.items())

    @property
    def where(self) -> str:
        return self._where

    @property
    def log_path(self) -> str | None:
        return None

    def _docs(self, level: int, upto: int | None) -> list:
        """The level's first measurement, then its re-measures on the starts up to `upto` (None: all recorded)."""
        first = self.doc.levels[str(level)]
        again = [docs[str(level)] for n, docs in sorted(server_starts(self.doc).items())
                 if (upto is None or n <= upto) and str(level) in docs and docs[str(level)] is not first]
        return [first, *again]

    def level_starts(self, level: int) -> list[Start]:
        """Its starts so far: those of the server starts the replay has reached, as live."""
        return [Start(as_result(self.restate(d))) for d in self._docs(level, self.starts)]

    def recorded_starts(self, level: int) -> list[Start]:
        """All the starts the run recorded of the level (what a claim that ran last, the A/B, read live)."""
        return [Start(as_result(self.restate(d))) for d in self._docs(level, None)]

    def measure(self, level: int) -> Start:
        return self.level_starts(level)[0]

    def _allowed(self, levels) -> bool:
        return all(start_allowed(len(self._docs(lv, self.starts)), self.profile.measurement.max_starts)
                   for lv in levels)

    def replicate(self, level: int, why: str):
        """The level's starts after the next recorded server start that measured it again, while the profile's
        max_starts allows one more, as the live loop asked for it; None where the run recorded none."""
        return None if self.replicate_levels([level], why) is None else self.level_starts(level)

    def replicate_levels(self, levels, why: str):
        """The next server start after this one that measured all of `levels` together, as the run recorded it (a
        plateau measured again on a fresh start), or None where it recorded none or the profile allows no more:
        the starts between (a floor's re-measure of one level) were spent as they were live."""
        if not self._allowed(levels):
            return None
        by_start = server_starts(self.doc)
        firsts = {id(self.doc.levels[str(lv)]) for lv in levels if str(lv) in self.doc.levels}
        for n in sorted(s for s in by_start if s > self.starts):
            if all(str(lv) in by_start[n] and id(by_start[n][str(lv)]) not in firsts for lv in levels):
                self.starts = n
                return {lv: Start(as_result(self.restate(by_start[n][str(lv)]))) for lv in levels}
        return None

    def replicate_note(self, level: int) -> str:
        return ""

    def baseline(self):
        return self.bf, self.source

    def host_outside(self, bf) -> str | None:
        return None

    def host_slower(self, bf):
        return self.slow_host

    def canary_failure(self, what: str) -> str | None:
        c = self.doc.canary
        if c is None or c.outcome in (None, "pass"):
            return None
        category = {"degenerate": Category.DEGENERATE, "wrong": Category.WRONG}.get(c.outcome, Category.CHANGED)
        return canary_words(self.where, what, category)

    def level_failure(self, m) -> str | None:
        return start_failure(self.where, m.result, None, self.canary_failure(f"{m.result.name}"))

    def noise(self, config: str, levels) -> dict:
        return evidence.baseline_noise(self.bf, config, levels)

    def over_starts(self, levels: list[int]):
        starts = {lv: [s.result for s in self.level_starts(lv)] for lv in levels}
        return evidence.levels_over_starts(self.bf, self.name, starts, levels)

    def server_count(self, r):
        return evidence.server_count(self, r)

    def record_plateau(self, doc) -> None:
        self.recorded["plateau"] = doc

    def record_faster(self, level: int, text: str) -> None:
        self.recorded.setdefault("faster", {})[level] = text

    def ladder(self) -> list[int]:
        return sorted({lv for c in self.family.values() for lv in c.levels})

    def measured(self) -> dict[int, LevelResult]:
        return {lv: self.measure(lv).result for lv in self.levels}

    def starts_of(self, level: int) -> list[LevelResult]:
        """Every start the run recorded of the level (the A/B of a replay reads them all at once)."""
        return [x.result for x in self.recorded_starts(level)]

    def sibling(self, config: str) -> "RecordedConfig | None":
        return self.family.get(config)

    def record_ab(self, doc) -> None:
        self.recorded["ab"] = doc


class RecordedRun:
    """A stored run's configs, each a RecordedConfig against `bf` and each other's sibling (what the A/B reads),
    their levels' starts as recorded. `ab()`: the evidence the A/B is handed, its base config's."""

    def __init__(self, run, bf, profile, **kw):
        self._profile = profile
        self.configs = {name: RecordedConfig(run, name, bf, profile, **kw) for name in run.configs}
        for c in self.configs.values():
            c.family = self.configs

    def ab(self) -> RecordedConfig:
        ab = self._profile.ab
        if ab is None:
            return next(iter(self.configs.values()))
        return self.configs.get(ab.base) or self.configs[ab.tuned]

    @property
    def recorded(self) -> dict:
        """What the A/B recorded: on the config it was handed."""
        return self.ab().recorded


def _conforms(config: RecordedConfig) -> Evidence:
    """Never called: the type checker holds the replayed evidence to the Protocol here, as run/servers.py holds the
    live one."""
    return config
