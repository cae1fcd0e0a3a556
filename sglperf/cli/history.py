"""`sglperf history`: the fleet's results database (store/fleet.py). `import` an older JSONL history, `push` run
files (a run whose push failed, or any run), `ls` what is there, `migrate` the schema."""

from __future__ import annotations

import argparse
import sys
import warnings

from ..store import fleet, history
from ..store.rundoc import RunFileError, load_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help=f"postgresql://USER:PASSWORD@HOST:5432/DB (default: "
                                              f"${fleet.RESULTS_DB_ENV})")
    sub = p.add_subparsers(dest="history_command", required=True)
    i = sub.add_parser("import", help="every run of a history JSONL (reports/history.jsonl)")
    i.add_argument("file")
    u = sub.add_parser("push", help="run files (reports/runs/*.json), e.g. one whose push failed during the run")
    u.add_argument("runs", nargs="+")
    ls = sub.add_parser("ls", help="the newest runs")
    ls.add_argument("--limit", type=int, default=50)
    sub.add_parser("migrate", help="bring the schema up to date (connecting does this too)")


def main(args: argparse.Namespace) -> int:
    url = fleet.from_env(args.db)
    if not url:
        print(f"sglperf history: give --db postgresql://... (or set {fleet.RESULTS_DB_ENV})", file=sys.stderr)
        return 2
    try:
        conn = fleet.connect(url, where="--db")
    except fleet.FleetError as e:
        print(f"sglperf history: {e}", file=sys.stderr)
        return 2
    try:
        return _run(conn, args)
    except (fleet.FleetError, RunFileError, history.HistoryError) as e:
        print(f"sglperf history: {e}", file=sys.stderr)
        return 2
    finally:
        conn.close()


def _run(conn, args) -> int:
    cmd = args.history_command
    if cmd == "migrate":
        print(f"schema version {fleet.migrate(conn)}")
        return 0
    if cmd == "ls":
        for rid, started, profile, hw, status, host, points, excluded in fleet.listing(conn, args.limit):
            print(f"{rid}  {started:%Y-%m-%d %H:%M:%S}  {profile}  {hw or '-'}  {status}  {host or '-'}  "
                  f"{points} points" + (f"  EXCLUDED: {excluded}" if excluded else ""))
        return 0
    new = old = 0
    if cmd == "import":
        with warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always", history.TornLineWarning)
            records = history.read(args.file)
        for w in skipped:
            print(f"sglperf history: {w.message}", file=sys.stderr)
        for rec in records:
            if fleet.push_record(conn, rec, None, source=f"import {args.file}"):
                new += 1
            else:
                old += 1
    else:
        for path in args.runs:
            doc = load_run(path)
            if doc.status == "running":
                raise fleet.FleetError(f"{path}: run {doc.run_id} is still running: push it when it has finished")
            if fleet.push_run(conn, doc, source=f"push {path}"):
                new += 1
            else:
                old += 1
    print(f"{new} run(s) written, {old} already there")
    return 0
