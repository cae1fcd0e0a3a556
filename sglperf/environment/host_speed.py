"""The host's CPU speed, measured: fixed pieces of C (zlib) and BLAS work, each timed best of several rounds, before
a server that runs on this host's CPU starts.

Why: a CPU-bound server (llama.cpp or SGLang on the CPU) is as fast as the host it runs on, and the CPU's model name
does not say how fast that is: VMs of one CPU class read the same SGLang levels 10-30% apart. A floor taken on one of
them and judged on another would blame the server for the host. The
baseline keeps the speed its runs measured (store/baselines.HostSpeed); a host outside that band is a machine the
baseline never measured, and its floors are not judged there (said in words, never passed or failed).
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

ROUNDS = 8  # best of: a neighbour's burst costs a round or two, a slower CPU costs them all
_PAUSE_S = 0.02  # between rounds: a slow spell of the VM's core (a few hundred ms) then spans fewer of them
_LOOP = 400_000  # interpreter iterations per round (~20 ms on a 2020s x86 core)
_N, _PRODUCTS = 192, 40  # float64 GEMM per round (~5-10 ms with the host's BLAS threads)
_ZLIB_BYTES = 1_000_000  # zlib level 6 per round (~20-25 ms)


@dataclass(frozen=True)
class HostSpeedProbe:
    python_mops: float  # million interpreter loop iterations per second, best round (recorded, not scored)
    blas_gflops: float  # float64 GEMM GFLOP/s with the BLAS library's own threads, best round
    zlib_mbps: float  # zlib level-6 compression MB/s (one thread of C), best round
    rounds: int = ROUNDS

    @property
    def score(self) -> float:
        """One number for the host: the geometric mean of the two C rates (a ratio of scores is the geometric mean
        of their ratios). The interpreter's rate stays out: it is a property of the process as much as of the host
        (one process in 8 read it 30% low in all its rounds, whatever the pauses; without it the score's SD halves)."""
        return math.sqrt(self.blas_gflops * self.zlib_mbps)

    def as_dict(self) -> dict:
        return {"score": round(self.score, 4), "python_mops": round(self.python_mops, 4),
                "blas_gflops": round(self.blas_gflops, 4), "zlib_mbps": round(self.zlib_mbps, 4),
                "rounds": self.rounds}


def _best_seconds(work, rounds: int) -> float:
    work()  # a cold interpreter, cache or BLAS thread pool is not the host's speed
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        work()
        out.append(time.perf_counter() - t0)
        time.sleep(_PAUSE_S)
    return min(out)


def _loop() -> int:
    acc = 0
    for i in range(_LOOP):
        acc += i * i % 7
    return acc


def probe(rounds: int = ROUNDS) -> HostSpeedProbe:
    """About 0.8 s on an idle host. zlib, then the interpreter, then BLAS last: BLAS threads spin a while after a
    product, and where two vCPUs are one physical core's hyperthreads that spinning slows what runs beside it by
    20-30%."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 64, _ZLIB_BYTES, dtype=np.uint8).tobytes()
    a, b = rng.standard_normal((_N, _N)), rng.standard_normal((_N, _N))

    def gemm():
        for _ in range(_PRODUCTS):
            a @ b

    zlib_s = _best_seconds(lambda: zlib.compress(data, 6), rounds)
    loop_s = _best_seconds(_loop, rounds)
    gemm_s = _best_seconds(gemm, rounds)
    return HostSpeedProbe(python_mops=_LOOP / loop_s / 1e6, blas_gflops=2 * _N**3 * _PRODUCTS / gemm_s / 1e9,
                          zlib_mbps=_ZLIB_BYTES / zlib_s / 1e6, rounds=rounds)


# A host is outside a baseline's band when its score differs from the calibration runs' by more than
# max(MIN_BAND, Z x their spread x sqrt(1 + 1/runs)). Z = 3: a healthy rerun of a calibration host is called another
# machine about 0.3% of the time. The spread is the runs' SD moderated by a prior (PRIOR_SD with PRIOR_DF degrees of
# freedom), because two or three runs say little of it: an idle VM's probes move 2.6-3.1% within minutes and their
# means 5% within ten, so 4%; without the prior, two runs whose probes happened to agree made a band too narrow for
# the next run on the same VM. MIN_BAND: half the CPU profiles' smallest floor tolerance (10%).
Z = 3.0
MIN_BAND = 0.05
PRIOR_SD, PRIOR_DF = 0.04, 4.0


def summarize(scores: list[float]) -> tuple[float, float | None]:
    """(geometric mean, SD of the log scores), the SD None for fewer than two runs."""
    logs = [math.log(s) for s in scores]
    m = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1)) if len(logs) > 1 else None
    return math.exp(m), sd


def band(cv: float | None, runs: int) -> float:
    """The half-width of the band, relative, around a baseline's probe from `runs` runs of spread `cv`."""
    df = max(runs - 1, 0) if cv is not None else 0
    sd = math.sqrt((PRIOR_DF * PRIOR_SD ** 2 + df * (cv or 0.0) ** 2) / (PRIOR_DF + df))
    return max(MIN_BAND, Z * sd * math.sqrt(1 + 1 / runs))


@dataclass(frozen=True)
class SlowerHost:
    """A host whose CPU probed slower than on the runs a baseline was taken on, past that baseline's band."""

    now: float  # this run's probe (the geometric mean of the probes before its levels so far)
    then: float  # the baseline's
    band: float  # the baseline's band, relative
    follows: float = 1.0  # the profile's host_cpu_share: how much of the CPU's deficit its throughput can follow

    @property
    def deficit(self) -> float:
        """How much slower, as a share of the baseline's speed (0.2: a fifth)."""
        return 1 - self.now / self.then

    @property
    def share(self) -> float:
        """How much of the server's throughput the slower CPU may explain: its deficit, times the share of it a
        server of this profile follows (all of it unless the profile says less)."""
        return self.deficit * self.follows

    def words(self) -> str:
        part = "" if self.follows >= 1 else (f" (this profile's server follows at most {self.follows:.0%} of its "
                                             f"CPU's deficit: [measurement] host_cpu_share)")
        return (f"this host's CPU probed {self.deficit:.0%} slower than on the runs the baseline was taken on (speed "
                f"probe {self.now:.3g} against {self.then:.3g}, a host within ±{self.band:.0%} counts as the same): "
                f"the server schedules, tokenizes and serves HTTP on it, so up to {self.share:.0%} of its throughput "
                f"may be the host's{part}")


def slower(score: float, then: float, cv: float | None, runs: int, follows: float = 1.0) -> SlowerHost | None:
    """The host of `score`, where it probed slower than the baseline's `then` (from `runs` runs of spread `cv`) by
    more than the band; None where it is inside the band or faster. `follows`: the profile's host_cpu_share."""
    b = band(cv, runs)
    return SlowerHost(score, then, b, follows) if math.log(score / then) < -math.log1p(b) else None


def outside(score: float, then: float, cv: float | None, runs: int, probes: int = 1) -> str | None:
    """Why a host of `score` (the mean of `probes` probes) is not one the baseline measured (then ± its band), or
    None where it is."""
    b = band(cv, runs)
    ratio = score / then
    if abs(math.log(ratio)) <= math.log1p(b):
        return None
    how = f"{1 - ratio:.0%} slower" if ratio < 1 else f"{ratio - 1:.0%} faster"
    spread = f" ± {cv:.1%} over {runs} runs" if cv is not None else f" from {runs} run"
    return (f"this host's CPU is {how} than on the runs the baseline was taken on (speed probe {score:.3g}"
            f"{f' (mean of {probes} this run)' if probes > 1 else ''} against "
            f"{then:.3g}{spread}; a host within ±{b:.0%} counts as the same machine): a server on this CPU is only "
            f"as fast as the CPU, so a floor or ceiling taken there says nothing about the server here. Calibrate a "
            f"baseline on this host (`sglperf baseline calibrate RUN_FILES...`), or run where it was taken")
