"""`sglperf drift`: where did each (config, level) series step, by how much, and what changed in the environment then;
over two sources: a JSONL history (`detect`) or the fleet's database (`detect_db`), told the same way (`tell`).

Change points come from Apache Otava (the Hunter algorithm: e-divisive split over sliding windows, then a
Student-t merge that keeps a point only if p <= max_pvalue and the relative change >= min_magnitude).
Chosen over MongoDB's signal-processing-algorithms, which pins Python ~3.11 and numpy < 2 and so cannot install
beside this package's supported range. Defaults (p <= 0.001, >= 2%, window 60) were measured on synthetic series in
tests/test_drift.py: a 5% step in 2%-CV noise is found within +/-2 runs in ~97% of series, a flat series of 60 runs
raises a change point in ~2%.
"""

from __future__ import annotations

import argparse
import sys
import contextlib
import io
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from ..environment import fingerprint as fp_mod
from ..store import fleet, history
from ..records import METRICS, Rate, level_name

DEFAULTS = dict(max_pvalue=0.001, min_magnitude=0.02, window_len=60)


@dataclass(frozen=True)
class ChangePoint:
    profile: str
    hardware_class: str | None
    config: str
    level: int
    metric: str
    index: int  # first run after the change
    run_before: str
    run_after: str
    time_before: str
    time_after: str
    mean_before: float
    mean_after: float
    change: float  # relative: mean_after / mean_before - 1
    pvalue: float
    runs_before: int
    runs_after: int
    environment_changes: list[tuple[str, object, object]]
    environment_changed_at: str | None  # the run whose fingerprint differs from the one before it
    gpu_changes: tuple[str, ...] = ()  # clocks and clock-event reasons that moved with the step (a throttling driver)

    def describe(self) -> str:
        env = ", ".join(f"{k} {a} → {b}" for k, a, b in self.environment_changes) or "no fingerprint change near it"
        if self.environment_changes and self.environment_changed_at != self.run_after:
            env += f" (at run {self.environment_changed_at})"
        if self.gpu_changes:
            env += "; GPU telemetry: " + ", ".join(self.gpu_changes)
        return (f"{self.profile}/{self.config} {level_name(self.level)} {self.metric}: {self.change:+.1%} "
                f"({self.mean_before:,.1f} → {self.mean_after:,.1f}, p={self.pvalue:.2g}) between run "
                f"{self.run_before} ({self.time_before}) and {self.run_after} ({self.time_after}); "
                f"{self.runs_before} runs before, {self.runs_after} after; environment: {env}")


MIN_RUNS = 4  # fewer runs in a series cannot show a change point (one segment each side needs two)


def short_series(records: list[dict], metric: str, config: str | None, level: int | None) -> list[str]:
    """The series too short to judge, in words."""
    out = []
    for (profile, hw, cname, lv), pts in sorted(history.series(records, metric=metric).items(),
                                               key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2], kv[0][3])):
        if (config and cname != config) or (level and lv != level) or len(pts) >= MIN_RUNS:
            continue
        out.append(f"{profile}/{cname} {level_name(lv)} ({hw}): {len(pts)} valid run(s), too short to judge (a "
                   f"change point needs at least {MIN_RUNS})")
    return out


def change_points(values: list[float], *, max_pvalue: float, min_magnitude: float, window_len: int):
    from otava.analysis import compute_change_points

    cps, _weak = compute_change_points(values, window_len=window_len, max_pvalue=max_pvalue,
                                       min_magnitude=min_magnitude)
    return cps


def detect(records: list[dict], *, metric: str = "sustained_output_tps", config: str | None = None,
           level: int | None = None, max_pvalue: float = DEFAULTS["max_pvalue"],
           min_magnitude: float = DEFAULTS["min_magnitude"], window_len: int = DEFAULTS["window_len"]
           ) -> list[ChangePoint]:
    out = []
    for (profile, hw, cname, lv), pts in sorted(history.series(records, metric=metric).items(),
                                               key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2], kv[0][3])):
        if (config and cname != config) or (level and lv != level) or len(pts) < MIN_RUNS:
            continue
        values = [v for _, v in pts]
        cps = change_points(values, max_pvalue=max_pvalue, min_magnitude=min_magnitude, window_len=window_len)
        out += tell(profile, hw, cname, lv, metric, pts, cps)
    return out


def tell(profile: str, hw: str | None, cname: str, lv: int, metric: str, pts: list[tuple[dict, float]],
         cps) -> list[ChangePoint]:
    """Otava's change points (each with .index and .stats.pvalue) over the series `pts` (history record, value):
    the means of the segments on each side, and what changed in the fingerprint and on the GPUs there."""
    values = [v for _, v in pts]
    cps = sorted(cps, key=lambda c: c.index)
    bounds = [0] + [c.index for c in cps] + [len(values)]
    out = []
    for j, c in enumerate(cps):
        i = c.index
        before, after = pts[i - 1][0], pts[i][0]
        seg_before, seg_after = values[bounds[j]:i], values[i:bounds[j + 2]]
        mb, ma = sum(seg_before) / len(seg_before), sum(seg_after) / len(seg_after)
        changes, at = environment_change_near(pts, i)
        gpu = gpu_changes([p[0] for p in pts[bounds[j]:i]], [p[0] for p in pts[i:bounds[j + 2]]], cname, lv)
        out.append(ChangePoint(profile, hw, cname, lv, metric, i, before["run_id"], after["run_id"],
                               before["time"], after["time"], mb, ma, ma / mb - 1, float(c.stats.pvalue),
                               len(seg_before), len(seg_after), changes, at, tuple(gpu)))
    return out


def environment_change_near(pts: list[tuple[dict, float]], i: int, reach: int = 2):
    """The fingerprint change closest to index i (detection can land a run or two off the real step)."""
    for offset in sorted(range(-reach, reach + 1), key=abs):
        k = i + offset
        if 1 <= k < len(pts):
            d = fp_mod.diff(pts[k - 1][0].get("fingerprint") or {}, pts[k][0].get("fingerprint") or {})
            if d:
                return d, pts[k][0]["run_id"]
    return [], None


def _telemetry(recs: list[dict], config: str, level: int) -> tuple[list[float], dict[str, list[float]]]:
    clocks, shares = [], {}
    for rec in recs:
        lv = next((x for x in rec["levels"] if x["config"] == config and x["level"] == level), None)
        for g in ((lv or {}).get("gpu") or {}).values():
            if g.get("sm_mhz_mean") is not None:
                clocks.append(g["sm_mhz_mean"])
            for name in set(shares) | set(g.get("reasons") or {}):
                shares.setdefault(name, []).append((g.get("reasons") or {}).get(name, 0.0))
    return clocks, shares


def gpu_changes(before: list[dict], after: list[dict], config: str, level: int, *, clock_step: float = 0.03,
                share_step: float = 0.2) -> list[str]:
    """What the GPUs did differently on each side of a step: mean SM clock moved by more than 3%, or a clock-event
    reason's share of the window by more than 20 points. A throttling driver is a real cause and is named."""
    (cb, sb), (ca, sa) = _telemetry(before, config, level), _telemetry(after, config, level)
    out = []
    if cb and ca:
        mb, ma = sum(cb) / len(cb), sum(ca) / len(ca)
        if abs(ma / mb - 1) > clock_step:
            out.append(f"SM clock {mb:,.0f} → {ma:,.0f} MHz mean")
    for name in sorted(set(sb) | set(sa)):
        if name == "idle":
            continue
        b = sum(sb.get(name, [0.0])) / max(1, len(sb.get(name, [0.0])))
        a = sum(sa.get(name, [0.0])) / max(1, len(sa.get(name, [0.0])))
        if abs(a - b) > share_step:
            out.append(f"{name} {b:.0%} → {a:.0%} of the window")
    return out


# ---------------------------------------------------------------- the fleet's database as the source
# Otava's PostgreSQL mode: one Otava test per (profile, hardware class, config, level, metric), so machines are
# never mixed, each reading its series with SQL and writing the change point it finds back into the points table
# (`otava analyze --update-postgres`); each change point is then told as the JSONL source tells it (`tell`). Why
# Otava's own importer and updater: a team that already runs Otava on its database sees the same tests, and the
# change points stay in the database for anyone to query.

UPDATE = ("UPDATE points SET otava_forward_change_pct = %s, otava_backward_change_pct = %s, otava_pvalue = %s "
          "WHERE run_id = '{run_id}' AND config = {config} AND level = {level} AND metric = '{metric}'")


def _literal(conn, value) -> str:
    from psycopg import sql

    return sql.Literal(value).as_string(conn)


def series_keys(conn, metric: str) -> list[tuple[str, str | None, str, int, int]]:
    """(profile, hardware class, config, level, valid runs) of every series of `metric`; the level of an open-loop
    series (its runs' history lines say so) is a records.Rate, named r40."""
    rows = conn.execute(
        "SELECT r.profile, r.hardware_class, p.config, p.level, count(*), "
        "bool_or(coalesce((r.history->>'open_loop')::boolean, false)) FROM points p JOIN runs r ON r.id = p.run_id "
        "WHERE p.metric = %s AND p.valid AND p.value IS NOT NULL AND NOT r.excluded "
        "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4", (metric,)).fetchall()
    return [(profile, hw, config, Rate(level) if open_loop else level, n)
            for profile, hw, config, level, n, open_loop in rows]


def otava_test(conn, profile: str, hw: str | None, config: str, level: int, metric: str):
    from otava.test_config import PostgresMetric, PostgresTestConfig

    where = (f"r.profile = {_literal(conn, profile)} AND "
             + (f"r.hardware_class = {_literal(conn, hw)}" if hw is not None else "r.hardware_class IS NULL")
             + f" AND p.config = {_literal(conn, config)} AND p.level = {int(level)} AND p.metric = "
             f"{_literal(conn, metric)} AND p.valid AND p.value IS NOT NULL AND NOT r.excluded"
             # a parameter Otava always has: with none, Otava 0.8.0 hands pg8000 >= 1.31 args=None, which it refuses
             " AND (%{BRANCH} = '*' OR r.branch = %{BRANCH})")
    query = (f"SELECT r.started AS time, p.value AS value, r.id AS run_id FROM points p JOIN runs r ON r.id = "
             f"p.run_id WHERE {where} ORDER BY r.started, r.id")
    direction = 1 if METRICS[metric].better == "higher" else -1
    # Otava fills {run_id} and {metric} with str.format: braces of our own literal are doubled for it
    update = UPDATE.replace("{config}", _literal(conn, config).replace("{", "{{").replace("}", "}}")) \
        .replace("{level}", str(int(level)))
    return PostgresTestConfig(f"{profile}/{hw}/{config}/{level_name(level)}/{metric}", query, update, "time",
                              [PostgresMetric(metric, direction, 1.0, "value")], ["run_id"])


def detect_db(url: str, *, metric: str, max_pvalue: float, min_magnitude: float, window_len: int,
           branch: str | None = None) -> tuple[list[ChangePoint], int]:
    """(change points, series analysed). Otava reads each series (of one branch, where given) and writes its change
    points back."""
    from otava.config import Config
    from otava.data_selector import DataSelector
    from otava.main import Otava
    from otava.postgres import PostgresConfig
    from otava.report import ReportType
    from otava.series import AnalysisOptions

    db = fleet.check_url(url, "--db")
    conn = fleet.connect(url, where="--db")
    out: list[ChangePoint] = []
    try:
        keys = [k for k in series_keys(conn, metric) if k[4] >= MIN_RUNS]
        tests = {t.name: t for t in (otava_test(conn, *k[:4], metric) for k in keys)}
        pg = PostgresConfig(hostname=db.host, port=db.port, username=db.user or "", password=db.password or "",
                            database=db.database)
        otava = Otava(Config(graphite=None, grafana=None, tests=tests, test_groups={}, slack=None, postgres=pg,
                             bigquery=None))
        selector = DataSelector()
        selector.since_time = datetime(1970, 1, 1, tzinfo=timezone.utc)
        selector.branch = branch or "*"
        options = AnalysisOptions()
        options.max_pvalue, options.min_magnitude, options.window_len = max_pvalue, min_magnitude, window_len
        records = {r["run_id"]: r for r in fleet.history_records(conn)}
        conn.execute("UPDATE points SET otava_forward_change_pct = NULL, otava_backward_change_pct = NULL, "
                     "otava_pvalue = NULL WHERE metric = %s", (metric,))
        conn.commit()  # Otava writes this run's change points; the last analysis's are not left beside them
        for (profile, hw, config, level, _), test in zip(keys, tests.values()):
            with contextlib.redirect_stdout(io.StringIO()):  # Otava prints its own report per test
                analyzed = otava.analyze(test, selector=selector, options=options, report_type=ReportType.LOG)
            otava.update_postgres(test, analyzed)
            out += _told(analyzed, metric, profile, hw, config, level, records)
    finally:
        conn.close()
    return out, len(keys)


def _told(analyzed, metric, profile, hw, config, level, records) -> list[ChangePoint]:
    pts = [(records[i], v) for i, v in zip(analyzed.attribute_values("run_id"), analyzed.data(metric))]
    return tell(profile, hw, config, level, metric, pts, analyzed.change_points.get(metric, []))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("history_file", nargs="?", default=None, help="history JSONL (default reports/history.jsonl)")
    p.add_argument("--history", dest="history_opt", default=None, help="same as the positional argument")
    p.add_argument("--config", default=None)
    p.add_argument("--level", type=int, default=None)
    p.add_argument("--metric", default="sustained_output_tps", choices=list(METRICS))
    p.add_argument("--pvalue", type=float, default=DEFAULTS["max_pvalue"])
    p.add_argument("--min-magnitude", type=float, default=DEFAULTS["min_magnitude"])
    p.add_argument("--window", type=int, default=DEFAULTS["window_len"])
    p.add_argument("--json", dest="json_path", default=None, help="also write the change points as JSON")
    p.add_argument("--db", default=None, help="the fleet's database (postgresql://...) instead of a history file: "
                   "Otava's PostgreSQL mode, one test per profile, hardware class, config, level and metric; its "
                   "change points are written back to the points table")
    p.add_argument("--branch", default=None, help="with --db: only runs of this branch (GITHUB_REF_NAME)")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    import warnings

    if args.db:
        return main_db(args)
    path = Path(args.history_opt or args.history_file or history.default_path(Path("reports")))
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always", history.TornLineWarning)
        try:
            records = history.read(path)
        except history.HistoryError as e:
            print(f"sglperf drift: {e}", file=sys.stderr)
            return 2
    for w in skipped:
        print(f"sglperf drift: {w.message}", file=sys.stderr)
    try:
        cps = detect(records, metric=args.metric, config=args.config, level=args.level, max_pvalue=args.pvalue,
                     min_magnitude=args.min_magnitude, window_len=args.window)
    except ImportError:
        print("sglperf drift: change-point detection needs Apache Otava: pip install -e '.[drift]'", file=sys.stderr)
        return 2
    n_series = len(history.series(records, metric=args.metric))
    print(f"{len(records)} runs, {n_series} series ({args.metric}), p <= {args.pvalue:g}, change >= "
          f"{args.min_magnitude:.0%}: {len(cps)} change point(s)")
    for c in cps:
        print("  " + c.describe())
    for line in short_series(records, args.metric, args.config, args.level):
        print("  " + line)
    if not records:
        print("  no run could be read: nothing to judge")
    if args.json_path:
        from ..fileio import atomic_write_json

        atomic_write_json(args.json_path, {"history": str(path), "metric": args.metric,
                                           "settings": {"max_pvalue": args.pvalue,
                                                        "min_magnitude": args.min_magnitude, "window": args.window},
                                           "change_points": [asdict(c) for c in cps]})
    return 0



def main_db(args: argparse.Namespace) -> int:

    try:
        cps, n_series = detect_db(args.db, metric=args.metric, max_pvalue=args.pvalue,
                                  min_magnitude=args.min_magnitude, window_len=args.window, branch=args.branch)
    except fleet.FleetError as e:
        print(f"sglperf drift: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"sglperf drift: --db needs Apache Otava and the PostgreSQL drivers ({e.name}): pip install -e "
              f"'.[drift,fleet]'", file=sys.stderr)
        return 2
    cps = [c for c in cps if (not args.config or c.config == args.config) and (not args.level or c.level == args.level)]
    print(f"{fleet.check_url(args.db, '--db').shown()}: {n_series} series ({args.metric}) with at least {MIN_RUNS} "
          f"valid runs, p <= {args.pvalue:g}, change >= {args.min_magnitude:.0%}: {len(cps)} change point(s), "
          f"written to points.otava_* by Otava")
    for c in cps:
        print("  " + c.describe())
    if args.json_path:
        from ..fileio import atomic_write_json

        atomic_write_json(args.json_path, {"db": fleet.check_url(args.db, "--db").shown(), "metric": args.metric,
                                           "change_points": [asdict(c) for c in cps]})
    return 0
