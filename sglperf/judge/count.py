"""The server's count: the client's sustained tok/s against the server's own token counter over the same window;
two counts that disagree mean the measurement cannot be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from ..categories import INVALID
from ..records import LevelResult


COUNT_WORDS = "disagree on how many tokens were streamed"


@dataclass(frozen=True)
class CountVerdict:
    """The client's sustained tok/s against the server's own token counter over the same window."""

    outcome: str  # "pass" | "invalid" (the two counts disagree: the measurement cannot be trusted) | "not judged"
    ratio: float | None
    allowed: float
    message: str

    def failure(self, where: str = "") -> str:
        return self.message


def server_agreement(r: LevelResult, *, tolerance: float, cap: int | None) -> tuple[float, str]:
    """How far the client's count may differ from the server's over the window, and why. A counter that moves only
    when requests finish (LevelResult.server_count_at_completion) is compared with the requests that finished in the
    window (measure/metrics.server_ratio): the timing at the edges is all that differs. In files written before
    that, it was compared with the stream and known to one cohort of completions (running x osl tokens) at each
    window edge: 2 x cohort / tokens counted in the window, where larger than `tolerance`. On top of either: the
    scrapes' own timing (a counter read somewhere inside a round trip is known at a window edge to half of it) and
    the client's token times, late by its event loop's lag (docs/measurement.md)."""
    tol, why = tolerance, f"±{tolerance:.0%}"
    if r.server_count_at_completion and r.client_completed_output_tps is None and r.server_output_tps and r.window_s:
        cohort = min(r.concurrency or 1, cap or r.concurrency or 1) * r.osl
        edge = 2 * cohort / (r.server_output_tps * r.window_s)
        if edge > tol:
            tol, why = edge, (f"±{edge:.1%}: the server counts a request's {r.osl} tokens when it finishes, so "
                              f"each window edge is uncertain by up to {cohort} tokens ({r.window_s:.0f} s window)")
    elif r.server_count_at_completion:  # the requests that finished, between two scrapes: their timing is all
        edge = r.client_completed_edge_share or 0.0
        if edge >= 0.0005:
            tol += edge
            why += (f" + {edge:.1%} for the requests that finished within the scrapes' timing (either side may have "
                    f"counted them)")
        return tol, why
    elif not r.server_count_at_completion and r.server_mean_running and r.server_output_tps and r.window_s:
        # a per-token counter still moves a decode step at a time, a step being the batch's tokens: each edge of the
        # window is known to one step (docs/measurement.md, "The count check on a slow server")
        step = 2 * r.server_mean_running / (r.server_output_tps * r.window_s)
        if step >= 0.0005:
            tol += step
            why += (f" + {step:.1%} for one decode step at each edge ({r.server_mean_running:.0f} tokens a step, "
                    f"{r.window_s:.1f} s window)")
    scrapes = r.server_edges_uncertainty_s or 0.0
    lag = 2 * (r.client_lag_p99_ms or 0.0) / 1e3
    timing = (scrapes + lag) / r.window_s if r.window_s else 0.0
    if timing >= 0.0005:
        why += (f" + {timing:.1%} for timing at the window's edges ({scrapes * 1e3:.0f} ms of scrape round trip, "
                f"2 x {lag / 2 * 1e3:.0f} ms of client loop lag p99; {r.window_s:.1f} s window)")
    return tol + timing, why


def check_server_count(r: LevelResult, *, where: str, tolerance: float, cap: int | None) -> CountVerdict:
    if r.server_output_tps is None or r.server_ratio is None:
        return CountVerdict("not judged", None, tolerance, f"{where}: the server exposes no token counter")
    tol, why = server_agreement(r, tolerance=tolerance, cap=cap)
    finished = r.server_count_at_completion and r.client_completed_output_tps is not None
    client = r.client_completed_output_tps if finished else r.sustained_output_tps
    server = r.server_completed_output_tps if finished else r.server_output_tps
    text = (f"{where} {r.name}: client {client:,.1f} tok/s{' in the requests that finished' if finished else ''}, "
            f"server {server:,.1f} over the same {'scrapes' if finished else 'window'}, ratio {r.server_ratio:.4f}, "
            f"allowed {why}")
    if abs(r.server_ratio - 1) <= tol:
        return CountVerdict("pass", r.server_ratio, tol, text)
    return CountVerdict("invalid", r.server_ratio, tol, f"{INVALID}: {text}: the client and the server {COUNT_WORDS}")
