"""What a claim comes to, in the words a user reads: pass, skip (not judged, and why) or fail (its category's
words), with the lines a test shows beside it. The pytest layer maps it and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Outcome:
    kind: Literal["pass", "skip", "fail"]
    message: str = ""
    shown: tuple[str, ...] = ()  # what the test prints (and attaches): the verdicts' own lines

    @classmethod
    def passed(cls, shown=()) -> "Outcome":
        return cls("pass", "", tuple(shown))

    @classmethod
    def skip(cls, message: str, shown=()) -> "Outcome":
        return cls("skip", message, tuple(shown))

    @classmethod
    def fail(cls, message: str, shown=()) -> "Outcome":
        return cls("fail", message, tuple(shown))

    def showing(self, lines) -> "Outcome":
        return Outcome(self.kind, self.message, tuple(lines) + self.shown)
