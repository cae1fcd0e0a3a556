"""`sglperf baseline show|update|calibrate`: read, change and derive reviewed baselines (writes are atomic, locked,
and print the diff)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..record import baselines
from .. import profiles
from ..records import GATED, LATENCY
from ..record.rundoc import load_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="baseline_cmd", required=True)
    s = sub.add_parser("show", help="print a baseline file")
    s.add_argument("file", nargs="?", default=None)
    s.add_argument("--profile", default=None, help="show every baseline of this profile")
    u = sub.add_parser("update", help="write a new or changed baseline from a run file, print the diff")
    u.add_argument("--from", dest="run", required=True, help="reports/runs/<run>.json")
    u.add_argument("--config", action="append", default=None)
    u.add_argument("--levels", default=None, help="comma-separated levels (default: all valid ones)")
    u.add_argument("--metric", default="sustained_output_tps", choices=list(GATED))
    u.add_argument("--tolerance", type=float, default=None, help="default: the profile's default_tolerance")
    u.add_argument("--file", default=None, help="baseline file (default: baselines/<profile>/<hardware>.json)")
    u.add_argument("--dry-run", action="store_true")
    c = sub.add_parser("calibrate", help="derive tolerances from the noise of N runs (false alarms <= 1%%/level)")
    c.add_argument("runs", nargs="*", help="run files of the same profile and hardware")
    c.add_argument("--repeat", type=int, default=0, help="run the suite N times first (needs --profile)")
    c.add_argument("--profile", default=None)
    c.add_argument("--metric", action="append", default=None, choices=[*GATED, "latency"],
                   help="repeatable; default sustained_output_tps; `--metric latency` is every latency percentile")
    c.add_argument("--min-tolerance", type=float, default=baselines.MIN_TOLERANCE)
    c.add_argument("--max-tolerance", type=float, default=None,
                   help="leave out entries whose calibrated tolerance exceeds this (too noisy to judge in one run)")
    c.add_argument("--file", default=None)
    c.add_argument("--dry-run", action="store_true")


def _target(file: str | None, profile: str, hardware_class: str) -> Path:
    return Path(file) if file else baselines.default_path(profile, hardware_class)


def _write(target: Path, new: baselines.BaselineFile, dry_run: bool) -> None:
    old = baselines.load(target) if target.exists() else None
    if old is not None:
        baselines.check_hardware(old, target, new.hardware_class)
    merged = baselines.merge(old, new)
    lines = baselines.diff_lines(old, merged)
    print("\n".join(lines) if lines else "(no change)")
    if dry_run:
        print(f"dry run: {target} not written")
        return
    baselines.save(target, merged)
    print(f"wrote {target}: review the diff above and commit it")


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except (baselines.BaselineError, profiles.ProfileError, ValueError) as e:
        print(f"sglperf baseline: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    if args.baseline_cmd == "show":
        files = [Path(args.file)] if args.file else sorted(
            (baselines.BASELINE_DIR / args.profile).glob("*.json") if args.profile
            else baselines.BASELINE_DIR.glob("*/*.json"))
        for f in files:
            if ".candidate" in f.name:
                continue
            bf = baselines.load(f)
            print(f"{f}: profile {bf.profile}, hardware class {bf.hardware_class!r}, {bf.isl} in / {bf.osl} out")
            for cname, lvls in bf.configs.items():
                for lv, metrics in sorted(lvls.items(), key=lambda kv: int(kv[0])):
                    for m, e in metrics.items():
                        noise = f", CV {e.noise_cv:.2%} over {e.runs} runs" if e.noise_cv is not None else ""
                        print(f"  {cname:<14} c{lv:<6} {m:<22} {e.value:>12,.1f}  floor {e.floor:>12,.1f} "
                              f"(-{e.tolerance:.1%}{noise})  {e.source}, {e.taken_at}")
        return 0
    if args.baseline_cmd == "update":
        run = load_run(args.run)
        prof = profiles.load(run.profile)
        levels = [int(x) for x in args.levels.split(",")] if args.levels else None
        if not run.hardware_class:
            raise baselines.BaselineError(f"{args.run}: the run measured no server (no hardware class)")
        new = baselines.from_run(run, tolerance=args.tolerance or prof.measurement.default_tolerance,
                                 metric=args.metric, configs=args.config, levels=levels, isl=prof.workload.isl,
                                 osl=prof.workload.osl)
        if not new.configs:
            raise baselines.BaselineError(f"{args.run}: no valid level matches; invalid levels never become "
                                          f"baselines")
        _write(_target(args.file, run.profile, run.hardware_class), new, args.dry_run)
        return 0
    # calibrate
    paths = list(args.runs)
    if args.repeat:
        if not args.profile:
            raise ValueError("--repeat needs --profile")
        for i in range(args.repeat):
            before = set(Path("reports/runs").glob("*.json"))
            print(f"run {i + 1}/{args.repeat}: pytest perf_tests --profile {args.profile}", flush=True)
            subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "--profile", args.profile, "-q",
                            "-p", "no:randomly"], check=False)
            paths += [str(p) for p in sorted(set(Path("reports/runs").glob("*.json")) - before)]
    runs = [load_run(p) for p in paths]
    if len(runs) < 2:
        raise baselines.BaselineError(f"calibrate needs at least 2 run files, got {len(runs)}")
    prof = profiles.load(runs[0].profile)
    metrics = []
    for m in args.metric or ["sustained_output_tps"]:
        metrics += list(LATENCY) if m == "latency" else [m]
    new = None
    for metric in metrics:
        part, notes = baselines.calibrate(runs, metric=metric, isl=prof.workload.isl, osl=prof.workload.osl,
                                          floor=args.min_tolerance, max_tolerance=args.max_tolerance)
        print(f"{metric}:\n" + "\n".join("  " + n for n in notes))
        new = baselines.merge(new, part)
    _write(_target(args.file, runs[0].profile, runs[0].hardware_class), new, args.dry_run)
    return 0
