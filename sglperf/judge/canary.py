"""The output canary's verdict: whether the tokens a config's server gave for a few fixed greedy prompts are
degenerate (OUTPUT DEGENERATE), differ from the baseline's (OUTPUT CHANGED) or miss a known answer (OUTPUT WRONG).

Why its own verdict: a kernel that returns zeros can make a server faster (flashinfer#2577, cutlass#3096); the
throughput verdicts cannot see it, so a run whose canary failed never becomes a baseline or history point.
Pure functions over CanaryOutputs: nothing here knows HTTP or pytest.
"""

from __future__ import annotations

from collections.abc import Sequence

import re
from collections import Counter
from dataclasses import dataclass

from ..categories import Category
from ..records import CanaryOutput


@dataclass(frozen=True)
class CanaryRules:
    """Thresholds from the profile's [canary] (profiles.CanarySection)."""

    max_top_share: float = 0.9  # the most common id's share of one output above this: one token repeated
    min_distinct: int = 2  # fewer distinct ids than this in one output: all one id
    compare_tokens: int = 8  # OUTPUT CHANGED: the first N output ids must equal the baseline's


@dataclass(frozen=True)
class CanaryVerdict:
    outcome: str  # "pass" | "degenerate" | "changed" | "wrong"
    problems: tuple[str, ...]
    lines: tuple[str, ...]  # one per prompt: what came back

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def category(self) -> Category | None:
        return {"degenerate": Category.DEGENERATE, "changed": Category.CHANGED,
                "wrong": Category.WRONG}.get(self.outcome)

    def failure(self, where: str) -> str:
        assert self.category is not None
        return self.category.message(f"{where}: " + "; ".join(self.problems) + "\n" + "\n".join(self.lines))


def quote(ids: tuple | None, n: int = 16, unit: str = "ids") -> str:
    if ids is None:
        return "(no ids)"
    head = " ".join(str(i) for i in ids[:n])
    return f"[{head}{' ...' if len(ids) > n else ''}] ({len(ids)} {unit})"


def degenerate(out: CanaryOutput, rules: CanaryRules, vocab: int | None) -> str | None:
    """Why one output is degenerate, or None: empty, one id repeated, all one id, an id outside the vocabulary."""
    ids = out.output_ids
    if not ids and not (out.text or "").strip():  # nothing came back: degenerate, whatever the wire gives
        return "empty output (no text, no ids)"
    if out.text is not None and not out.text.strip():
        return f"empty text for {quote(ids)}"
    if ids:
        if vocab is not None and any(i < 0 or i >= vocab for i in ids):
            bad = next(i for i in ids if i < 0 or i >= vocab)
            return f"id {bad} outside the vocabulary [0, {vocab}) in {quote(ids)}"
        top, n = Counter(ids).most_common(1)[0]
        if len(set(ids)) < rules.min_distinct:
            return f"all one id ({top}) in {quote(ids)}"
        if n / len(ids) > rules.max_top_share:
            return (f"id {top} is {n} of {len(ids)} ids ({n / len(ids):.0%}, limit {rules.max_top_share:.0%}) in "
                    f"{quote(ids)}")
    elif out.text is not None:  # no ids (an OpenAI server): the same rules on its words
        words = out.text.split()
        word, n = Counter(words).most_common(1)[0]
        if len(words) > 1 and (len(set(words)) < rules.min_distinct or n / len(words) > rules.max_top_share):
            return f"word {word!r} is {n} of {len(words)} words in {out.text[:120]!r}"
    return None


def first_difference(got: Sequence[int | str], want: Sequence[int | str], n: int) -> int | None:
    """The first position among the first n where the two differ, or None where they agree."""
    for i in range(min(n, max(len(got), len(want)))):
        if i >= len(got) or i >= len(want) or got[i] != want[i]:
            return i
    return None


def check_canary(outputs: list[CanaryOutput], rules: CanaryRules, *, vocab: int | None = None,
                 expected: list[list[int | str]] | None = None, expect: list[str | None] | None = None,
                 env_diff: str = "") -> CanaryVerdict:
    """Degenerate first (it needs no baseline), then known answers, then the baseline's outputs."""
    lines = tuple(f"  prompt {i}: {quote(o.output_ids)}" + (f" {o.text[:80]!r}" if o.text is not None else "")
                  for i, o in enumerate(outputs))
    bad = [f"prompt {i}: {why}" for i, o in enumerate(outputs) if (why := degenerate(o, rules, vocab))]
    if bad:
        return CanaryVerdict("degenerate", tuple(bad), lines)
    wrong = [f"prompt {i}: {(o.text or '')[:120]!r} does not match /{rx}/" for i, (o, rx) in
             enumerate(zip(outputs, expect or [])) if rx and not re.search(rx, o.text or "")]
    if wrong:
        return CanaryVerdict("wrong", tuple(wrong), lines)
    changed = []
    for i, (o, want) in enumerate(zip(outputs, expected or [])):
        got = o.output_ids if o.output_ids is not None else tuple((o.text or "").split())
        at = first_difference(tuple(got), tuple(want), rules.compare_tokens)
        if at is not None:
            unit = "id" if o.output_ids is not None else "word"
            changed.append(f"prompt {i}: output differs from the baseline's at {unit} {at} "
                           f"(got {quote(tuple(got), unit=unit + 's')}, baseline {quote(tuple(want), unit=unit + 's')};"
                           f" the first "
                           f"{rules.compare_tokens} must match)")
    if changed:
        if env_diff:
            changed.append(env_diff)  # describe_diff words it: "environment changed since the baseline: ..."
        return CanaryVerdict("changed", tuple(changed), lines)
    return CanaryVerdict("pass", (), lines)


UNDER_LOAD = "output degenerate under load"  # the reason a level's outputs give it (decide/health.start_failure)


# The shortest period a loop is looked for at, and the longest: a healthy model's greedy loops and a broken kernel's
# output both repeat a few ids (42 43 42 43 ... passed the one-id rules).
MAX_PERIOD = 4
# One id repeated over a whole output or its tail, the same id in at least SHARED_MIN sampled outputs and SHARED_SHARE
# of them, is a broken server's signature: a healthy model's one-id loops differ prompt by prompt, and a kernel gone
# wrong writes the same id (zeros) into every output it touches. A cycle of 2-4 ids must be shared by half of them: a
# random-weight MoE may cycle greedily on one pair in a quarter of its outputs, healthy. The outputs these rest on:
# docs/measurement.md, "Round 5".
SHARED_SHARE, SHARED_MIN, SHARED_CYCLE_SHARE = 0.1, 3, 0.5
# An onset: the level's last samples, at least ONSET_MIN of them, all loop on one id that no earlier sample of the
# level looped on: a server that broke partway through (zeros from some request on) is caught though a level samples
# only one request in 8; a model that ends its outputs so loops on it from the start.
ONSET_MIN = 2


def loop(ids: tuple[int, ...], rules: CanaryRules) -> tuple[int, ...] | None:
    """The ids `ids` loop on, or None: one id over `rules.max_top_share` of them (or all of them), or a cycle of 2 to
    MAX_PERIOD ids that repeats at that share of positions."""
    if len(ids) < 2:
        return None
    top, n = Counter(ids).most_common(1)[0]
    if len(set(ids)) < rules.min_distinct or n / len(ids) > rules.max_top_share:
        return (top,)
    for p in range(2, MAX_PERIOD + 1):
        if len(ids) > 2 * p and sum(ids[i] == ids[i - p] for i in range(p, len(ids))) / (len(ids) - p) \
                >= rules.max_top_share:
            return tuple(sorted(set(ids[-p:])))
    return None


def onset_of(each: list) -> tuple[tuple[int, ...], int] | None:
    """(the one id, how many) where the last samples' loops (`each`, one per output in order, None: no loop) are
    ONSET_MIN or more on one id that no earlier sample looped on; None otherwise."""
    last = each[-1] if each else None
    if last is None or len(last) != 1:
        return None
    n = next((i for i, s in enumerate(reversed(each)) if s != last), len(each))
    return (last, n) if n >= ONSET_MIN and last not in each[:-n] else None


def check_under_load(outputs: list[tuple[int, ...]], rules: CanaryRules, length: int,
                     vocab: int | None = None) -> str | None:
    """Why the outputs sampled during a level (whole, in the order they finished) are degenerate, or None:
    - any id outside the vocabulary: no healthy server writes one;
    - their first `length` ids (the canary's output length) judged as a canary output is, in at least two of them
      and half: greedy decoding of random prompts loops now and then on a healthy model (a tiny random-weight Llama
      on real SGLang: 2 of 17 one id repeated, each prompt its own id); a kernel that goes wrong turns most;
    - one id repeated over a whole output or its last `length` ids, the same id in SHARED_MIN of them and
      SHARED_SHARE: a steady minority (one request in three), a late onset (the last requests of a level) or a tail
      gone wrong, each writing the same id, where a healthy model's loops differ prompt by prompt; the same cycle of
      2-4 ids in half of them (a random-weight model may cycle on one pair in a quarter of its outputs, healthy)."""
    if vocab is not None:
        oov = [ids for ids in outputs if any(i < 0 or i >= vocab for i in ids)]
        if oov:
            bad_id = next(i for i in oov[0] if i < 0 or i >= vocab)
            return (f"{UNDER_LOAD}: {len(oov)} of {len(outputs)} sampled outputs hold ids outside the vocabulary "
                    f"[0, {vocab}), e.g. {bad_id} in {quote(tuple(oov[0]))}")
    bad = [why for ids in outputs if (why := degenerate(CanaryOutput(None, None, tuple(ids[:length]), None, 0.0),
                                                         rules, None))]
    if len(bad) >= max(2, 0.5 * len(outputs)):
        return f"{UNDER_LOAD}: {len(bad)} of {len(outputs)} sampled outputs (their first {length} ids), e.g. {bad[0]}"
    each = [loop(tuple(o), rules) or loop(tuple(o[-length:]), rules) for o in outputs]
    loops = Counter(s for s in each if s)
    for ids, n in loops.most_common():
        share = SHARED_SHARE if len(ids) == 1 else SHARED_CYCLE_SHARE
        if n >= max(SHARED_MIN, share * len(outputs)):
            where = [i for i, s in enumerate(each) if s == ids]
            return (f"{UNDER_LOAD}: {n} of {len(outputs)} sampled outputs loop on the same ids "
                    f"{' '.join(map(str, ids))} (over the whole output or its last {length} ids; outputs "
                    f"{', '.join(str(i + 1) for i in where[:8])}{' ...' if len(where) > 8 else ''} in the order they "
                    f"finished): a healthy model's loops differ prompt by prompt")
    onset = onset_of(each)
    if onset:
        return (f"{UNDER_LOAD}: the last {onset[1]} of {len(outputs)} sampled outputs all loop on id {onset[0][0]}, "
                f"which no earlier output of the level did: the server broke partway through the level")
    return None
