"""Command-line number types that name their option and say what they take: argparse prints `sglperf X: error:
argument OPTION: ...` and exits 2, before anything is measured. Non-finite values (nan, inf) are refused everywhere."""

from __future__ import annotations

import argparse
import math


def _number(option: str, text: str, kind, what: str):
    try:
        x = kind(text)
    except ValueError:
        x = None
    if x is None or not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{option} takes {what}; got {text!r}")
    return x


def positive(option: str, kind=float, example: str = "1"):
    """A number > 0 (a time, a rate, an SLO bound: zero or less means nothing)."""
    what = f"{'an integer' if kind is int else 'a number'} > 0, e.g. {example}"

    def parse(text: str):
        x = _number(option, text, kind, what)
        if x <= 0:
            raise argparse.ArgumentTypeError(f"{option} takes {what}; got {text!r}")
        return x
    return parse


def non_negative(option: str, kind=float, example: str = "0"):
    what = f"{'an integer' if kind is int else 'a number'} >= 0, e.g. {example}"

    def parse(text: str):
        x = _number(option, text, kind, what)
        if x < 0:
            raise argparse.ArgumentTypeError(f"{option} takes {what}; got {text!r}")
        return x
    return parse


def fraction(option: str, *, upper_closed: bool = False, lower_open: bool = False, example: str = "0.05"):
    """A share: [0, 1) by default; (0, 1] etc. as the option needs."""
    what = f"a fraction in {'(' if lower_open else '['}0, 1{']' if upper_closed else ')'}, e.g. {example}"

    def parse(text: str) -> float:
        x = _number(option, text, float, what)
        if x < 0 or (lower_open and x == 0) or x > 1 or (not upper_closed and x == 1):
            raise argparse.ArgumentTypeError(f"{option} takes {what}; got {text!r}")
        return x
    return parse
