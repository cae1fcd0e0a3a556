"""Change points in the fleet's database, found by Apache Otava in its PostgreSQL mode: one Otava test per (profile,
hardware class, config, level, metric), so machines are never mixed, each reading its series with SQL and writing
the change point it finds back into the points table (`otava analyze --update-postgres`). Each change point is then
told as the JSONL path tells it: the means on each side and the fingerprint change at that run (drift.py).

Why Otava's own PostgreSQL importer and updater rather than our query plus its algorithm: a team that already
runs Otava on its database sees the same tests, and the change points stay in the database for anyone to query.
"""

from __future__ import annotations

import contextlib
import io
from datetime import datetime, timezone

from ..record import fleet
from ..records import METRICS
from .drift import MIN_RUNS, ChangePoint, tell

UPDATE = ("UPDATE points SET otava_forward_change_pct = %s, otava_backward_change_pct = %s, otava_pvalue = %s "
          "WHERE run_id = '{run_id}' AND config = {config} AND level = {level} AND metric = '{metric}'")


def _literal(conn, value) -> str:
    from psycopg import sql

    return sql.Literal(value).as_string(conn)


def series_keys(conn, metric: str) -> list[tuple[str, str | None, str, int, int]]:
    """(profile, hardware class, config, level, valid runs) of every series of `metric`."""
    return conn.execute(
        "SELECT r.profile, r.hardware_class, p.config, p.level, count(*) FROM points p JOIN runs r ON r.id = p.run_id "
        "WHERE p.metric = %s AND p.valid AND p.value IS NOT NULL AND NOT r.excluded "
        "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4", (metric,)).fetchall()


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
    return PostgresTestConfig(f"{profile}/{hw}/{config}/c{level}/{metric}", query, update, "time",
                              [PostgresMetric(metric, direction, 1.0, "value")], ["run_id"])


def detect(url: str, *, metric: str, max_pvalue: float, min_magnitude: float, window_len: int,
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
