"""PNG plots for the report: a level's throughput over time (steady-state window shaded), its latency
distributions, and a config's throughput-vs-concurrency curve with floors, baseline, whole-run, peak and ceiling.

Every point drawn comes from the records and samples saved beside the run.
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np

os.environ.setdefault("MPLCONFIGDIR", os.path.join(tempfile.gettempdir(), "sglperf-matplotlib"))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..measure.metrics import token_arrivals
from ..measure.server_view import server_counts  # noqa: E402
from ..records import GpuSample, HostSample, LevelResult, RequestRecord, ServerSample  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def level_timeline(records: list[RequestRecord], samples: list[ServerSample], r: LevelResult) -> bytes:
    t0 = min((x.send_time for x in records), default=0.0)
    times, tokens = token_arrivals(records)
    fig, ax = plt.subplots(figsize=(9, 4))
    if times.size:
        edges = np.arange(0, np.ceil(times.max() - t0) + 1.0, 1.0)
        counts, _ = np.histogram(times - t0, bins=edges, weights=tokens)
        ax.step(edges[:-1], counts, where="post", label="client: output tok/s (1-s buckets)", color="tab:blue")
    finished = bool(r.server_count_at_completion)
    pts = [(t - t0, v) for t, v in server_counts(samples, finished)]
    if len(pts) > 2:
        ts, vs = np.array(pts).T
        ax.plot(ts[1:], np.diff(vs) / np.maximum(np.diff(ts), 1e-9), color="tab:orange", alpha=0.8,
                label="server: output tok/s (" + ("finished requests' counter)" if finished else "from counters)"))
    if r.window_start is not None:
        ax.axvspan(r.window_start - t0, r.window_end - t0, color="tab:green", alpha=0.15,
                   label=f"steady-state window ({r.window_s:.1f} s)")
    if r.sustained_output_tps:
        ax.axhline(r.sustained_output_tps, color="tab:green", ls="--",
                   label=f"sustained {r.sustained_output_tps:,.0f} ± {r.sustained_output_tps_ci95 or 0:,.0f} tok/s")
    ax.set_ylim(bottom=0)  # from zero: small wiggles must not look like cliffs
    ax.set_xlabel("seconds since the level started")
    ax.set_ylabel("output tokens / s")
    ax2 = ax.twinx()
    inflight_t = sorted([(x.send_time - t0, 1) for x in records] + [(x.end_time - t0, -1) for x in records])
    if inflight_t:
        tt, dd = zip(*inflight_t)
        ax2.step(tt, np.cumsum(dd), where="post", color="gray", alpha=0.4, label="in flight (client)")
        ax2.set_ylabel("requests in flight")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower center", fontsize=8)
    ax.set_title(f"{r.name}: throughput over time")
    return _png(fig)


def level_disturbance(t0: float, host: list[HostSample], server: list[ServerSample], gpus: list[GpuSample],
                      r: LevelResult) -> bytes:
    """Beside the throughput timeline, on its time axis: what else took the machine. Top: cores used by other
    processes and stolen by the hypervisor (and the simulator's lateness, where it reports it); bottom, where GPUs
    were sampled: SM clock per GPU, with the windows' clock-event reasons marked."""
    rows = 2 if gpus else 1
    fig, axes = plt.subplots(rows, 1, figsize=(9, 2.6 * rows + 0.6), sharex=True, squeeze=False)
    ax = axes[0][0]
    if len(host) > 1:
        t = np.array([x.time - t0 for x in host])
        dt = np.maximum(np.diff(t), 1e-9)
        busy, client, server_s, steal = (np.diff(np.array([getattr(x, k) for x in host]))
                                         for k in ("busy_s", "client_s", "server_s", "steal_s"))
        ax.plot(t[1:], np.maximum(busy - client - server_s, 0) / dt, color="tab:red", label="other processes (cores)")
        ax.plot(t[1:], steal / dt, color="tab:purple", label="stolen by the hypervisor (cores)")
        ax.plot(t[1:], client / dt, color="tab:blue", alpha=0.5, label="the client (cores)")
        stalls = [x.mem_stall_s for x in host]
        if all(x is not None for x in stalls):
            ax.plot(t[1:], np.diff(np.array(stalls)) / dt, color="tab:brown",
                    label="tasks waiting for memory (share of time)")
    lag = [(s.time - t0, s.sim_behind_s_total, s.sim_engine_s_total) for s in server
           if s.sim_behind_s_total is not None and s.sim_engine_s_total is not None]
    if len(lag) > 1:
        ts, b, e = np.array(lag).T
        ax.plot(ts[1:], np.diff(b) / np.maximum(np.diff(e), 1e-9), color="tab:orange",
                label="simulator behind real time (share of engine time)")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("cores / share")
    title = "; ".join(r.disturbances) or "no disturbance past the thresholds"
    ax.set_title(title if len(title) < 110 else title[:107] + "...", fontsize=9)
    if gpus:
        g_ax = axes[1][0]
        for idx in sorted({g.index for g in gpus}):
            mine = [g for g in gpus if g.index == idx and g.sm_mhz is not None]
            if mine:
                g_ax.plot([g.time - t0 for g in mine], [g.sm_mhz for g in mine], label=f"GPU {idx} SM MHz")
            marked = [g for g in gpus if g.index == idx and g.reasons and g.reasons & ~0x1]
            if marked:
                g_ax.scatter([g.time - t0 for g in marked], [g.sm_mhz or 0 for g in marked], s=8, color="tab:red",
                             label=f"GPU {idx} clock event "
                                   f"({', '.join(sorted({n for g in marked for n in _names(g)}))})")
        g_ax.set_ylim(bottom=0)
        g_ax.set_ylabel("SM clock (MHz)")
        p_ax = g_ax.twinx()  # the load the clocks carry: power against its limit
        for idx in sorted({g.index for g in gpus}):
            mine = [g for g in gpus if g.index == idx and g.power_w is not None]
            if mine:
                p_ax.plot([g.time - t0 for g in mine], [g.power_w for g in mine], color="tab:gray", alpha=0.6,
                          label=f"GPU {idx} power (W)")
                limit = max((g.power_limit_w or 0) for g in mine)
                if limit:
                    p_ax.axhline(limit, color="tab:gray", ls=":", label=f"power limit {limit:.0f} W")
        p_ax.set_ylim(bottom=0)
        p_ax.set_ylabel("power (W)")
        p_ax.legend(loc="upper right", fontsize=7)
    for row in axes:
        a = row[0]
        if r.window_start is not None:
            a.axvspan(r.window_start - t0, r.window_end - t0, color="tab:green", alpha=0.12)
        a.legend(loc="lower right", fontsize=7)
    axes[-1][0].set_xlabel("seconds since the level started")
    return _png(fig)


def _names(g: GpuSample) -> list[str]:
    from ..environment.gpu import reason_names

    return [n for n in reason_names(g.reasons or 0) if n != "idle"]


def latency_distributions(records: list[RequestRecord]) -> bytes:
    ok = [x for x in records if x.ok and x.first_token_time is not None]
    ttft = [(x.first_token_time - x.send_time) * 1e3 for x in ok]
    itl = []
    for x in ok:
        prev = x.first_token_time
        for t, k in zip(x.chunk_times, x.chunk_tokens):
            if t > prev and k > 0:
                itl += [(t - prev) * 1e3 / k] * k
                prev = t
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, vals, name in ((axes[0], ttft, "TTFT"), (axes[1], itl, "ITL")):
        if vals:
            ax.hist(vals, bins=50, color="tab:blue", alpha=0.8)
            for q, ls in ((50, "-"), (99, "--")):
                v = np.percentile(vals, q)
                ax.axvline(v, color="k", ls=ls, label=f"p{q} {v:,.1f} ms")
            ax.legend(fontsize=8)
        ax.set_title(f"{name} ({len(vals):,} values)")
        ax.set_xlabel("ms")
    return _png(fig)


def config_curve(name: str, results: dict[int, LevelResult], floors: dict[int, float], baseline: dict[int, float],
                 ceiling_kv: int | None, cap: int | None) -> bytes:
    lv = sorted(results)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    sus = [results[x].sustained_output_tps for x in lv]
    ci = [results[x].sustained_output_tps_ci95 or 0 for x in lv]
    ax.errorbar(lv, [s or np.nan for s in sus], yerr=ci, marker="o", capsize=3, label="sustained ± 95% CI")
    ax.plot(lv, [results[x].whole_run_output_tps or np.nan for x in lv], "s--", alpha=0.6, label="whole-run")
    ax.plot(lv, [results[x].peak_output_tps or np.nan for x in lv], "^:", alpha=0.5, label="peak (1-s bucket)")
    for x in lv:
        if not results[x].valid:
            ax.annotate("invalid", (x, sus[lv.index(x)] or 0), color="red", fontsize=8)
    if baseline:
        ax.plot(sorted(baseline), [baseline[x] for x in sorted(baseline)], "kx", label="baseline")
    if floors:
        ax.plot(sorted(floors), [floors[x] for x in sorted(floors)], "r_", markersize=18, mew=2, label="floor")
    if ceiling_kv:
        ax.axvline(ceiling_kv, color="tab:purple", ls="--", label=f"KV ceiling {ceiling_kv}")
    if cap and (not ceiling_kv or cap < ceiling_kv):
        ax.axvline(cap, color="tab:brown", ls=":", label=f"admission cap {cap}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lv)
    ax.set_xticklabels([str(x) for x in lv])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{name}: throughput vs concurrency")
    ax.legend(fontsize=8)
    return _png(fig)


def comparison(result) -> bytes:
    """`sglperf compare`'s picture (judge/compare.Comparison): each level's throughput in both runs with its 95%
    interval, and beside it the change with its interval against the ±margin band of no change."""
    rows = result.levels
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(rows) + 3), 7), sharex=True)
    x = np.arange(len(rows))
    for offset, label, pick in ((-0.12, f"A {result.run_a}", lambda c: c.a),
                                (0.12, f"B {result.run_b}", lambda c: c.b)):
        vals = [pick(c).value if pick(c).value is not None else np.nan for c in rows]
        errs = [pick(c).ci95 or 0.0 for c in rows]
        top.errorbar(x + offset, vals, yerr=errs, fmt="o", capsize=3, label=label)
    top.set_ylabel("sustained output tokens / s")
    top.legend(fontsize=8)
    colours = {"SLOWER": "tab:red", "FASTER": "tab:green", "NO CHANGE": "tab:gray", "UNDECIDED": "tab:orange"}
    for i, c in enumerate(rows):
        if c.change is None:
            bottom.annotate(c.verdict.lower(), (i, 0), ha="center", fontsize=8, color="tab:purple")
            continue
        colour = colours.get(c.verdict, "black")
        bottom.errorbar([i], [100 * c.change], yerr=[[100 * (c.change - c.low)], [100 * (c.high - c.change)]],
                        fmt="s", capsize=4, color=colour)
        bottom.annotate(c.verdict.lower(), (i, 100 * c.high), xytext=(0, 4), textcoords="offset points",
                        ha="center", fontsize=8, color=colour)
    bottom.axhspan(-100 * result.margin, 100 * result.margin, color="tab:gray", alpha=0.15,
                   label=f"no change (±{result.margin:.0%})")
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_ylabel("B vs A, % (95% interval)")
    bottom.legend(fontsize=8, loc="lower left")
    bottom.set_xticks(x)
    bottom.set_xticklabels([f"{c.config} {c.level}" for c in rows], rotation=30, ha="right")
    top.set_title(f"sglperf compare: B {result.run_b} against A {result.run_a}")
    return _png(fig)
