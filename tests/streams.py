"""Token arrival streams whose long-run rate is known, for checking an interval's coverage: independent (Poisson),
autocorrelated (a Poisson rate modulated by an AR(1) process), lockstep (closed-loop cohorts stepping with jitter)
and deterministic (the same without jitter). Times in request lifetimes (one lifetime = 1.0)."""

from __future__ import annotations

import math

import numpy as np

RATE = 1024.0  # tokens per lifetime: 32 streams x 32 tokens


def independent(rng: np.random.Generator, length: float) -> tuple[np.ndarray, np.ndarray, float]:
    n = rng.poisson(RATE * (length + 2))
    return np.sort(rng.uniform(0, length + 2, n)), np.ones(n), RATE


def autocorrelated(rng: np.random.Generator, length: float, tau: float = 1.0, sigma: float = 0.05,
                   dt: float = 0.01) -> tuple[np.ndarray, np.ndarray, float]:
    """The rate wanders by `sigma` with correlation time `tau` lifetimes."""
    m = int((length + 2) / dt)
    a = math.exp(-dt / tau)
    shocks = rng.standard_normal(m) * math.sqrt(1 - a * a)
    x = np.empty(m)
    x[0] = rng.standard_normal()
    for i in range(1, m):
        x[i] = a * x[i - 1] + shocks[i]
    counts = rng.poisson(np.clip(RATE * (1 + sigma * x) * dt, 0, None))
    return (np.arange(m) + rng.uniform(0, 1, m)) * dt, counts.astype(float), RATE


def lockstep(rng: np.random.Generator, length: float, jitter: float = 0.02, cohorts: int = 2, streams: int = 32,
             osl: int = 32, prefill: float = 0.072) -> tuple[np.ndarray, np.ndarray, float]:
    """Cohorts of streams prefill together, then decode one token each per step; each cohort at a random phase."""
    step = (1.0 - prefill) / (osl - 1)
    times, tokens = [], []
    for _ in range(cohorts):
        t = -rng.uniform(0, 1.0)
        while t < length + 3:
            for dur in [prefill] + [step] * (osl - 1):
                t += dur * (1 + jitter * rng.standard_normal())
                times.append(t)
                tokens.append(streams // cohorts)
    order = np.argsort(times)
    return np.array(times)[order], np.array(tokens, float)[order], streams * osl / 1.0


def deterministic(rng: np.random.Generator, length: float) -> tuple[np.ndarray, np.ndarray, float]:
    return lockstep(rng, length, jitter=0.0, cohorts=1)


KINDS = {"independent": independent, "autocorrelated": autocorrelated, "lockstep": lockstep,
         "deterministic": deterministic}


def coverage(estimator, kind: str, trials: int, seed: int, lengths: tuple[float, float] = (10.0, 40.0)):
    """(share of windows whose interval covered the true rate, mean half-width / rate). `estimator(times, tokens,
    window)` returns (rate, half or None); a None never covers."""
    rng = np.random.default_rng(seed)
    covered, width = 0, 0.0
    for _ in range(trials):
        length = rng.uniform(*lengths)
        times, tokens, truth = KINDS[kind](rng, length)
        s = 1.0 + rng.uniform(0, 1.0)
        rate, half = estimator(times, tokens, (s, s + length))
        covered += half is not None and abs(rate - truth) <= half
        width += (half or 0.0) / truth
    return covered / trials, width / trials
