"""The GLM-5 nightly's time to verdict, estimated from the simulator's seed preset: each level of `sim-seed` is run
once, long enough for every stopping rule, and the same records are then replayed through three rules, checking
when each would have stopped:
- before: a CI only from 10 batches of at least one request lifetime, to +/-1%, or decided against the floor;
- last: a window of 3 service lifetimes (metrics.service_lifetime) after a warm-up of the running requests, the
  interval of measure/intervals.py converged or decided (a plateau level: also within a third of the band,
  plateau.PLATEAU_SHARE, and a plateau level measured after another also once its ratio to it is decided with both
  intervals: plateau.decides_plateau_level with `earlier`): the rule until 2026-12-04's nineteenth session;
- now: as last, the plateau levels' share from the ratios the baseline measured among them (plateau.plateau_share,
  as Suite.decides): what the level runner does now;
- least: the first check at which the interval may be trusted at all (3 service lifetimes of window after the
  warm-up), whatever it reads: no stopping rule of this protocol stops sooner.
At time scale X a level's wall time is 1/X of the real system's, so the real nightly is the sum of stop times x X
(server starts excluded: GLM-5's weight loading is not the suite's to shorten), plus each level's drain: after its
stop the suite waits for the requests in flight (latencies are over the requests sent in the window, so the last of
them must finish), up to 3 median lifetimes + 10 s. The drain is printed apart and in the total.

    python benchmarks/nightly_time.py [--time-scale 10] [--levels 256,512,1024,2048,3072] [--configs rr1024-cds4,...]
                                      [--keep DIR | --replay DIR]

--keep DIR writes each level's records to DIR (CONFIG-cLEVEL.records.jsonl.gz, with a meta.json); --replay DIR
replays them through the rules again without running the simulator (a rule changed, the same records).

The floors are the committed sim-seed baseline's, scaled from its time scale (10) to the one run here.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglperf import engines  # noqa: E402
from sglperf.run import profiles
from sglperf.fileio import atomic_write_json, write_jsonl  # noqa: E402
from sglperf.judge.plateau import PLATEAU_SHARE, decides_plateau_level, plateau_compares, plateau_share, ratio_outcome
from sglperf.judge.floor import floor_outcome
from sglperf.run.launch import LaunchSpec, launch  # noqa: E402
from sglperf.measure.client import Target, run_loop  # noqa: E402
from sglperf.measure.intervals import batch_rates  # noqa: E402
from sglperf.measure.level import LevelSpec, drain_timeout, measure_level  # noqa: E402
from sglperf.measure.metrics import LevelEnd, MeasurementPolicy, level_result, token_arrivals  # noqa: E402
from sglperf.store import baselines  # noqa: E402
from sglperf.records import RequestRecord  # noqa: E402

BASE_SCALE = 10.0


def truncated(records, t):
    """The records as a check at time t saw them: finished ones, and the in-flight ones cut at t (cancelled)."""
    out = []
    for r in records:
        if r.send_time > t:
            continue
        if r.end_time <= t:
            out.append(r)
            continue
        keep = [i for i, x in enumerate(r.chunk_times) if x <= t]
        out.append(replace(r, end_time=t, chunk_times=tuple(r.chunk_times[i] for i in keep),
                           chunk_tokens=tuple(r.chunk_tokens[i] for i in keep), cancelled=True, error=None))
    return out


def drain_after(records, t: float) -> float:
    """The drain a stop at t costs: until the last request in flight at t has ended, within the suite's drain timeout
    (level._drain). Read off a level that ran on past t, where later requests kept the server as busy as before: an
    upper bound, since after a real stop the batch shrinks as it drains."""
    ends = [r.end_time for r in records if r.send_time <= t < r.end_time]
    return min(max(ends) - t, drain_timeout([r for r in records if r.end_time <= t])) if ends else 0.0


def old_interval(records, res):
    """The estimator before: k = min(30, window // lifetime) batches of >= a lifetime; unknown on zero spread."""
    if res.window_start is None or not res.lifetime_s:
        return None, 0
    w = (res.window_start, res.window_end)
    k = min(30, int((w[1] - w[0]) // res.lifetime_s))
    if k < 5:
        return None, k
    times, tokens = token_arrivals(records)
    rates = batch_rates(times, tokens, w, k)
    sd = rates.std(ddof=1)
    return (None if sd <= 1e-9 * rates.mean() else float(stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k))), k


def stop_times(records, t0, concurrency, floor, policy, plateau_band: float | None, cap: float,
               earlier: dict[str, tuple] | None = None, share: float = PLATEAU_SHARE
               ) -> tuple[dict[str, float | None], dict[str, object]]:
    """When each rule would have stopped the level (seconds after t0, within its `cap`: the drain after it is no
    stop), replaying its checks; `plateau_band` is None at a level the plateau does not compare, `earlier[rule]` the
    plateau levels before it as that rule stopped them, `share` the plateau levels' share of the band under "now".
    Also returns the level's result where "last" and "now" stopped it."""
    end = min(max(r.end_time for r in records), t0 + cap)
    stops: dict[str, float | None] = {"before": None, "last": None, "now": None, "least": None}
    earlier = earlier or {}
    rules = {rule: decides_plateau_level(floor, plateau_band, earlier.get(rule, ()),
                                         share=share if rule == "now" else PLATEAU_SHARE) if plateau_band else None
             for rule in ("last", "now")}
    t, need, at_stop = t0 + 1.0, max(policy.min_completions, concurrency), {}
    by_clients = replace(policy, warmup_completions=concurrency)

    def result(snap, t):
        return level_result(snap, concurrency=concurrency, rate=None, isl=128, osl=128, policy=policy, now=t,
                            latencies=False)
    while t <= end and None in stops.values():
        snap = truncated(records, t)
        res = result(snap, t)  # one interval for both rules: they differ only in the plateau's share
        if stops["before"] is None:  # its window: one generation of clients, then end-to-end lifetimes
            ok = [r for r in snap if r.ok]
            e2e = float(np.median([r.end_time - r.send_time for r in ok])) if ok else None
            was = level_result(snap, concurrency=concurrency, rate=None, isl=128, osl=128, policy=by_clients, now=t,
                               latencies=False, end=LevelEnd(lifetime_s=e2e))
            m = was.sustained_output_tps
            old, k = old_interval(snap, was) if m and was.completed_in_window >= need and was.window_s >= 3.0 \
                else (None, 0)
            if old is not None and k >= 10 and (old / m <= 0.01 or floor_outcome(m, old, floor) != "inconclusive"):
                stops["before"] = t - t0
        for rule, plateau in rules.items():
            mean, half = res.sustained_output_tps, res.sustained_output_tps_ci95
            trusted = (mean and half is not None and res.completed_in_window >= need and res.window_s >= 3.0
                       and res.lifetime_s and res.window_s / res.lifetime_s >= policy.trusted_window_lifetimes)
            if trusted and stops["least"] is None:  # the first check any rule may stop at
                stops["least"] = t - t0
            if stops[rule] is not None or not trusted:
                continue
            decided = plateau(res) if plateau else floor_outcome(mean, half, floor) != "inconclusive"
            if half / mean <= policy.ci_target or decided:
                stops[rule] = t - t0
                at_stop[rule] = res
        t += max(1.0, 0.1 * (t - t0))
    for rule in ("last", "now"):
        if rule not in at_stop:
            at_stop[rule] = result(truncated(records, end), end)
    return stops, at_stop


def measured(a, prof, scale, policy, levels, bf):
    """(config, level, records, plateau?, the simulator's share behind real time, the config's levels the plateau
    compares) per level: run, or read back from --replay; written to --keep."""
    if a.replay:
        meta = json.loads((Path(a.replay) / "meta.json").read_text())
        for row in meta["levels"]:
            path = Path(a.replay) / f"{row['config']}-c{row['level']}.records.jsonl.gz"
            records = [RequestRecord(**{k: tuple(v) if k in ("chunk_times", "chunk_tokens") else v
                                        for k, v in json.loads(line).items()})
                       for line in gzip.decompress(path.read_bytes()).splitlines()]
            compared = [r["level"] for r in meta["levels"] if r["config"] == row["config"] and r["plateau"]]
            yield row["config"], row["level"], records, row["plateau"], row["behind"], compared
        return
    engine = engines.get("sim")
    logs = Path(tempfile.mkdtemp(prefix="sglperf-nightly-"))
    kept = []
    for cname in a.configs.split(","):
        argv = prof.launch_argv(cname, extra=["--time-scale", str(a.time_scale)])
        srv = launch(LaunchSpec(cname, argv, logs, launch_timeout_s=120, terminate_timeout_s=30))
        try:
            ceiling = engine.ceiling(engine.server_info(srv.url, None), prof.workload.isl, prof.workload.osl)
            compared = [lv for lv in levels if plateau_compares(lv, ceiling, levels)]
            for level in levels:
                plateau = level in compared
                cap = capped(bf, cname, level, scale)
                spec = LevelSpec(concurrency=level, max_seconds=cap, stall_timeout_s=60, request_timeout_s=3600)
                m = run_loop(measure_level(Target(srv.url), prof.workload.client_workload(), spec,
                                           replace(policy, ci_target=0.0), engine=engine))
                behind = m.result.sim_behind_share or 0.0
                if a.keep:
                    write_jsonl(Path(a.keep) / f"{cname}-c{level}.records.jsonl.gz", m.records)
                    kept.append({"config": cname, "level": level, "plateau": plateau, "behind": behind})
                    atomic_write_json(Path(a.keep) / "meta.json", {"time_scale": a.time_scale, "levels": kept})
                yield cname, level, m.records, plateau, behind, compared
        finally:
            srv.stop()


def capped(bf, cname: str, level: int, scale: float) -> float:
    """A level's time limit: warm-up and 15 end-to-end lifetimes at the baseline's rate (room for the rule before)."""
    lifetime = 128 * level / (bf.entries(cname, level)["sustained_output_tps"].value * scale)
    return 16 * lifetime + 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-scale", type=float, default=BASE_SCALE)
    ap.add_argument("--levels", default="256,512,1024,2048,3072")
    ap.add_argument("--configs", default="rr1024-cds4,rr2048-cds8")
    ap.add_argument("--keep", help="write each level's records to this directory")
    ap.add_argument("--replay", help="replay the records --keep wrote, without running the simulator")
    a = ap.parse_args()
    prof = profiles.load("sim-seed")
    bf = baselines.load(baselines.default_path("sim-seed", "sim:glm5-nvfp4-rtxpro6000-tp8"))
    if a.replay:
        a.time_scale = json.loads((Path(a.replay) / "meta.json").read_text())["time_scale"]
    scale = a.time_scale / BASE_SCALE
    policy = MeasurementPolicy(ci_target=prof.measurement.ci_target)
    total = {"before": 0.0, "last": 0.0, "now": 0.0, "least": 0.0}
    drains = dict.fromkeys(total, 0.0)
    host_rows: list[bool] = []
    band = prof.measurement.plateau_band
    levels = [int(x) for x in a.levels.split(",")]
    print(f"sim-seed at time scale {a.time_scale:g}: stop time per level (s at this scale) and the real system's")
    earlier: dict[str, dict[str, tuple]] = {}
    for cname, level, records, plateau, behind, compared in measured(a, prof, scale, policy, levels, bf):
        cap = capped(bf, cname, level, scale)
        floor = bf.entries(cname, level)["sustained_output_tps"].floor * scale
        t0 = min(r.send_time for r in records)
        mine = earlier.setdefault(cname, {"last": (), "now": ()})
        share = plateau_share(band, [bf.entries(cname, lv)["sustained_output_tps"].value for lv in compared])
        stops, at_stop = stop_times(records, t0, level, floor, policy, band if plateau else None, cap,
                                    mine if plateau else None, share)
        if plateau:
            for rule in mine:
                mine[rule] += (at_stop[rule],)
        res = at_stop["now"]
        v, half = res.sustained_output_tps, res.sustained_output_tps_ci95
        at = f"; now stopped at {v:,.0f} ± {half / v:.2%}" if v and half else ""
        cells, drain = [], {}
        for k, v in stops.items():
            t = v if v is not None else cap
            drain[k] = drain_after(records, t0 + t)
            total[k] += t * a.time_scale
            drains[k] += drain[k] * a.time_scale
            cells.append(f"{k} {'>' if v is None else ''}{t:6.0f} s ({t * a.time_scale / 60:5.1f} min real)")
        host_rows.append(behind > policy.max_sim_behind)
        print(f"  {cname} c{level}{' (plateau)' if plateau else ''}: {'  '.join(cells)}; now's drain "
              f"{drain['now']:.0f} s ({drain['now'] * a.time_scale / 60:.1f} min real); sim behind {behind:.0%}{at}"
              f"{' (the host: the suite would call this level disturbed)' if host_rows[-1] else ''}", flush=True)
        if plateau and len(mine["now"]) == len(compared) > 1:  # the plateau's ratios as "now" stopped its levels
            first, *rest = mine["now"]
            for lv, r in zip(compared[1:], rest):
                ratio = r.sustained_output_tps / first.sustained_output_tps
                noise = math.hypot(first.sustained_output_tps_ci95 / first.sustained_output_tps,
                                   r.sustained_output_tps_ci95 / r.sustained_output_tps)
                print(f"  {cname} plateau at now's stops: c{lv} / c{compared[0]} = {ratio:.3f} ± {noise:.2%}: "
                      f"{ratio_outcome(ratio, noise, band)} (band ±{band:.0%}, share {share:.2f})")
    if hosts := sum(host_rows):
        print(f"{hosts} level(s) ran with the simulator more than {policy.max_sim_behind:.0%} behind real time: this "
              f"host cannot hold time scale {a.time_scale:g} there, and their rows are the host's (a lower "
              f"--time-scale is the honest run)")
    for k, v in total.items():
        print(f"levels' time to verdict, {k}: {v / 60:.0f} min of the real system ({v / 3600:.1f} h); with their "
              f"drains {(v + drains[k]) / 60:.0f} min ({(v + drains[k]) / 3600:.1f} h)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
