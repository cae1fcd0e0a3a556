"""`sglperf baseline show|update|calibrate`: read, change and derive reviewed baselines (writes are atomic, locked,
and print the diff)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from ..store import baselines
from ..judge import calibration
from ..judge.noise import of as noise_of
from ..run import profiles
from ..records import GATED, LATENCY
from ..categories import UsageError
from ..store.rundoc import load_run
from ..fileio import check_file_target
from ..argtypes import fraction


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
    u.add_argument("--canary-only", action="store_true",
                   help="take only the run's output canary outputs (a passed canary), no level entries")
    u.add_argument("--dry-run", action="store_true")
    c = sub.add_parser("calibrate", help="derive tolerances from the noise of N runs (false alarms <= 1%%/level)")
    c.add_argument("runs", nargs="*", help="run files of the same profile and hardware")
    c.add_argument("--repeat", type=int, default=0, help="run the suite N times first (needs --profile)")
    c.add_argument("--profile", default=None)
    c.add_argument("--metric", action="append", default=None, choices=[*GATED, "latency"],
                   help="repeatable; default sustained_output_tps; `--metric latency` is every latency percentile")
    c.add_argument("--min-tolerance", type=fraction("--min-tolerance"), default=None,
                   help="the tolerance no floor goes below (default: the profile's [measurement] min_tolerance)")
    c.add_argument("--target-drop", type=fraction("--target-drop"), default=None,
                   help="say, per level, how many calibration runs would catch a drop this large (e.g. 0.10)")
    c.add_argument("--max-tolerance", type=fraction("--max-tolerance"), default=None,
                   help="leave out entries whose calibrated tolerance exceeds this (too noisy to judge in one run)")
    c.add_argument("--file", default=None)
    c.add_argument("--dry-run", action="store_true")
    c.add_argument("--db", default=None, help="take the runs from the fleet's database (postgresql://...): the "
                   "--last N finished runs of --profile on --hardware-class")
    c.add_argument("--extend", action="store_true",
                   help="grow the calibrated baseline (--file, else the runs' profile's) by these runs: its entries "
                        "count as their runs, where those runs' files are gone")
    c.add_argument("--hardware-class", default=None)
    c.add_argument("--last", type=int, default=10)
    c.add_argument("--host", action="append", default=[], metavar="LABEL:RUN_ID[,RUN_ID...]",
                   help="which host ran these runs, where their files do not say (no host_id in the fingerprint); "
                        "with runs from 2+ hosts the host's part of the noise is estimated and kept by floors over "
                        "several starts")


def fleet_runs(args) -> list:
    """The runs calibrate takes from the fleet's database: one profile on one hardware class, never mixed."""
    from ..store import fleet

    if not args.profile or not args.hardware_class:
        raise baselines.BaselineError("--db needs --profile and --hardware-class (machines are never mixed)")
    if args.last < 2:
        raise baselines.BaselineError(f"--last {args.last}: calibrate needs at least 2 runs")
    conn = fleet.connect(args.db, where="--db")
    try:
        runs = fleet.run_docs(conn, args.profile, args.hardware_class, args.last)
    finally:
        conn.close()
    print(f"{len(runs)} finished run(s) of {args.profile} on {args.hardware_class!r} from "
          f"{fleet.check_url(args.db, '--db').shown()}: " + ", ".join(r.run_id for r in runs))
    return runs


def calibration_runs(paths: list[str]):
    """The run files calibrate may use: one of each run, every one finished."""
    runs, seen = [], {}
    for p in paths:
        doc = load_run(p)
        if doc.run_id in seen:
            raise baselines.BaselineError(f"{p}: run {doc.run_id} is given twice (also as {seen[doc.run_id]}): one "
                                          f"run counted twice would halve its noise")
        if doc.kind != "suite":
            raise baselines.BaselineError(f"{p}: a {doc.kind} run file has no profile; baselines come from suite runs")
        if doc.status != "finished" or not doc.complete:
            state = doc.status if doc.complete else f"{doc.status} and incomplete"
            raise baselines.BaselineError(f"{p}: run {doc.run_id} is {state}: only finished runs calibrate a "
                                          f"baseline")
        seen[doc.run_id] = p
        runs.append(doc)
    return runs


def _target(file: str | None, profile: str, hardware_class: str) -> Path:
    return Path(file) if file else baselines.default_path(profile, hardware_class)


def _check_target(args) -> None:
    """--file is checked before any run file is read or any suite is run for --repeat."""
    if args.baseline_cmd in ("update", "calibrate") and args.file and not args.dry_run:
        check_file_target(args.file, "--file")


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


def _hosts(specs: list[str], runs) -> dict[str, str]:
    """--host LABEL:RUN_ID,... as run id -> label; a run id none of the runs has is a usage error, named."""
    out, ids = {}, {r.run_id for r in runs}
    for spec in specs:
        label, sep, rest = spec.partition(":")
        if not sep or not label or not rest:
            raise UsageError(f"--host {spec!r}: expected LABEL:RUN_ID[,RUN_ID...]")
        for rid in filter(None, (x.strip() for x in rest.split(","))):
            if rid not in ids:
                raise UsageError(f"--host {spec!r}: no run {rid!r} among the runs given")
            out[rid] = label
    return out


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except (baselines.BaselineError, profiles.ProfileError, UsageError, ValueError) as e:
        print(f"sglperf baseline: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    _check_target(args)
    if args.baseline_cmd == "show":
        return _show(args)
    if args.baseline_cmd == "update":
        return _update(args)
    return _calibrate(args)


def _show(args) -> int:
    """Each baseline's entries, their floors and what their noise catches."""
    def _replicates(name: str) -> int:  # the starts a floor may take: the profile's, where it loads
        try:
            return profiles.load(name).measurement.max_starts
        except Exception:
            return 1

    files = [Path(args.file)] if args.file else sorted(
        (baselines.BASELINE_DIR / args.profile).glob("*.json") if args.profile
        else baselines.BASELINE_DIR.glob("*/*.json"))
    for f in files:
        if ".candidate" in f.name:
            continue
        bf = baselines.load(f)
        reps = _replicates(bf.profile)
        print(f"{f}: profile {bf.profile}, hardware class {bf.hardware_class!r}, {bf.isl} in / {bf.osl} out")
        if bf.host_speed:
            print(f"  {baselines.host_speed_note(bf.host_speed, bf.hardware_class)}")
        for cname, lvls in bf.configs.items():
            for lv, metrics in sorted(lvls.items(), key=lambda kv: int(kv[0])):
                for m, e in metrics.items():
                    n = noise_of(e)
                    noise = (f", CV {n.cv:.2%} over {e.runs} runs, {n.df:.0f} df"
                             + (f", restarts {n.restart:.2%}" if n.restart is not None else "") + ", catches "
                             f"{n.detectable(floor=e.min_tolerance or 0.0):.1%} in one start"
                             + (f", {n.detectable(reps, floor=e.min_tolerance or 0.0):.1%} over {reps}"
                                if reps > 1 else "")) if n else ""
                    print(f"  {cname:<14} {bf.level_name(lv):<7} {m:<22} {e.value:>12,.1f}  floor {e.floor:>12,.1f} "
                          f"(-{e.tolerance:.1%}{noise})  {e.source}, {e.taken_at}")
    return 0


def _update(args) -> int:
    """A baseline (or its canary) from one reviewed run."""
    run = load_run(args.run)
    prof = profiles.load(run.profile)
    levels = [int(x) for x in args.levels.split(",")] if args.levels else None
    if not run.hardware_class:
        raise baselines.BaselineError(f"{args.run}: the run measured no server (no hardware class)")
    new = baselines.from_run(run, tolerance=args.tolerance or prof.measurement.default_tolerance,
                             metric=args.metric, configs=args.config, levels=levels, isl=prof.workload.isl,
                             osl=prof.workload.osl)
    if args.canary_only:
        if not new.canary:
            raise baselines.BaselineError(f"{args.run}: no config's output canary passed; only a passed canary "
                                          f"becomes a baseline")
        new = new.model_copy(update={"configs": {}})
        for cname, outs in new.canary.items():
            print(f"canary {cname}: {len(outs)} outputs, first {outs[0][:8]}")
    elif not new.configs:
        raise baselines.BaselineError(f"{args.run}: no valid level matches; invalid levels never become "
                                      f"baselines")
    _write(_target(args.file, run.profile, run.hardware_class), new, args.dry_run)
    return 0


def _calibrate(args) -> int:
    """A baseline from N runs (or the fleet's database), or an existing one extended by them."""
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
    if args.db:
        runs = fleet_runs(args)
    else:
        runs = calibration_runs(paths)
    if args.extend:
        return _extend(args, runs)
    if len(runs) < 2:
        raise baselines.BaselineError(f"calibrate needs at least 2 run files, got {len(runs)}")
    prof = profiles.load(runs[0].profile)
    metrics = []
    for m in args.metric or ["sustained_output_tps"]:
        metrics += list(LATENCY) if m == "latency" else [m]
    new = None
    for metric in metrics:
        floor = args.min_tolerance if args.min_tolerance is not None else prof.measurement.min_tolerance
        part, notes = calibration.calibrate(runs, metric=metric, isl=prof.workload.isl, osl=prof.workload.osl,
                                          floor=floor, max_tolerance=args.max_tolerance,
                                          target_drop=args.target_drop, starts=prof.measurement.max_starts,
                                          hosts=_hosts(args.host, runs))
        print(f"{metric}:\n" + "\n".join("  " + n for n in notes))
        new = baselines.merge(new, part)
    if not any(new.configs.values()):
        raise baselines.BaselineError(f"calibrate kept no level of {len(runs)} runs (each one's reason above): "
                                      f"nothing written")
    _write(_target(args.file, runs[0].profile, runs[0].hardware_class), new, args.dry_run)
    return 0


def _extend(args, runs) -> int:
    if not runs:
        raise baselines.BaselineError("--extend needs at least 1 run file")
    target = _target(args.file, runs[0].profile, runs[0].hardware_class)
    if not target.exists():
        raise baselines.BaselineError(f"--extend: {target} does not exist: calibrate it first")
    old = baselines.load(target)
    prof = profiles.load(runs[0].profile)
    floor = args.min_tolerance if args.min_tolerance is not None else prof.measurement.min_tolerance
    new = old
    for metric in args.metric or ["sustained_output_tps"]:
        new, notes = calibration.extend(new, runs, metric=metric, floor=floor, starts=prof.measurement.max_starts,
                                      target_drop=args.target_drop, hosts=_hosts(args.host, runs))
        print(f"{metric}:\n" + "\n".join("  " + n for n in notes))
    _write(target, new, args.dry_run)
    return 0
