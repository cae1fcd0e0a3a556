"""`sglperf export --format llm-d RUN_FILE... --out DIR`: run files as reports other tools read (report/llmd.py),
one file per report, written atomically; a file already there is never overwritten unless asked."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..categories import UsageError
from ..fileio import atomic_write_json
from ..report import llmd
from ..store.rundoc import RunFileError, load_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run files (reports/runs/<run>.json)")
    p.add_argument("--format", required=True, choices=["llm-d"],
                   help=f"llm-d: llm-d-benchmark's Benchmark Report, schema v{llmd.SCHEMA_VERSION}, one per level")
    p.add_argument("--out", required=True, help="the directory the reports go to (made if missing)")
    p.add_argument("--overwrite", action="store_true", help="replace reports already there")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: is a file; give a directory")
        runs = [load_run(path) for path in args.runs]
        planned = [(run, r) for run in runs for r in llmd.reports(run)[0]]
        taken = [str(out / f"{r.name}.json") for _, r in planned if (out / f"{r.name}.json").exists()]
        if taken and not args.overwrite:
            raise UsageError(f"--out {out}: {len(taken)} report(s) already there ({taken[0]} ...): give --overwrite "
                             f"to replace them, or another directory")
    except (RunFileError, UsageError) as e:
        print(f"sglperf export: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        written, left = llmd.reports(run)
        for r in written:
            atomic_write_json(out / f"{r.name}.json", r.doc)
        print(json.dumps({"run": run.run_id, "reports": [f"{r.name}.json" for r in written], "left_out": left}))
    return 0
