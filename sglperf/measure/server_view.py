"""The server's own view of a level, from its /metrics scrapes (ServerSample): counters differenced over the
steady-state window, gauges averaged over it (busy slots per decode step where the server exports them), and how
sure each edge of the window is. Its numbers sit beside the client's in the LevelResult: a count the two disagree on
is a finding (judge/count.py)."""

from __future__ import annotations

import numpy as np

from ..records import ServerSample

def _interp(samples: list[ServerSample], attr: str, t: float) -> float | None:
    pts = [(s.time, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
    if len(pts) < 2 or not (pts[0][0] <= t <= pts[-1][0]):
        return None
    xs, ys = zip(*pts)
    return float(np.interp(t, xs, ys))


def _edge_uncertainty(samples: list[ServerSample], t: float) -> float:
    """How far in time a counter interpolated at `t` may be off: the larger half round trip of the two scrapes
    around it (each was read somewhere inside its own round trip)."""
    before = [s for s in samples if s.time <= t]
    after = [s for s in samples if s.time >= t]
    near = ([before[-1]] if before else []) + ([after[0]] if after else [])
    return max((s.time_uncertainty_s for s in near), default=0.0)


def _running_per_step(samples: list[ServerSample], s: float, e: float, delta) -> tuple[float, float] | None:
    """Mean running requests over the window, and the largest mean between two successive scrapes inside it, from
    counters of busy slots summed over decode steps (ServerSample.busy_slot_steps_total): what the engine itself
    counted at every step, not what a scrape happened to see."""
    d_steps, d_busy = delta("decode_steps_total"), delta("busy_slot_steps_total")
    if not d_steps or d_busy is None:
        return None
    pts = [x for x in samples if x.decode_steps_total is not None and x.busy_slot_steps_total is not None]
    near = [x for x in pts if s <= x.time <= e]
    edges = [x for x in pts if x.time < s][-1:] + near + [x for x in pts if x.time > e][:1]
    means = [(b.busy_slot_steps_total - a.busy_slot_steps_total) / (b.decode_steps_total - a.decode_steps_total)
             for a, b in zip(edges, edges[1:]) if b.decode_steps_total > a.decode_steps_total]
    mean = d_busy / d_steps
    # the counters are whole numbers carried as floats: rounding drops the float error of their differences
    return round(mean, 6), round(max(means + [mean]), 6)


def counter_delta(samples: list[ServerSample], attr: str, window: tuple[float, float]) -> float | None:
    """How far a counter moved over the window, interpolated at its edges."""
    a, b = (_interp(samples, attr, t) for t in window)
    return None if a is None or b is None else b - a


def drafting(samples: list[ServerSample], window: tuple[float, float]) -> bool:
    """Whether the server drafted (speculative decoding) in the window: it reported an acceptance length there.
    Such a server's per-step counters count what each verify step accepted, also the tokens past a finished
    request's max_tokens that it computed and dropped, so they are no count of the tokens it streamed, and its
    busy slots per step cannot be had from them (docs/measurement.md, "Speculative decoding on a GPU")."""
    return any((x.spec_accept_length or 0) > 0 for x in samples if window[0] <= x.time <= window[1])


def server_counts(samples: list[ServerSample], at_completion: bool) -> list[tuple[float, float]]:
    """(time, the server's output tokens so far) per sample, from the counter a level's count came from
    (server_view's server_count_at_completion): the per-token ones (decode + first tokens), or the one that counts
    a request's tokens when it finishes."""
    pts = [(s.time, s.output_tokens_total if at_completion or s.decode_tokens_total is None
            else s.decode_tokens_total + (s.first_tokens_total or 0)) for s in samples]
    return [(t, v) for t, v in pts if v is not None]


def server_view(samples: list[ServerSample], window: tuple[float, float] | None) -> dict:
    """The server's own output rate over the window (counters interpolated at its edges) and gauge means. The
    per-token counters where the server has them and does not draft, else the one that counts a request's tokens
    when it finishes (server_count_at_completion: the count check allows for the requests in flight at the edges)."""
    out = dict(server_output_tps=None, server_count_at_completion=None, server_mean_running=None,
               server_max_running=None, server_mean_queued=None, server_mean_token_usage=None,
               server_retractions=None, server_edges_uncertainty_s=None, server_samples_in_window=None,
               server_running_source=None)
    if not samples or window is None:
        return out
    s, e = window

    def delta(attr: str) -> float | None:
        return counter_delta(samples, attr, window)

    per_token = not drafting(samples, window)
    d_decode, d_first = (delta("decode_tokens_total"), delta("first_tokens_total")) if per_token else (None, None)
    d_out = delta("output_tokens_total")
    if d_decode is not None and d_first is not None:
        out["server_output_tps"], out["server_count_at_completion"] = (d_decode + d_first) / (e - s), False
    elif d_out is not None:
        out["server_output_tps"], out["server_count_at_completion"] = d_out / (e - s), True
    if out["server_output_tps"] is not None:
        out["server_edges_uncertainty_s"] = _edge_uncertainty(samples, s) + _edge_uncertainty(samples, e)
    inside = [x for x in samples if s <= x.time <= e]
    out["server_samples_in_window"] = len(inside)
    for attr, key in (("running", "server_mean_running"), ("queued", "server_mean_queued"),
                      ("token_usage", "server_mean_token_usage")):
        vals = [getattr(x, attr) for x in inside if getattr(x, attr) is not None]
        out[key] = float(np.mean(vals)) if vals else None
    running = [x.running for x in inside if x.running is not None]
    out["server_max_running"] = float(max(running)) if running else None
    out["server_running_source"] = "snapshots" if running else None
    per_step = _running_per_step(samples, s, e, delta) if per_token else None
    if per_step is not None:
        out["server_mean_running"], out["server_max_running"] = per_step
        out["server_running_source"] = "per decode step"
    out["server_retractions"] = delta("retracted_total")
    engine, behind = delta("sim_engine_s_total"), delta("sim_behind_s_total")
    out["sim_behind_share"] = behind / engine if engine and behind is not None else None
    return out
