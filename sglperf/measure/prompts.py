"""Prompts of exactly ISL tokens in the three formats servers accept: token ids, text and chat (text in one user
message). Text comes from the model's tokenizer, loaded from a local path or cache only (no downloads at run time):
random ids are decoded and re-encoded until the text is exactly ISL tokens, seeded and different per request, as
bench_serving's random dataset does.

Why: many servers (gateways with strict schemas, transformers serve, chat-only endpoints) refuse token-id prompts;
a perf suite must still send them prompts of a known length.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..categories import UsageError

FORMATS = ("ids", "text", "chat")


class TokenizerError(UsageError):
    pass


@dataclass(frozen=True)
class Prompt:
    ids: list[int] | None = None
    text: str | None = None
    tokens: int = 0  # how many tokens the prompt is, by the tokenizer that made it
    max_tokens: int | None = None  # the output this request asks for, where the workload draws it (a length mix)


@dataclass(frozen=True)
class SharedPrefix:
    """A shared-prefix workload (bench_serving's generated-shared-prefix): `groups` system prompts of `tokens` tokens;
    each request takes one group's, chosen from its seeded key, then a question of its own."""

    groups: int
    tokens: int


@dataclass(frozen=True)
class MultiTurn:
    """Conversations (an agent's session): each virtual user sends `turns` requests one after another, each the whole
    history so far (every earlier prompt and reply, the reply as the ids the server produced) and `turn_tokens` new
    tokens of its own, `think_s` seconds after the reply; the first turn is ISL tokens. A prefix cache serves the
    history, and only the history, from cache."""

    turns: int
    turn_tokens: int
    think_s: float = 0.0

    def longest_prompt(self, isl: int, osl: int) -> int:
        return isl + (self.turns - 1) * (osl + self.turn_tokens)


# The longest request a workload may ask for, in tokens: the longest context a served model offers (10M); past it a
# length is a typo, and one prompt of it would not fit the client's memory (1e8 raised MemoryError mid-run).
MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class LengthMix:
    """Input and output lengths drawn per request, log-normal around the workload's ISL and OSL as medians with
    spread `sigma`, clipped to [1, isl_max] and [1, osl_max]: serving traffic is skewed, a few long requests among
    many short ones, and a log-normal is the usual fit of that (and what its two numbers say). Seeded per request."""

    sigma: float
    isl_max: int
    osl_max: int

    def lengths(self, isl: int, osl: int, seed: int, stream: int, index: int) -> tuple[int, int]:
        rng = np.random.default_rng([seed, 0x1E4, stream, index])
        i, o = np.exp(rng.normal(np.log([isl, osl]), self.sigma))
        return int(min(max(round(i), 1), self.isl_max)), int(min(max(round(o), 1), self.osl_max))


class Tokenizer:
    """Hugging Face `tokenizers`, from a tokenizer.json file, a directory holding one, or a model in the local HF
    cache (through transformers, local files only, where it is installed)."""

    def __init__(self, name_or_path: str):
        self.name = name_or_path
        self._encode, self._decode, self.vocab_size = self._load(name_or_path)

    def __reduce__(self):
        """A client process (--client-procs) loads the same tokenizer by its name."""
        return (Tokenizer, (self.name,))

    @staticmethod
    def _load(name: str):
        p = Path(name).expanduser()
        file = p if p.is_file() else p / "tokenizer.json" if p.is_dir() else None
        if file is not None and file.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            try:
                tok = HFTokenizer.from_file(str(file))
            except Exception as e:  # the library raises plain Exceptions for a malformed file
                raise TokenizerError(f"--tokenizer {name}: {file} is not a tokenizer.json ({e})") from None
            return (lambda text: tok.encode(text, add_special_tokens=False).ids,
                    lambda ids: tok.decode(ids, skip_special_tokens=True), tok.get_vocab_size())
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found]
        except ImportError:
            raise TokenizerError(f"--tokenizer {name}: no tokenizer.json at {p}, and transformers is not installed "
                                 f"to look in the Hugging Face cache") from None
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        except Exception as e:
            raise TokenizerError(f"--tokenizer {name}: not found locally (no downloads at run time): {e}") from None
        return (lambda text: tok.encode(text, add_special_tokens=False),
                lambda ids: tok.decode(ids, skip_special_tokens=True), len(tok))

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids) -> str:
        return self._decode([int(i) for i in ids])

    def count(self, text: str) -> int:
        return len(self._encode(text))


def exact_text(tok: Tokenizer, rng: np.random.Generator, isl: int, low: int, high: int, tries: int = 20) -> str:
    """A text that `tok` encodes to exactly `isl` tokens: decode random ids, re-encode, trim or top up, repeat."""
    ids = rng.integers(low, high, isl).tolist()
    for _ in range(tries):
        text = tok.decode(ids)
        enc = tok.encode(text)
        if len(enc) == isl:
            return text
        ids = enc[:isl] if len(enc) > isl else enc + rng.integers(low, high, isl - len(enc)).tolist()
    raise TokenizerError(f"--tokenizer {tok.name}: could not make a prompt of exactly {isl} tokens in {tries} tries "
                         f"(ids {low}..{high}); narrow the vocabulary range to plain words")


class PromptMaker:
    """The prompt of request `index` of stream `stream`: seeded, so the same whatever runs it."""

    def __init__(self, fmt: str, isl: int, *, seed: int, low: int, high: int, tokenizer: Tokenizer | None = None,
                 prefix: SharedPrefix | None = None, mix: LengthMix | None = None, osl: int = 0):
        if fmt not in FORMATS:
            raise UsageError(f"prompt format {fmt!r} is not one of {', '.join(FORMATS)}")
        if fmt != "ids" and tokenizer is None:
            raise UsageError(f"prompt format {fmt!r} needs the model's tokenizer (--tokenizer PATH_OR_NAME) to make "
                             f"prompts of exactly {isl} tokens")
        if tokenizer is not None:
            high = min(high, tokenizer.vocab_size)
        if prefix is not None and not 0 < prefix.tokens < isl:
            raise UsageError(f"a shared prefix of {prefix.tokens} tokens does not fit prompts of {isl}")
        self.fmt, self.isl, self.seed, self.low, self.high, self.tokenizer = fmt, isl, seed, low, high, tokenizer
        self.prefix, self.mix, self.osl = prefix, mix, osl
        self._pool: np.ndarray | None = None  # drawn at the first prompt
        self._prefixes: dict[int, Prompt] = {}

    def __getstate__(self) -> dict:
        """A client process (--client-procs) draws the same pool from the seed, not 8 MB through a pipe."""
        return {**self.__dict__, "_pool": None}

    def make(self, stream: int, index: int) -> Prompt:
        if self.prefix is not None:
            return self._shared(stream, index)
        if self.mix is not None:
            isl, osl = self.mix.lengths(self.isl, self.osl, self.seed, stream, index)
            return replace(self._own(stream, index, isl), max_tokens=osl)
        return self._own(stream, index, self.isl)

    def _shared(self, stream: int, index: int) -> Prompt:
        """One group's prefix, then a question of ISL - prefix tokens of the request's own (text: drawn again until
        the two together are exactly ISL tokens, so a word that merges across the join is never miscounted)."""
        group = _mix(request_key(self.seed, stream, index) ^ 0x9F1) % self.prefix.groups
        head = self._prefixes.get(group) or self._prefixes.setdefault(group, self._group_prefix(group))
        q = self.isl - self.prefix.tokens
        if self.fmt == "ids":
            return Prompt(ids=head.ids + self._own(stream, index, q).ids, tokens=self.isl)
        rng = np.random.default_rng([self.seed, stream, index])
        for _ in range(20):
            text = head.text + exact_text(self.tokenizer, rng, q, self.low, self.high)
            if self.tokenizer.count(text) == self.isl:
                return Prompt(text=text, tokens=self.isl)
        raise TokenizerError(f"--tokenizer {self.tokenizer.name}: a shared prefix and a question did not join into "
                             f"exactly {self.isl} tokens in 20 tries; narrow the vocabulary range to plain words")

    def _group_prefix(self, group: int) -> Prompt:
        rng = np.random.default_rng([self.seed, 0x5EED, group])
        if self.fmt == "ids":
            return Prompt(ids=rng.integers(self.low, self.high, self.prefix.tokens).tolist(), tokens=self.prefix.tokens)
        return Prompt(text=exact_text(self.tokenizer, rng, self.prefix.tokens, self.low, self.high) + " ",
                      tokens=self.prefix.tokens)

    def _own(self, stream: int, index: int, isl: int) -> Prompt:
        if self.fmt == "ids":
            pool = self._pool if self._pool is not None else self._make_pool()
            key = request_key(self.seed, stream, index)
            head = [self.low + _mix(key + k) % (self.high - self.low) for k in range(min(HEAD, isl))]
            at = key % (len(pool) - isl + 1)
            return Prompt(ids=head + pool[at + len(head):at + isl].tolist(), tokens=isl)
        rng = np.random.default_rng([self.seed, stream, index])
        return Prompt(text=exact_text(self.tokenizer, rng, isl, self.low, self.high), tokens=isl)

    POOL = 1 << 20  # ids drawn once per process; a prompt is a window of ISL of them

    def _make_pool(self) -> np.ndarray:
        longest = self.mix.isl_max if self.mix is not None else self.isl
        self._pool = np.random.default_rng([self.seed, 0x1D5]).integers(self.low, self.high,
                                                                        max(self.POOL, 64 * longest))
        return self._pool


_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finaliser on one Python int."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


HEAD = 3  # ids drawn per request at the head of every prompt


def request_key(seed: int, stream: int, index: int) -> int:
    """A 64-bit key per request, a pure function of (seed, stream, index).

    Why a prompt is HEAD ids of its own and then a window of one seeded pool: every id is uniform in the vocabulary
    range, as bench_serving's random-ids are, and two prompts share a prefix (a radix-cache hit) only where their
    three head ids agree; windows alone collide (a birthday problem) and share the whole prompt. Drawing ISL ids per
    request costs the client several times more CPU (docs/measurement.md)."""
    return _mix(_mix(_mix(seed & _M64) ^ (stream & _M64)) ^ (index & _M64))
