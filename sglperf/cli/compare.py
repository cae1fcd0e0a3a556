"""`sglperf compare RUN_A RUN_B`: is run B slower than run A, where, and how sure. Per config and level: both
sustained throughputs with their intervals, the change with its interval and a verdict (judge/compare.py), and
what changed between the runs' stacks. Exit status: 0 compared with no level slower, 1 some level slower, 2 bad
input."""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import fraction
from ..categories import UsageError
from ..decide.replay import as_result
from ..environment.fingerprint import describe_diff
from ..fileio import atomic_write_bytes, atomic_write_json, check_file_target
from ..judge import compare as rule
from ..judge.noise import of as noise_of
from ..store import baselines
from ..store.rundoc import RunDoc, RunFileError, load_run

METRIC = "sustained_output_tps"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", help="the run compared against (reports/runs/<run>.json), e.g. before an upgrade")
    p.add_argument("run_b", help="the run judged, e.g. after it")
    p.add_argument("--baseline", default=None,
                   help="a calibrated baseline of this stack, for the between-start noise (default: the run A's "
                        "profile's baseline on its hardware, where its server arguments match run A's)")
    p.add_argument("--margin", type=fraction("--margin"), default=rule.MARGIN,
                   help=f"a change inside ± this share is no change (default {rule.MARGIN:.0%})")
    p.add_argument("--config", action="append", default=None, help="compare this config only (repeatable)")
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE", help="write the comparison as JSON "
                   "('-' for stdout)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw both runs' levels and the change")


def main(args: argparse.Namespace) -> int:
    try:
        a, b = load_run(args.run_a), load_run(args.run_b)
        bf = noise_baseline(args.baseline, a)
        for target in (args.plot, None if args.json_out == "-" else args.json_out):
            if target:
                check_file_target(target, "--plot" if target == args.plot else "--json")
        result = compare(a, b, bf, margin=args.margin, configs=args.config)
    except (RunFileError, baselines.BaselineError, UsageError) as e:
        print(f"sglperf compare: {e}", file=sys.stderr)
        return 2
    if args.json_out == "-":
        print(json.dumps(as_json(result), indent=2))
    else:
        print("\n".join(text(result, a, b, bf)))
        if args.json_out:
            atomic_write_json(args.json_out, as_json(result))
    if args.plot:
        from ..report.plots import comparison

        atomic_write_bytes(args.plot, comparison(result))
    return 1 if result.slower else 0


def noise_baseline(path: str | None, a: RunDoc) -> baselines.BaselineFile | None:
    """The baseline whose calibrated noise sizes the between-start part: the one named, else run A's profile's on
    its hardware, taken only where it was calibrated on the stack run A ran (its entries' server arguments)."""
    if path:
        return baselines.load(path)
    if not a.hardware_class:
        return None
    default = baselines.default_path(a.profile, a.hardware_class)
    if not default.exists():
        return None
    bf = baselines.load(default)
    for config in a.configs:
        argv = a.config_fingerprint(config).get("server_args")
        for entries in bf.configs.get(config, {}).values():
            for e in entries.values():
                if argv and e.fingerprint.get("server_args") not in (None, argv):
                    return None
    return bf


def starts(doc, key: str) -> list:
    return [as_result(d) for d in [doc.levels[key], *doc.replicates.get(key, [])]]


def whole_runs(a: RunDoc, b: RunDoc) -> str:
    """Why two runs cannot be compared at all, else ''."""
    if a.hardware_class != b.hardware_class:
        return f"other hardware class: A {a.hardware_class}, B {b.hardware_class}"
    wa, wb = (a.fingerprint or {}).get("workload"), (b.fingerprint or {}).get("workload")
    if wa and wb and wa != wb:
        return f"other workload: A {wa}, B {wb}"
    if a.open_loop != b.open_loop:
        return "one run's levels are offered rates, the other's concurrencies"
    return ""


def compare(a: RunDoc, b: RunDoc, bf: baselines.BaselineFile | None, *, margin: float = rule.MARGIN,
            configs: list[str] | None = None) -> rule.Comparison:
    out = rule.Comparison(a.run_id, b.run_id, not_comparable=whole_runs(a, b), margin=margin)
    names = [c for c in a.configs if c in b.configs and (not configs or c in configs)]
    if configs and (missing := [c for c in configs if c not in names]):
        raise UsageError(f"--config {', '.join(missing)}: not a config of both runs (A: {', '.join(a.configs)}; "
                         f"B: {', '.join(b.configs)})")
    wrong = {f.split(":")[0]: f for f in a.canary_failures() + b.canary_failures()}
    for name in names:
        ca, cb = a.configs[name], b.configs[name]
        changed = describe_diff(a.config_fingerprint(name), b.config_fingerprint(name), lead="changed from A to B")
        if changed:
            out.changed[name] = changed
        for key in sorted(set(ca.levels) & set(cb.levels), key=int):
            entry = bf.entries(name, int(key)).get(METRIC) if bf else None
            noise = noise_of(entry) if entry else None
            sa, sb = rule.side(starts(ca, key), METRIC, noise), rule.side(starts(cb, key), METRIC, noise)
            level = ca.levels[key].name
            why = out.not_comparable or (f"output canary failed ({wrong[name]}): a server that returns garbage "
                                         f"has no speed" if name in wrong else "")
            if why:
                out.levels.append(rule.LevelChange(name, level, sa, sb, rule.NOT_COMPARABLE, why=why))
            else:
                out.levels.append(rule.change(name, level, sa, sb, noise, margin))
    return out


def text(result: rule.Comparison, a: RunDoc, b: RunDoc, bf) -> list[str]:
    out = [f"sglperf compare: A = {a.run_id} ({a.profile}, {a.hardware_class}, {a.status}), "
           f"B = {b.run_id} ({b.profile}, {b.hardware_class}, {b.status})",
           f"sustained output tok/s, 95% intervals; no change inside ±{result.margin:.0%}; between-start noise: "
           + (f"{bf.profile}'s baseline on {bf.hardware_class}" if bf else "not known (no calibrated baseline of "
              "this stack: the intervals hold each run's own noise only)")]
    if result.not_comparable:
        out.append(f"NOT COMPARABLE: {result.not_comparable}")
    out += ["  " + rule.line(c) for c in result.levels]
    out += [f"  {config}: {what}" for config, what in result.changed.items()]
    if not result.levels:
        out.append("  no level measured in both runs")
    slower = result.slower
    out.append(f"{len(slower)} of {len(result.levels)} levels SLOWER" + (
        ": " + ", ".join(f"{c.config} {c.level} {c.change:+.1%}" for c in slower) if slower else ""))
    return out


def as_json(result: rule.Comparison) -> dict:
    return {"run_a": result.run_a, "run_b": result.run_b, "margin": result.margin,
            "not_comparable": result.not_comparable or None, "changed": result.changed,
            "levels": [c.to_dict() for c in result.levels]}

