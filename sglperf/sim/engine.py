"""Pure model of SGLang's scheduler and of the GPU's step time, on a simulated clock.

Why pure: the HTTP server drives it in real time, calibration and tests drive it in simulated time, and both see
the same scheduling dynamics: FCFS waiting queue, admission bounded by --max-running-requests and by free KV
pages (with SGLang's new-token-ratio reservation), chunked prefill, decode rounds of
--num-continuous-decode-steps steps, and retraction to the queue when decode runs out of KV pages.
No I/O, no wall clock, no threads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds one forward pass takes, as a function of the batch.

    The MoE term charges each routed expert one weight pass per "tile" of tokens routed to it, so its cost is flat
    until tokens-per-expert fill a tile: MoE efficiency (tokens per second per expert) rises with the batch, which
    is the seed's finding (256 experts, top-8: ~32 tokens per expert at batch 1024, ~64 at 2048).
    """

    decode_fixed_s: float  # per decode step: launches, all-reduce latency, sampling
    decode_per_seq_s: float  # per sequence in a decode batch: attention over its KV, norms
    prefill_fixed_s: float  # per prefill batch
    prefill_per_token_s: float  # per prompt token computed
    moe_expert_s: float  # one routed expert's weight pass over one tile of tokens (per step, all layers)
    moe_tile_tokens: int  # tokens per expert a weight pass handles at no extra cost
    round_fixed_s: float  # per scheduling round (batch formation, CPU side)
    round_per_seq_s: float  # per running sequence per scheduling round
    n_experts: int = 256
    experts_per_token: int = 8
    # per KV token the decode batch's attention reads (every running sequence's context): what makes a long
    # context's decode step slower than a short one's. 0 in the seed's fit (128/128: the context is small beside
    # the fixed cost); the long-context preset sets it
    decode_per_kv_token_s: float = 0.0

    def moe(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        touched = self.n_experts * (1.0 - (1.0 - self.experts_per_token / self.n_experts) ** tokens)
        per_expert = tokens * self.experts_per_token / self.n_experts
        tiles = max(1.0, per_expert / self.moe_tile_tokens)
        return touched * tiles * self.moe_expert_s

    def decode(self, batch: int, kv_tokens: int = 0) -> float:
        return self.decode_fixed_s + self.decode_per_seq_s * batch + self.decode_per_kv_token_s * kv_tokens \
            + self.moe(batch)

    def prefill(self, tokens: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * tokens + self.moe(tokens)

    def round_overhead(self, running: int) -> float:
        return self.round_fixed_s + self.round_per_seq_s * running


@dataclass(frozen=True)
class EngineConfig:
    """Resolved scheduler limits (what SGLang logs in its capacity line) plus the step-time model."""

    max_total_num_tokens: int  # KV pool, a whole number of pages
    page_size: int
    max_running_requests: int
    chunked_prefill_size: int  # -1 disables chunking
    max_prefill_tokens: int
    num_continuous_decode_steps: int
    context_len: int
    step_time: StepTimeModel
    init_new_token_ratio: float = 1.0
    min_new_token_ratio: float = 1.0
    new_token_ratio_decay: float = 0.0
    max_queued_requests: int | None = None
    slowdown: float = 1.0  # throughput factor: 0.85 -> every step takes 1/0.85 as long
    prefill_slowdown: float = 0.0  # prefill steps only take (1 + this) as long: a latency regression at equal decode
    plateau_drop: float = 0.0  # a fault: with a queue as long as the batch, every step takes 1 / (1 - this) as long
    # speculative decoding: a draft of `spec_draft_tokens` tokens verified in one step that costs (1 + verify_cost)
    # decode steps and accepts `accept_length` tokens on average (1 + Binomial(draft, (L - 1) / draft)); pinned,
    # exactly that mean (SGLang's SGLANG_SIMULATE_ACC_LEN). 0 draft tokens: plain decoding.
    spec_draft_tokens: int = 0
    accept_length: float = 1.0
    accept_pinned: bool = False
    verify_cost: float = 0.0
    noise_cv: float = 0.0
    seed: int = 0

    @property
    def num_pages(self) -> int:
        return self.max_total_num_tokens // self.page_size

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.page_size)


WAITING, PREFILLING, RUNNING, FINISHED, ABORTED = "waiting", "prefilling", "running", "finished", "aborted"


@dataclass
class SimRequest:
    rid: str
    input_len: int
    max_new_tokens: int
    arrival: float
    output_len: int = 0
    prefilled: int = 0  # tokens whose KV is computed (prompt, plus earlier output after a retraction)
    pages: int = 0
    state: str = WAITING
    num_retractions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None
    verify_ct: int = 0  # speculative verify steps this request took part in
    accepted: int = 0  # tokens those steps gave it
    cached: int = 0  # leading prompt tokens the prefix cache holds: never prefilled (sim/radix.py)

    @property
    def seq_len(self) -> int:
        return self.input_len + self.output_len

    @property
    def final_kv_tokens(self) -> int:
        """KV a request holds when it finishes: its last sampled token is never fed back."""
        return self.input_len + self.max_new_tokens - 1

    @property
    def prefill_target(self) -> int:
        """Tokens to (re)compute before decoding: after a retraction the output so far is recomputed too."""
        return self.input_len + self.output_len


@dataclass(frozen=True)
class TokenEvent:
    rid: str
    output_len: int
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class StepResult:
    kind: str  # "prefill" | "decode"
    start: float
    duration: float
    batch_size: int
    new_tokens: int  # prompt tokens computed (prefill) or tokens generated (decode)
    events: tuple[TokenEvent, ...]
    retracted: tuple[str, ...] = ()
    new_token_ratio_before: float = 0.0
    new_token_ratio_after: float = 0.0


@dataclass
class EngineStats:
    """Cumulative counters, named after the sglang:* series they feed."""

    prefill_compute_tokens: int = 0
    decode_tokens: int = 0
    first_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    retracted_requests: int = 0
    busy_s: float = 0.0
    decode_steps: int = 0
    prefill_batches: int = 0
    spec_verify: int = 0  # request-steps verified, and the tokens they accepted (sglang:spec_accept_length)
    spec_accepted: int = 0


class QueueFull(Exception):
    """Raised by add_request when --max-queued-requests is reached (SGLang answers 503)."""


@dataclass
class Engine:
    config: EngineConfig
    now: float = 0.0
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)  # PREFILLING and RUNNING, in admission order
    requests: dict = field(default_factory=dict)
    stats: EngineStats = field(default_factory=EngineStats)
    used_pages: int = 0
    new_token_ratio: float = 0.0
    _decode_left: int = 0

    def __post_init__(self) -> None:
        self.new_token_ratio = self.config.init_new_token_ratio
        rng = np.random.default_rng(self.config.seed)
        self._rng = rng
        cv = self.config.noise_cv
        # Run-to-run variation: one factor per engine lifetime (a server start), like a different boost clock.
        self._run_factor = float(np.clip(rng.normal(1.0, cv), 0.5, 1.5)) if cv > 0 else 1.0

    # ---------------------------------------------------------------- requests
    def add_request(self, rid: str, input_len: int, max_new_tokens: int, cached: int = 0) -> SimRequest:
        cfg = self.config
        if input_len < 1:
            raise ValueError("The input is empty.")
        if input_len >= cfg.context_len:
            raise ValueError(
                f"The input ({input_len} tokens) is longer than the model's context length ({cfg.context_len} tokens)."
            )
        if input_len + max_new_tokens > cfg.context_len:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {cfg.context_len} tokens. "
                f"You requested a total of {input_len + max_new_tokens} tokens: {input_len} tokens from the input "
                f"messages and {max_new_tokens} tokens for the completion."
            )
        if cfg.pages(input_len + max_new_tokens - 1) > cfg.num_pages:
            raise ValueError(f"The request needs {input_len + max_new_tokens} KV tokens, more than the pool holds.")
        if cfg.max_queued_requests is not None and len(self.waiting) >= cfg.max_queued_requests:
            raise QueueFull("The request queue is full.")
        req = SimRequest(rid, input_len, max(0, max_new_tokens), self.now, cached=min(cached, input_len - 1))
        self.requests[rid] = req
        if req.max_new_tokens == 0:
            req.state, req.finish_reason, req.finish_time = FINISHED, "length", self.now
            return req
        self.waiting.append(req)
        return req

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is None or req.state in (FINISHED, ABORTED):
            return
        if req.state == WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
            self.used_pages -= req.pages
            req.pages = 0
        req.state = ABORTED
        self.stats.aborted_requests += 1

    def forget(self, rid: str) -> None:
        """Drop a finished request's record (the server calls this once the client got its last chunk)."""
        self.requests.pop(rid, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used_tokens(self) -> int:
        return sum(r.seq_len for r in self.running)

    # ---------------------------------------------------------------- scheduling
    def step(self) -> StepResult | None:
        """Run one forward batch; return what it did, or None when there is nothing to do."""
        if not self.has_work:
            self._decode_left = 0
            return None
        overhead = 0.0
        if self._decode_left <= 0 or not any(r.state == RUNNING for r in self.running):
            overhead = self.config.step_time.round_overhead(len(self.running))
            batch = self._form_prefill_batch()
            if batch:
                return self._prefill(batch, overhead)
            if not any(r.state == RUNNING for r in self.running):
                return None  # only possible if the head of the queue can never fit; add_request prevents it
            self._decode_left = self.config.num_continuous_decode_steps
        self._decode_left -= 1
        return self._decode(overhead)

    def _reserved_pages(self) -> float:
        """Pages promised to running requests for the rest of their output, scaled by new_token_ratio."""
        cfg = self.config
        need = 0
        for r in self.running:
            need += cfg.pages(r.final_kv_tokens) - r.pages
        return need * self.new_token_ratio

    def _form_prefill_batch(self) -> list[tuple[SimRequest, int]]:
        cfg = self.config
        budget = cfg.max_prefill_tokens
        if cfg.chunked_prefill_size > 0:
            budget = min(budget, cfg.chunked_prefill_size)
        batch: list[tuple[SimRequest, int]] = []
        # A request whose prefill was chunked continues first (SGLang keeps it as the chunked request).
        for r in self.running:
            if r.state == PREFILLING:
                n = min(r.prefill_target - r.prefilled, budget)
                batch.append((r, n))
                budget -= n
        free = cfg.num_pages - self.used_pages - self._reserved_pages()
        while self.waiting and budget > 0 and len(self.running) < cfg.max_running_requests:
            r = self.waiting[0]
            total_pages = cfg.pages(r.final_kv_tokens)
            now_pages = cfg.pages(r.prefill_target)
            reserve = now_pages + (total_pages - now_pages) * self.new_token_ratio
            if reserve > free or now_pages > cfg.num_pages - self.used_pages:
                break
            n = min(r.prefill_target - r.cached, budget)
            if n < r.prefill_target - r.cached and cfg.chunked_prefill_size <= 0:
                break
            self.waiting.popleft()
            r.state, r.prefilled = PREFILLING, r.cached
            r.pages = now_pages
            self.used_pages += now_pages
            free -= reserve
            self.running.append(r)
            batch.append((r, n))
            budget -= n
        return batch

    def _noisy(self, seconds: float) -> float:
        cfg = self.config
        seconds = seconds * self._run_factor / cfg.slowdown
        if cfg.plateau_drop and self.running:  # a cost that grows with the queue: no plateau past the ceiling
            seconds /= 1 - cfg.plateau_drop * min(len(self.waiting) / len(self.running), 1.0)
        if cfg.noise_cv > 0:
            seconds *= float(np.clip(self._rng.normal(1.0, cfg.noise_cv), 0.2, 3.0))
        return seconds

    def _prefill(self, batch: list[tuple[SimRequest, int]], overhead: float) -> StepResult:
        tokens = sum(n for _, n in batch)
        start = self.now
        duration = self._noisy(overhead + self.config.step_time.prefill(tokens) * (1 + self.config.prefill_slowdown))
        self.now += duration
        events = []
        for r, n in batch:
            r.prefilled += n
            if r.prefilled < r.prefill_target:
                continue
            r.state = RUNNING
            if r.output_len == 0:
                self.stats.prompt_tokens += r.input_len
                self.stats.first_tokens += 1
                r.first_token_time = self.now
            r.output_len += 1
            events.append(self._token_event(r))
        self.stats.prefill_compute_tokens += tokens
        self.stats.prefill_batches += 1
        self.stats.busy_s += duration
        return StepResult("prefill", start, duration, len(batch), tokens, tuple(events),
                          new_token_ratio_before=self.new_token_ratio, new_token_ratio_after=self.new_token_ratio)

    def _decode(self, overhead: float) -> StepResult:
        cfg = self.config
        ratio_before = self.new_token_ratio
        retracted = self._retract_if_needed()
        decoding = [r for r in self.running if r.state == RUNNING]
        start = self.now
        kv = sum(r.seq_len for r in decoding)
        duration = self._noisy(overhead + cfg.step_time.decode(len(decoding), kv) * (1 + cfg.verify_cost))
        self.now += duration
        events, tokens = [], 0
        for r in decoding:
            need = cfg.pages(r.seq_len)  # this step writes the KV of the last sampled token
            if need > r.pages:
                self.used_pages += need - r.pages
                r.pages = need
            # a verify step accepts what it accepts; the request keeps what its max_tokens leaves room for, and
            # SGLang's per-step counters and acceptance gauge count the whole (docs/measurement.md)
            accepted = self._accepted() if cfg.spec_draft_tokens else 1
            n = min(accepted, r.max_new_tokens - r.output_len)
            r.output_len += n
            tokens += accepted
            if cfg.spec_draft_tokens:
                r.verify_ct += 1
                r.accepted += n
                self.stats.spec_verify += 1
                self.stats.spec_accepted += accepted
            events.append(self._token_event(r))
        self.stats.decode_tokens += tokens
        self.stats.decode_steps += 1
        self.stats.busy_s += duration
        if not retracted:
            self.new_token_ratio = max(cfg.min_new_token_ratio, self.new_token_ratio - cfg.new_token_ratio_decay)
        return StepResult("decode", start, duration, len(decoding), tokens, tuple(events), tuple(retracted),
                          ratio_before, self.new_token_ratio)

    def _accepted(self) -> int:
        """Tokens one verify step gives a request: the pinned mean exactly (its floor or ceiling in the right share),
        else 1 + Binomial(draft, (L - 1) / draft), whose mean is L and whose most is draft + 1."""
        cfg = self.config
        if cfg.accept_pinned:
            low = int(cfg.accept_length)
            return low + int(self._rng.random() < cfg.accept_length - low)
        k = cfg.spec_draft_tokens
        return 1 + int(self._rng.binomial(k, min(1.0, max(0.0, (cfg.accept_length - 1) / k))))

    def _retract_if_needed(self) -> list[str]:
        """Free KV by sending requests back to the queue, as SGLang's retract_decode does (no token is lost)."""
        cfg = self.config
        decoding = [r for r in self.running if r.state == RUNNING]
        need = sum(1 for r in decoding if cfg.pages(r.seq_len) > r.pages)
        free = cfg.num_pages - self.used_pages
        if need <= free:
            return []
        # Victims: fewest output tokens first, then longest prompt (SGLang's sort order).
        victims = sorted(decoding, key=lambda r: (r.output_len, -r.input_len))
        retracted = []
        for r in victims:
            if need <= free or len(decoding) - len(retracted) <= 1:
                break
            if cfg.pages(r.seq_len) > r.pages:
                need -= 1
            free += r.pages
            self.used_pages -= r.pages
            r.pages, r.prefilled, r.state = 0, 0, WAITING
            r.num_retractions += 1
            self.running.remove(r)
            retracted.append(r)
        for r in reversed(retracted):
            self.waiting.appendleft(r)
        self.stats.retracted_requests += len(retracted)
        # Reserve more next time: back to the initial ratio, at least half-way to 1.
        self.new_token_ratio = min(1.0, max(cfg.init_new_token_ratio, (1.0 + self.new_token_ratio) / 2))
        return [r.rid for r in retracted]

    def _token_event(self, r: SimRequest) -> TokenEvent:
        if r.output_len >= r.max_new_tokens:
            r.state, r.finish_reason, r.finish_time = FINISHED, "length", self.now
            self.running.remove(r)
            self.used_pages -= r.pages
            r.pages = 0
            self.stats.finished_requests += 1
            self.stats.generation_tokens += r.output_len
            return TokenEvent(r.rid, r.output_len, True, "length")
        return TokenEvent(r.rid, r.output_len, False, None)

