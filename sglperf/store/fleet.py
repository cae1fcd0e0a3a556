"""The fleet's results in PostgreSQL: one row per run (its document as JSONB and its history line), each
fingerprint once, one point per run x config x level x metric. Many runners write into one database: a run is one
transaction, so a reader never sees half of one, and pushing a run twice changes nothing (the run id is the key).

Why no migration tool: the schema is three tables and a version number. Migrations are numbered SQL statements,
applied on connect inside one transaction under an advisory lock (two runners starting at once apply each once); a
database newer than this sglperf is refused rather than written. The JSONL history stays the embedded default: a
database that is down costs a run nothing but the push, which `sglperf history push` makes later.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

from ..categories import UsageError
from ..redact import redact, redact_url, register, url_password, url_secrets, without_userinfo
from .history import record_from_run
from .rundoc import RunDoc

RESULTS_DB_ENV = "SGLPERF_RESULTS_DB"
LOCK_ID = 0x5367_6C70  # pg_advisory_xact_lock key for migrations ("Sglp")
RUN_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "runs, fingerprints, points", """
CREATE TABLE fingerprints (
    id bigserial PRIMARY KEY,
    hash text NOT NULL UNIQUE,              -- sha256 of the fingerprint's canonical JSON
    data jsonb NOT NULL
);
CREATE TABLE runs (
    id text PRIMARY KEY,                    -- the run file's run_id
    started timestamptz NOT NULL,
    finished timestamptz,
    commit text,
    branch text,
    profile text NOT NULL,
    engine text,
    status text NOT NULL,                   -- finished | interrupted | abandoned | running
    complete boolean NOT NULL,
    runner_host text,
    hardware_class text,
    fingerprint_id bigint REFERENCES fingerprints (id),
    excluded boolean NOT NULL DEFAULT false, -- kept for the record, never drift or baseline data
    excluded_reason text,
    doc jsonb,                              -- the run document (NULL for a history line imported without one)
    history jsonb NOT NULL,                 -- the run's history line, as reports/history.jsonl holds it
    raw_records jsonb NOT NULL DEFAULT '[]', -- where each level's raw request records went, on the runner
    source text NOT NULL,                   -- suite | push FILE | import FILE
    pushed timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX runs_series ON runs (profile, hardware_class, started);
CREATE TABLE points (
    run_id text NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    config text NOT NULL,
    level integer NOT NULL,
    metric text NOT NULL,
    value double precision,                 -- NULL where the level was invalid
    ci95 double precision,                  -- the interval's half-width, where the metric has one
    n integer,                              -- requests completed inside the steady-state window
    valid boolean NOT NULL,
    invalid_reasons text[] NOT NULL DEFAULT '{}',
    -- written by Otava (`sglperf drift --db`: otava analyze --update-postgres) at the first run after a change
    otava_forward_change_pct double precision,
    otava_backward_change_pct double precision,
    otava_pvalue double precision,
    PRIMARY KEY (run_id, config, level, metric)
);
"""),
]


class FleetError(UsageError):
    """The results database: a bad URL, one that does not answer or refuses us, a schema we do not know."""


@dataclass(frozen=True)
class DbUrl:
    url: str
    host: str
    port: int
    user: str | None
    password: str | None
    database: str

    def shown(self) -> str:
        return redact_url(self.url)

    def params(self) -> dict:
        """libpq's keywords, taken apart here: the URL's own options (?sslmode=...), then its parts, decoded. The
        password never goes through libpq's URI parser, which an unencoded '/' in it would make quote a piece."""
        query = dict(parse_qsl(urlsplit(without_userinfo(self.url)[1]).query))
        query.pop("password", None)
        parts = {"host": self.host, "port": self.port, "dbname": self.database, "user": self.user,
                 "password": self.password}
        return {**query, **{k: v for k, v in parts.items() if v is not None}}


def check_url(url: str, where: str = "--results-db") -> DbUrl:
    """A postgresql:// URL with a host and a database, or a FleetError naming it (its password never shown)."""
    register(*url_secrets(url))
    info, bare = without_userinfo(url)  # the password never reaches a parser whose error could quote it
    try:
        parts = urlsplit(bare)
        port = parts.port or 5432
    except ValueError as e:
        raise FleetError(f"{where} {redact_url(url)}: not a URL ({redact(str(e))})") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise FleetError(f"{where} {redact_url(url)}: must start with postgresql:// (e.g. "
                         f"postgresql://USER:PASSWORD@HOST:5432/DATABASE)")
    database = parts.path.lstrip("/")
    if not parts.hostname or not database:
        raise FleetError(f"{where} {redact_url(url)}: needs a host and a database name "
                         f"(postgresql://USER:PASSWORD@HOST:5432/DATABASE)")
    # decoded, as libpq decodes them: Otava's driver takes them apart from the URL
    user = unquote(info.split(":", 1)[0]) if info else parse_qs(parts.query).get("user", [None])[0]
    return DbUrl(url, parts.hostname, port, user or None, url_password(url), unquote(database))


def from_env(value: str | None) -> str | None:
    return value or os.environ.get(RESULTS_DB_ENV) or None


def connect(url: str, *, timeout: float = 10.0, migrate_schema: bool = True, where: str = "--results-db"):
    """A psycopg connection with the schema brought up to date; FleetError in the server's words otherwise."""
    import psycopg

    db = check_url(url, where)
    try:
        conn = psycopg.connect(**db.params(), connect_timeout=max(1, int(timeout)), application_name="sglperf")
    except psycopg.Error as e:
        words = " ".join(redact(str(e)).split())  # libpq's message, its lines joined
        raise FleetError(f"results database {db.shown()}: cannot connect: {words}") from None
    if migrate_schema:
        try:
            migrate(conn)
        except BaseException:
            conn.close()
            raise
    return conn


def migrate(conn) -> int:
    """Apply the migrations this database lacks, under an advisory lock; the schema version now."""
    latest = MIGRATIONS[-1][0]
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
        conn.execute("CREATE TABLE IF NOT EXISTS sglperf_schema (version integer PRIMARY KEY, "
                     "applied timestamptz NOT NULL DEFAULT now(), what text NOT NULL)")
        have = {r[0] for r in conn.execute("SELECT version FROM sglperf_schema")}
        if have and max(have) > latest:
            raise FleetError(f"the results database has schema version {max(have)}; this sglperf knows up to "
                             f"{latest}: upgrade sglperf before writing to it")
        for version, what, sql in MIGRATIONS:
            if version not in have:
                conn.execute(sql)
                conn.execute("INSERT INTO sglperf_schema (version, what) VALUES (%s, %s)", (version, what))
    return latest


def _fp_hash(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _points(rec: dict, doc: RunDoc | None):
    from ..records import METRICS

    for lv in rec["levels"]:
        r = doc.configs[lv["config"]].levels.get(str(lv["level"])) if doc and lv["config"] in doc.configs else None
        for name in METRICS:
            yield (lv["config"], lv["level"], name, lv.get(name),
                   lv.get("sustained_output_tps_ci95") if name == "sustained_output_tps" else None,
                   r.completed_in_window if r is not None else None, bool(lv["valid"]),
                   list(lv.get("invalid_reasons") or []))


def push_record(conn, rec: dict, doc: RunDoc | None, *, source: str, excluded: str | None = None) -> bool:
    """One run in one transaction: its fingerprint (once), its row, its points. False where it was already there."""
    from psycopg.types.json import Jsonb

    run_id = rec["run_id"]
    if not RUN_ID.match(run_id or ""):
        raise FleetError(f"run id {run_id!r}: not one sglperf writes (letters, digits, . _ : -)")
    rec = redact(rec)
    doc_json = redact(doc.model_dump(mode="json")) if doc is not None else None
    fp = rec.get("fingerprint") or {}
    ci = (doc.ci if doc is not None else {}) or {}
    raw = [lv.records_file for c in doc.configs.values() for lv in c.levels.values() if lv.records_file] \
        if doc is not None else []
    with conn.transaction():
        fp_id = conn.execute(
            "INSERT INTO fingerprints (hash, data) VALUES (%s, %s) ON CONFLICT (hash) DO UPDATE SET hash = "
            "EXCLUDED.hash RETURNING id", (_fp_hash(fp), Jsonb(fp))).fetchone()[0]
        row = conn.execute(
            "INSERT INTO runs (id, started, finished, commit, branch, profile, engine, status, complete, runner_host,"
            " hardware_class, fingerprint_id, excluded, excluded_reason, doc, history, raw_records, source) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING "
            "RETURNING id",
            (run_id, doc.started if doc is not None else rec["time"], doc.finished if doc is not None else rec["time"],
             ci.get("GITHUB_SHA"), ci.get("GITHUB_REF_NAME"), rec["profile"], rec.get("engine"), rec["status"],
             bool(rec["complete"]), doc.host if doc is not None else None, rec.get("hardware_class"), fp_id,
             excluded is not None, excluded, Jsonb(doc_json) if doc_json is not None else None, Jsonb(rec),
             Jsonb(raw), source)).fetchone()
        if row is None:
            return False
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO points (run_id, config, level, metric, value, ci95, n, valid, invalid_reasons)"
                            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            [(run_id, *p) for p in _points(rec, doc)])
    return True


def push_run(conn, doc: RunDoc, *, source: str) -> bool:
    """A run file's run; one whose output canary failed is kept, excluded from drift and baselines, saying why."""
    failed = doc.canary_failures()
    return push_record(conn, record_from_run(doc).model_dump(mode="json"), doc, source=source,
                       excluded=f"output canary failed: {'; '.join(failed)}" if failed else None)


def history_records(conn, profile: str | None = None, hardware_class: str | None = None) -> list[dict]:
    """Every run's history line that is not excluded, oldest first: what `sglperf drift` reads from JSONL."""
    q = "SELECT history FROM runs WHERE NOT excluded"
    args: list = []
    for col, v in (("profile", profile), ("hardware_class", hardware_class)):
        if v is not None:
            q += f" AND {col} = %s"
            args.append(v)
    return [r[0] for r in conn.execute(q + " ORDER BY started, id", args)]


def run_docs(conn, profile: str, hardware_class: str, last: int) -> list[RunDoc]:
    """The last `last` finished, complete suite runs of one profile on one hardware class, oldest first."""
    rows = conn.execute(
        "SELECT doc FROM runs WHERE doc IS NOT NULL AND NOT excluded AND status = 'finished' AND complete AND "
        "profile = %s AND hardware_class = %s ORDER BY started DESC, id DESC LIMIT %s",
        (profile, hardware_class, last)).fetchall()
    return [RunDoc.model_validate(r[0]) for r in reversed(rows)]


def listing(conn, limit: int = 50) -> list[tuple]:
    """(id, started, profile, hardware class, status, runner host, points, excluded reason), newest first."""
    return conn.execute(
        "SELECT r.id, r.started, r.profile, r.hardware_class, r.status, r.runner_host, count(p.*), r.excluded_reason "
        "FROM runs r LEFT JOIN points p ON p.run_id = r.id GROUP BY r.id ORDER BY r.started DESC, r.id DESC LIMIT %s",
        (limit,)).fetchall()
