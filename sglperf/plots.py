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

from .metrics import token_arrivals  # noqa: E402
from .records import LevelResult, RequestRecord, ServerSample  # noqa: E402


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
    pts = [(s.time - t0, (s.decode_tokens_total or 0) + (s.first_tokens_total or 0)
            if s.decode_tokens_total is not None else s.output_tokens_total) for s in samples]
    pts = [(t, v) for t, v in pts if v is not None]
    if len(pts) > 2:
        ts, vs = np.array(pts).T
        ax.plot(ts[1:], np.diff(vs) / np.maximum(np.diff(ts), 1e-9), color="tab:orange", alpha=0.8,
                label="server: output tok/s (from counters)")
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
    ax.set_title(f"c{r.concurrency}: throughput over time")
    return _png(fig)


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
