"""Calibration: a baseline's values and noise from N runs of one profile on one hardware class (`calibrate`),
and an existing baseline grown by new runs (`extend`): per level the mean, its run-to-run noise pooled over the
profile's levels (judge/noise.py), the within-run part, the host's part and a restart's part.
"""

from __future__ import annotations

from collections.abc import Sequence

import math
from scipy import stats
from ..records import METRICS, Rate, half_width, level_name, value_format
from .noise import MIN_TOLERANCE, Noise, host_share, moderate, prior, restart_share
from .noise import of as noise_of
from .starts import first_kept, kept_starts
from ..store.rundoc import RunDoc
from ..store.baselines import (
    BaselineError, BaselineFile, Entry, PooledNoise, SCHEMA_VERSION, host_speed_note, merge, metric_value, now_iso,
    pooled_host_speed, runs_host_speed,
)


def calibrated_tolerance(values: list[float], *, floor: float = MIN_TOLERANCE) -> tuple[float, float, float]:
    """(mean, cv, tolerance) of one level from n >= 2 runs alone (no pool): judge/noise.Noise.tolerance."""
    n = len(values)
    if n < 2:
        raise BaselineError(f"calibrate needs at least 2 runs of each level, got {n}")
    mean = sum(values) / n
    cv = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 / mean
    return mean, cv, min(Noise(cv, n - 1, 0.0, n).tolerance(floor=floor), 0.5)


def _log_variance(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    m = sum(logs) / len(logs)
    return sum((x - m) ** 2 for x in logs) / (len(logs) - 1)


def calibrate(runs: list[RunDoc], *, metric: str = "sustained_output_tps", isl: int, osl: int,
              floor: float = MIN_TOLERANCE, max_tolerance: float | None = None,
              target_drop: float | None = None, starts: int = 1,
              hosts: dict[str, str] | None = None) -> tuple[BaselineFile, list[str]]:
    """A baseline from N runs of one profile on one hardware class: per level the mean, its run-to-run noise
    pooled with the profile's other levels (judge/noise.py), the calibration runs' own within-run part, and the
    tolerance that keeps false regressions at 1% per level. Levels invalid in any run are left out (and listed);
    each level's note says the smallest drop its floor catches in one server start and, where the profile allows
    more (`starts`: its replicates; a level near its floor is measured again, judge/starts.another_start), over
    that many; with `target_drop`, how many runs would catch that one. `hosts`: run id -> host label, where the
    run files do not say (their fingerprint's host_id); with runs from 2+ hosts, the part of the noise that stays
    with a host is estimated (judge/noise.host_share) and a floor over several starts keeps it."""
    profiles = {r.profile for r in runs}
    classes = {r.hardware_class for r in runs}
    if len(profiles) != 1 or len(classes) != 1:
        raise BaselineError(f"calibrate needs runs of one profile on one hardware class; got profiles "
                            f"{sorted(profiles)} and hardware classes {sorted(map(str, classes))}")
    notes: list[str] = []
    keep, within = _levels_of(runs, metric, notes)
    variances = {k: _log_variance(v) for k, v in keep.items()}
    s0, d0 = prior(list(variances.values()), [len(v) - 1 for v in keep.values()])
    host_sd, n_hosts = _hosts_part(runs, hosts, keep, notes)
    restart = restart_share(run_restarts(runs, list(keep), metric))
    notes.append(restart_note(restart))
    out: dict[str, dict[str, dict[str, Entry]]] = {}
    for (cname, lv), vals in keep.items():
        mine = [r for r in runs if cname in r.configs]
        last = mine[-1]
        n = len(vals)
        var, df = moderate(variances[(cname, lv)], n - 1, s0, d0)
        noise = Noise(math.sqrt(var), df, typical_within(within[(cname, lv)], math.sqrt(var)), n, host_sd, n_hosts,
                      restart[0] if restart else None)
        mean, own = sum(vals) / n, math.sqrt(variances[(cname, lv)])
        tol = noise.tolerance(floor=floor)
        if max_tolerance is not None and tol > max_tolerance:
            notes.append(f"{cname} {_name(runs, lv)}: left out: CV {noise.cv:.2%} over {n} runs needs a tolerance of "
                         f"{tol:.0%}, above --max-tolerance {max_tolerance:.0%}: too noisy to judge in one run")
            continue
        if tol >= 1:  # a floor at or below zero judges nothing; its noise is known too poorly (df) or too large
            notes.append(f"{cname} {_name(runs, lv)}: left out: CV {noise.cv:.2%} over {n} runs ({df:.0f} df) "
                         f"needs a tolerance of {tol:.0%}, a floor at or below zero: calibrate over more runs")
            continue
        host = f", the host's {min(host_sd, noise.cv):.2%}" if n_hosts else ""
        note = (f"CV {noise.cv:.2%} ({df:.0f} df; own {own:.2%}, between starts {noise.between:.2%}{host}, within a "
                f"run {noise.within:.2%}) over {n} runs -> tolerance {tol:.2%}; "
                + _caught(noise, metric, floor, starts, target_drop))
        out.setdefault(cname, {})[lv] = {metric: Entry(
            metric=metric, value=round(mean, 4 if abs(mean) < 10 else 2), tolerance=round(tol, 4),
            noise_cv=round(noise.cv, 5), runs=n,
            noise_df=round(df, 1), within_cv=round(noise.within, 5), own_cv=round(own, 5), min_tolerance=floor,
            host_cv=round(min(host_sd, noise.cv), 5) if n_hosts else None, hosts=n_hosts or None,
            restart_cv=round(restart[0], 5) if restart else None, restart_df=restart[1] if restart else None,
            taken_at=now_iso(),
            source="runs " + ", ".join(r.run_id for r in mine), sglperf_version=last.sglperf_version,
            fingerprint=last.config_fingerprint(cname), note=note)}
        notes.append(f"{cname} {_name(runs, lv)}: mean {mean:{value_format(metric)}}, {note}")
    pooled = [PooledNoise(metric=metric, cv=round(math.sqrt(s0), 5), prior_df=round(d0, 1), levels=len(keep))]
    speed = runs_host_speed(runs)
    hardware = runs[0].hardware_class or ""
    if speed is not None:
        notes.append(host_speed_note(speed, hardware))
    return BaselineFile(schema_version=SCHEMA_VERSION, profile=runs[0].profile, hardware_class=hardware, isl=isl,
                        osl=osl, description=f"calibrated from {len(runs)} runs",
                        configs=out, pooled=pooled, host_speed=speed, open_loop=runs[0].open_loop), notes


def _name(runs: list[RunDoc], key: str) -> str:
    """A stored level's name (its key is the number alone): r40 where the runs measured offered rates, else c40."""
    return level_name(Rate(int(key)) if runs and runs[0].open_loop else key)


def _levels_of(runs: list[RunDoc], metric: str, notes: list[str]):
    """(values, within): each level's value in every run of its config (left out, and noted, where invalid or missing
    in any) and each run's own relative SE of it. Runs of one config each (`--perf-config rr16`, then rr64) calibrate
    together: a run that did not measure a config is no gap in it."""
    values: dict[tuple[str, str], list[float]] = {}
    within: dict[tuple[str, str], list[float]] = {}
    bad: set[tuple[str, str]] = set()
    for r in runs:
        for cname, c in r.configs.items():
            for lv in c.levels:
                res = run_value(c, lv)
                v = metric_value(res, metric)
                if res.valid and v is not None and v > 0:
                    values.setdefault((cname, lv), []).append(float(v))
                    half = half_width(res, metric)
                    within.setdefault((cname, lv), []).append((half or 0.0) / 1.96 / float(v))
                else:
                    bad.add((cname, lv))
    keep = {}
    for key, vals in sorted(values.items()):
        if key in bad or len(vals) != sum(key[0] in r.configs for r in runs):  # a run of other configs is no gap
            notes.append(f"{key[0]} {_name(runs, key[1])}: left out (invalid or missing in some run)")
        elif len(vals) < 2:
            raise BaselineError(f"calibrate needs at least 2 runs of each level, got {len(vals)}")
        else:
            keep[key] = vals
    return keep, within


def _hosts_part(runs: list[RunDoc], hosts, keep: dict, notes: list[str]) -> tuple[float, int]:
    """(the host's part of the run-to-run noise as an SD, how many hosts), where every run says its host."""
    labels = [h for h in run_hosts(runs, hosts) if h]
    if len(labels) < len(runs):
        notes.append("hosts: not known for every run (no host_id in their fingerprints; --host LABEL:RUN_ID,...): "
                     "the noise is taken as all between starts")
        return 0.0, 0
    host_sd, n_hosts = host_share({k: _by_host(labels, v) for k, v in keep.items()})
    counts = ", ".join(f"{h}: {labels.count(h)} run{'s' if labels.count(h) > 1 else ''}" for h in dict.fromkeys(labels))
    notes.append(f"hosts: {n_hosts} ({counts})"
                 f"; the host's part of the run-to-run noise {host_sd:.2%} (SD, averaged over the levels)")
    return host_sd, n_hosts


def _caught(noise: Noise, metric: str, floor: float, starts: int, target_drop: float | None) -> str:
    """What a floor of this noise catches with 95% power, in one start and over the profile's; with `target_drop`,
    how many runs would catch that one."""
    caught = noise.detectable(floor=floor)
    change = "rise" if METRICS[metric].better == "lower" else "drop"
    note = f"a {change} of {caught:.1%} is caught with 95% power in one server start"
    if starts > 1:
        caught = noise.detectable(starts, floor=floor)
        note += f", {caught:.1%} over the {starts} starts the profile allows"
    if target_drop is not None and caught > target_drop and floor >= target_drop:
        note += f"; {target_drop:.0%} is within the profile's min_tolerance ({floor:.0%}): no run count changes that"
    elif target_drop is not None and caught > target_drop:
        more = noise.runs_for(target_drop, starts, floor=floor)
        note += (f"; {target_drop:.0%} needs {more} runs" if more else
                 f"; no number of runs catches {target_drop:.0%} in {starts} server start"
                 f"{'s' if starts > 1 else ''} (between-start noise alone: measure more starts per level, "
                 f"[measurement] max_starts)")
    return note


def run_hosts(runs: list[RunDoc], hosts: dict[str, str] | None = None) -> list[str | None]:
    """Which host each run came from: `hosts` (run id -> label, given on the command line), else the fingerprint's
    host_id, else None."""
    return [(hosts or {}).get(r.run_id) or next((fp.get("host_id") for c in r.configs
                                                 if (fp := r.config_fingerprint(c)).get("host_id")), None)
            for r in runs]


def run_value(config, level: str, noise: Noise | None = None):
    """A run's one value of a level for a calibration: its first server start that the floor keeps (judge/starts.
    first_kept: undisturbed, not set aside as another mode of the server's start)."""

    return first_kept([config.levels[level], *config.replicates.get(level, [])], noise)


def run_restarts(runs: list[RunDoc], levels, metric: str = "sustained_output_tps",
                 noise: dict | None = None) -> list[list[tuple[float, float]]]:
    """Per run and level (of `levels`: (config, level) pairs), the starts its floor would keep, as (value, own
    relative SE): what judge/noise.restart_share pools."""

    out = []
    for r in runs:
        for cname, lv in levels:
            c = r.configs.get(cname)
            if c is None or lv not in c.levels:
                continue
            kept = kept_starts([c.levels[lv], *c.replicates.get(lv, [])], (noise or {}).get((cname, lv)))
            pts = []
            for res in kept:
                v = metric_value(res, metric)
                if res.valid and v is not None and v > 0:
                    half = half_width(res, metric)
                    pts.append((float(v), (half or 0.0) / 1.96 / float(v)))
            out.append(pts)
    return out


def pool_restarts(parts: Sequence[tuple[float | None, float | None] | None]) -> tuple[float, float] | None:
    """(SD, df) of restart estimates pooled by their degrees of freedom; None where none was measured."""
    known = [(sd, df) for p in parts if p and (sd := p[0]) is not None and (df := p[1])]
    if not known:
        return None
    df = sum(d for _, d in known)
    return math.sqrt(sum(sd ** 2 * d for sd, d in known) / df), df


def restart_note(restart: tuple[float, float] | None) -> str:
    if restart is None:
        return ("restarts: no level of these runs was measured over two server starts: each start is taken as a "
                "fresh draw of the between-start noise (all but the host's part)")
    return (f"restarts: {restart[0]:.2%} (SD, {restart[1]:.0f} df) between the server starts of one run, pooled over "
            f"the levels: the rest of the between-start noise stays with the run however often it restarts")


def typical_within(rel_se: list[float], cv: float) -> float:
    """The within-run part of a level's run-to-run noise (RMS of its runs' own relative SEs), each SE taken at most
    the run-to-run CV: one start whose interval was wide (a mode change inside its window) otherwise made the
    typical start look imprecise, the between-start part small and
    the floor tight (tolerance 7.6% -> 4.0% from one such run), where a later run's own wide interval is judged
    beside the floor anyway."""
    return math.sqrt(sum(min(w, cv) ** 2 for w in rel_se) / len(rel_se)) if rel_se else 0.0


def extend(old: BaselineFile, runs: list[RunDoc], *, metric: str = "sustained_output_tps",
           floor: float = MIN_TOLERANCE, starts: int = 1, target_drop: float | None = None,
           hosts: dict[str, str] | None = None) -> tuple[BaselineFile, list[str]]:
    """A calibrated baseline grown by runs made since, where the calibration runs' files are gone (another machine):
    calibrate over the old runs and the new, the old ones present by what their entry keeps of them (their count,
    mean and own log-scale spread), the new ones by their values (`run_value`); the levels are then pooled again
    (judge/noise.prior). Healthy runs on hosts a calibration never saw are where its noise is tested: they may lie
    further out than the calibration's hosts said. Each level's note says how far the new runs lie from the old
    noise (an F test). The host's part stays the entry's unless the new runs estimate one (2+ hosts with 2+ runs
    each); each new host counts."""
    notes: list[str] = []
    if {r.profile for r in runs} != {old.profile} or {r.hardware_class for r in runs} != {old.hardware_class}:
        raise BaselineError(f"--extend needs runs of {old.profile} on {old.hardware_class!r}, the baseline's; got "
                            f"profiles {sorted({r.profile for r in runs})} and hardware classes "
                            f"{sorted(map(str, {r.hardware_class for r in runs}))}")
    known = [h for h in run_hosts(runs, hosts) if h]
    taken = {x.strip() for lvls in old.configs.values() for ms in lvls.values() for e in ms.values()
             for x in e.source.removeprefix("runs ").split(",")}
    if twice := [r.run_id for r in runs if r.run_id in taken]:
        raise BaselineError(f"--extend: run {', '.join(twice)} is already in the baseline's calibration: one run "
                            f"counted twice would halve its noise")
    grown = _grown_levels(old, runs, metric, notes)
    s0, d0 = prior([g[3] / g[4] for g in grown.values()], [g[4] for g in grown.values()])
    restart = pool_restarts([*[(g[0].restart_cv, g[0].restart_df) for g in grown.values()][:1],
                             restart_share(run_restarts(runs, list(grown), metric,
                                                        {k: noise_of(g[0]) for k, g in grown.items()}))])
    notes.append(restart_note(restart))
    out: dict[str, dict[str, dict[str, Entry]]] = {}
    for (cname, lv), (e, vals, rel_se, ss, df_own) in grown.items():
        noise = noise_of(e)
        assert noise is not None, "_grown_levels keeps calibrated levels only"
        n0, n = e.runs, len(vals)
        var, df = moderate(ss / df_own, df_own, s0, d0)
        cv = math.sqrt(var)
        fit = sum((math.log(v / e.value)) ** 2 for v in vals) / n / noise.cv ** 2  # the new runs, the old noise
        p_fit = float(stats.f.sf(fit, n, noise.df))
        within = math.sqrt((n0 * noise.within ** 2 + n * typical_within(rel_se, cv) ** 2) / (n0 + n))
        host, n_hosts = _host_after(noise, known if len(known) == len(runs) else None, vals, (cname, lv))
        now = Noise(cv, df, within, n0 + n, min(host, cv), n_hosts, restart[0] if restart else None)
        tol = now.tolerance(floor=floor)
        mean = (n0 * e.value + sum(vals)) / (n0 + n)  # arithmetic, as calibrate's
        caught = now.detectable(starts, floor=floor)
        note = (f"CV {noise.cv:.2%} -> {cv:.2%} ({df:.0f} df; own {math.sqrt(ss / df_own):.2%}) over {n0} + {n} "
                f"runs: the new runs read " + ", ".join(f"{v / e.value - 1:+.1%}" for v in vals)
                + f" ({math.sqrt(fit):.2f} x the entry's noise, F p = {p_fit:.2g}); tolerance {e.tolerance:.2%} -> "
                f"{tol:.2%}; a drop of {now.detectable(floor=floor):.1%} is caught with 95% power in one server "
                f"start" + (f", {caught:.1%} over the {starts} starts the profile allows" if starts > 1 else ""))
        if target_drop is not None and caught > target_drop:
            more = now.runs_for(target_drop, starts, floor=floor)
            note += (f"; {target_drop:.0%} needs {more} runs" if more
                     else f"; no number of runs catches {target_drop:.0%}")
        notes.append(f"{cname} {_name(runs, lv)}: mean {e.value:{value_format(metric)}} -> "
                     f"{mean:{value_format(metric)}}, {note}")
        out.setdefault(cname, {})[lv] = {metric: e.model_copy(update=dict(
            value=round(mean, 4 if abs(mean) < 10 else 2), tolerance=round(tol, 4), noise_cv=round(cv, 5), runs=n0 + n,
            noise_df=round(df, 1), within_cv=round(within, 5), own_cv=round(math.sqrt(ss / df_own), 5),
            host_cv=round(min(host, cv), 5) if n_hosts else None, hosts=n_hosts or None,
            restart_cv=round(restart[0], 5) if restart else None, restart_df=restart[1] if restart else None,
            taken_at=now_iso(),
            source=e.source + ", " + ", ".join(r.run_id for r in runs), sglperf_version=runs[-1].sglperf_version,
            note=note))}
    if len(known) == len(runs):
        notes.insert(0, f"new hosts: {len(set(known))} ("
                     + ", ".join(f"{h}: {known.count(h)}" for h in dict.fromkeys(known)) + " runs)")
    pooled = [PooledNoise(metric=metric, cv=round(math.sqrt(s0), 5), prior_df=round(d0, 1), levels=len(grown))]
    speed = pooled_host_speed(old.host_speed, runs_host_speed(runs))
    if speed is not None and speed != old.host_speed:
        notes.append(host_speed_note(speed, old.hardware_class))
    grown_file = merge(old, old.model_copy(update={"configs": out, "pooled": pooled if grown else [],
                                                   "host_speed": speed}))
    return grown_file.model_copy(update={"description": f"{old.description}; extended by {len(runs)} runs"}), notes


def _grown_levels(old: BaselineFile, runs: list[RunDoc], metric: str, notes: list[str]) -> dict:
    """level -> (entry, the new runs' values, their within parts, the pooled sum of squares, its df): the calibrated
    levels every new run measured validly (the others kept as they are, and noted)."""
    grown: dict[tuple[str, str], tuple] = {}  # level -> (entry, new values, their within parts, ss, df)
    for cname, lvls in old.configs.items():
        for lv, metrics in lvls.items():
            e = metrics.get(metric)
            noise = noise_of(e) if e is not None else None
            if e is None or noise is None or e.runs < 2:
                if e is not None:
                    notes.append(f"{cname} {_name(runs, lv)}: kept as it is: not calibrated (no noise to extend)")
                continue
            vals: list[float] = []
            rel_se: list[float] = []
            for r in runs:
                c = r.configs.get(cname)
                res = run_value(c, lv, noise) if c is not None and lv in c.levels else None
                v = metric_value(res, metric) if res is not None and res.valid else None
                if v is None or v <= 0:
                    vals = []
                    notes.append(f"{cname} {_name(runs, lv)}: kept as it is: invalid or missing in run {r.run_id}")
                    break
                vals.append(float(v))
                half = half_width(res, metric)
                rel_se.append((half or 0.0) / 1.96 / float(v))
            if not vals:
                continue
            n0, n = e.runs, len(vals)
            logs = [math.log(v) for v in vals]
            mx = sum(logs) / n
            ss = ((e.own_cv if e.own_cv is not None else noise.cv) ** 2 * (n0 - 1) + sum((x - mx) ** 2 for x in logs)
                  + n0 * n / (n0 + n) * (math.log(e.value) - mx) ** 2)
            grown[(cname, lv)] = (e, vals, rel_se, ss, n0 + n - 1)
    return grown


def _host_after(noise: Noise, labels: list[str] | None, vals: list[float], key) -> tuple[float, int]:
    """The host's part and the hosts counted once the new runs are in (`labels`: their hosts, where every run says):
    the entry's part unless the new runs estimate one (2+ hosts with 2+ runs each); each new host counts."""
    host, n_hosts = noise.host, noise.hosts
    if labels is None:
        return host, n_hosts
    groups = _by_host(labels, vals)
    h_new, g = host_share({key: groups})
    if sum(len(v) >= 2 for v in groups.values()) >= 2:  # one host's pair says little of the hosts' part
        host = math.sqrt(((max(n_hosts, 1) - 1) * host ** 2 + (g - 1) * h_new ** 2) / (max(n_hosts, 1) - 1 + g - 1))
    return host, n_hosts + len(set(labels))


def _by_host(labels: list[str], values: list[float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for h, v in zip(labels, values):
        out.setdefault(h, []).append(v)
    return out
