"""Failure categories, defined once: the prefix every failure message starts with, and the Allure category that
matches it. Errors the library raises carry their category, so the pytest layer only translates them.

Why one place: the plugin, the verdicts, the perf tests and the report must agree on the words a reader (and
Allure's category regexes) sees.
"""

from __future__ import annotations

from enum import Enum


class Category(Enum):
    REGRESSION = ("THROUGHPUT REGRESSION", "Throughput regression")
    LATENCY = ("LATENCY REGRESSION", "Latency regression")
    PLATEAU = ("KV PLATEAU VIOLATED", "KV plateau violated")
    PREFIX_CACHE = ("PREFIX CACHE REGRESSION", "Prefix cache regression (shared prompts no longer served from cache)")
    ACCEPTANCE = ("ACCEPTANCE REGRESSION", "Acceptance regression (speculative decoding's draft accepted less)")
    INCONCLUSIVE = ("INCONCLUSIVE", "Inconclusive (re-run; the level needed more time than allowed)")
    INVALID = ("INVALID MEASUREMENT", "Invalid measurement")
    INFRA = ("INFRASTRUCTURE", "Infrastructure (server failed to start or died)")
    USAGE = ("USAGE ERROR", "Usage error")
    DEGENERATE = ("OUTPUT DEGENERATE", "Output degenerate (the server's tokens are garbage: its speed means nothing)")
    CHANGED = ("OUTPUT CHANGED", "Output changed since the baseline")
    WRONG = ("OUTPUT WRONG", "Output wrong (a known answer was missed)")

    @property
    def prefix(self) -> str:
        return self.value[0]

    @property
    def title(self) -> str:
        return self.value[1]

    def message(self, text: str) -> str:
        """`text` with this category's prefix (once)."""
        return text if text.startswith(self.prefix + ":") else f"{self.prefix}: {text}"


# News, not a failure: a level whose whole interval lies above its baseline by more than the tolerance (the baseline
# is stale, or the stack or the workload changed). Shown in the summary, the report and the history; never fails.
FASTER = "FASTER THAN BASELINE"

(REGRESSION, LATENCY, PLATEAU, PREFIX_CACHE, ACCEPTANCE, INCONCLUSIVE, INVALID, INFRA, USAGE, DEGENERATE, CHANGED,
 WRONG) = (c.prefix for c in Category)


class SglperfError(Exception):
    """An error the suite reports in its own words; `category` says which failure category it is."""

    category: Category = Category.INFRA

    def report(self) -> str:
        return self.category.message(str(self))


class UsageError(SglperfError, ValueError):
    """The user asked for something that cannot be done as written (a profile, an option, a baseline file)."""

    category = Category.USAGE


class InfraError(SglperfError, RuntimeError):
    """The machinery failed (a server did not start or died, a lock was not released, a build failed)."""

    category = Category.INFRA


class Unavailable(SglperfError):
    """What this needs is not on this machine (e.g. no GPU): the test skips with the reason, it does not fail."""
