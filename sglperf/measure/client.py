"""Async load generator: closed loop (C workers back to back) and open loop (Poisson rate, optional burstiness and
concurrency cap), streaming SGLang-native /generate or OpenAI /v1/completions, one RequestRecord per request.

Why strict parsing: SGLang delivers errors and aborts inside HTTP-200 streams (facts sheet 2.6, 4.10). Every way a
request can go wrong ends as an error kind on its record; nothing wrong is ever counted as a success.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit

import numpy as np
from orjson import dumps

from .prompts import LengthMix, MultiTurn, Prompt, PromptMaker, SharedPrefix, Tokenizer
from ..records import FULL, OUTPUT_SAMPLE_EVERY, ClientSample, RequestRecord, Shape
from ..categories import UsageError
from ..interrupts import defer
from ..redact import auth_headers
from .stream import StreamClient, StreamError
from .wire import CHAT, NATIVE, Wire, by_name

if TYPE_CHECKING:
    from .trace import Trace


@dataclass(frozen=True)
class Target:
    """Where and how to send: the wire format and connection policy come from the engine adapter."""

    url: str  # base URL, e.g. http://127.0.0.1:30000
    wire: Wire = NATIVE
    api_key: str | None = None
    model: str | None = None  # OpenAI "model" field
    new_connection_per_request: bool = False  # e.g. llama.cpp closes the socket after every stream
    shape: Shape = FULL  # the optional fields the server accepts

    @classmethod
    def for_engine(cls, url: str, engine, *, api: str | None = None, prompt_format: str = "ids", **kw) -> "Target":
        """The target an adapter describes; `api` names another wire where the engine speaks several, and chat
        prompts go to the chat endpoint."""
        wire = CHAT if prompt_format == "chat" else by_name(api or engine.wire)
        return cls(url, wire=wire, new_connection_per_request=engine.new_connection_per_request, shape=engine.shape,
                   **kw)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {self.url!r}")

    def headers(self) -> dict:
        return {"Content-Type": "application/json", **auth_headers(self.api_key)}


@dataclass(frozen=True)
class Workload:
    isl: int
    osl: int
    seed: int = 0
    vocab_low: int = 1000  # random prompt ids are drawn from [vocab_low, vocab_high)
    vocab_high: int = 30000
    ignore_eos: bool = True
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)
    prompt_format: str = "ids"  # "ids" | "text" | "chat" (prompts.FORMATS)
    tokenizer: Tokenizer | None = field(default=None, compare=False, repr=False)
    shared_prefix: SharedPrefix | None = None  # None: every prompt its own
    length_mix: LengthMix | None = None  # None: every request ISL tokens in, OSL out
    multi_turn: MultiTurn | None = None  # None: every request a conversation of its own
    trace: Trace | None = field(default=None, compare=False, repr=False)  # an open loop replays it (measure/trace.py)

    def __post_init__(self) -> None:
        if self.isl < 1 or self.osl < 1:
            raise ValueError(f"isl and osl must be >= 1, got {self.isl}/{self.osl}")
        if not 0 <= self.vocab_low < self.vocab_high:
            raise ValueError(f"bad vocabulary range [{self.vocab_low}, {self.vocab_high})")
        object.__setattr__(self, "_maker", PromptMaker(self.prompt_format, self.isl, seed=self.seed,
                                                       low=self.vocab_low, high=self.vocab_high,
                                                       tokenizer=self.tokenizer, prefix=self.shared_prefix,
                                                       mix=self.length_mix, osl=self.osl))

    def prompt(self, stream: int, index: int) -> Prompt:
        """Seeded, different for every request: prefix caching cannot help, beyond a shared prefix's groups."""
        return self._maker.make(stream, index)

    def user_turn(self, stream: int, index: int, turn: int) -> list[int]:
        """A conversation's new tokens at `turn`: ISL of them at its first, turn_tokens after (seeded ids)."""
        assert self.multi_turn is not None and self.prompt_format == "ids", "conversations are sent as ids"
        n = self.isl if turn == 0 else self.multi_turn.turn_tokens
        ids = self._maker.make(stream, index).ids if turn == 0 else self._maker._own(stream, index, n).ids
        assert ids is not None
        return ids

    @property
    def cache_allowed(self) -> float | None:
        """The share of prompt tokens a prefix cache can serve once each group's prefix is cached (None: none)."""
        p = self.shared_prefix
        return None if p is None else p.tokens / self.isl



class ClientMonitor:
    """A 50 ms ticker: how late the loop wakes it (lag) and this process's CPU time; `worker` names the process
    (0: the only one, or the first of --client-procs)."""

    def __init__(self, clock: Callable[[], float], period: float = 0.05, worker: int = 0):
        self.clock, self.period, self.worker = clock, period, worker
        self.samples: list[ClientSample] = []

    async def run(self, stop: asyncio.Event) -> None:
        expected = self.clock() + self.period
        while not stop.is_set():
            await asyncio.sleep(max(0.0, expected - self.clock()))
            now = self.clock()
            self.samples.append(ClientSample(now, time.process_time(), max(0.0, now - expected), self.worker))
            expected = now + self.period


def run_loop(main):
    """asyncio.run, on uvloop where it is installed (`pip install 'sglperf[fast]'`): the same measurements, a
    seventh less CPU per streamed token (benchmarks/client_vs_bench_serving.py). SGLPERF_EVENT_LOOP=asyncio keeps
    asyncio's own loop (to compare, or to rule uvloop out)."""
    outer = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    main = _cancelled_on_ctrl_c(main, outer)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is None or os.environ.get("SGLPERF_EVENT_LOOP") == "asyncio":
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    uvloop.install()
    return asyncio.run(main)


async def _cancelled_on_ctrl_c(main, outer):
    """`main`, cancelled by the first Ctrl-C (or SIGTERM), after which further ones are noted, not raised, until the
    caller has saved what the cancelled level measured (interrupts.defer). asyncio's own handler raises
    KeyboardInterrupt on the second one, wherever the loop is: a level being saved was lost. Once saved (resume),
    Ctrl-C is `outer`'s, the handler from before the loop: this one's and asyncio's belong to a loop that is closed
    by then."""
    task, loop = asyncio.current_task(), asyncio.get_running_loop()

    def first(signum, frame):
        signal.signal(signal.SIGINT, outer)  # what defer keeps and resume restores
        defer("the partial level")
        loop.call_soon_threadsafe(task.cancel)

    if threading.current_thread() is not threading.main_thread():
        return await main
    previous = signal.signal(signal.SIGINT, first)
    try:
        return await main
    finally:
        if signal.getsignal(signal.SIGINT) is first:  # not interrupted: Ctrl-C is asyncio's again
            signal.signal(signal.SIGINT, previous)


def raise_open_files_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _output_ids(wire, data: bytes) -> tuple[int, ...] | None:
    """The output ids a stream's last event carries (SGLang's /generate: all of them), parsed whole; None where the
    wire's last event has none (an OpenAI stream)."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    ids, _ = wire.answer(obj) if isinstance(obj, dict) else (None, None)
    return ids


class _Progress:
    """Mutable per-request state while the stream is open (the records are immutable)."""

    __slots__ = ("index", "send", "times", "tokens", "server_prompt", "server_completion", "finish", "error",
                 "detail", "status", "prompt_tokens", "max_tokens", "texts", "count_source", "server_ttft",
                 "output_ids", "spec_verify_ct", "spec_accept_length", "cached", "impossible", "turn", "history",
                 "keep_ids", "due")

    def __init__(self, index: int, send: float, prompt_tokens: int, max_tokens: int, keep_text: bool = False):
        self.index, self.send = index, send
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.server_prompt = self.server_completion = None
        self.finish = self.error = self.detail = self.status = None
        self.prompt_tokens, self.max_tokens = prompt_tokens, max_tokens
        self.texts: list[str] | None = [] if keep_text else None  # for re-tokenizing, where the server sends no usage
        self.count_source = "chunks"
        self.server_ttft: float | None = None
        self.output_ids: tuple[int, ...] | None = None
        self.spec_verify_ct: int | None = None
        self.spec_accept_length: float | None = None
        self.cached: int | None = None
        self.impossible: list[str] = []
        self.turn: int | None = None
        self.history: int | None = None
        self.keep_ids = False  # a conversation's reply: its ids are the next turn's history
        self.due: float | None = None  # when a trace meant it sent

    def reconcile(self, n: int, source: str) -> None:
        """Make the chunks add up to `n` output tokens (the server's final usage, or the tokenizer's count of the
        streamed text): the difference goes to the last chunks."""
        diff = n - sum(self.tokens)
        i = len(self.tokens) - 1
        while diff and i >= 0:
            step = diff if diff > 0 else max(diff, -(self.tokens[i] - (1 if i == 0 else 0)))
            self.tokens[i] += step
            diff -= step
            i -= 1
        self.count_source = source

    def fail(self, kind: str, detail: str) -> None:
        if self.error is None:
            self.error, self.detail = kind, detail[:500]

    def record(self, end: float, cancelled: bool = False) -> RequestRecord:
        return RequestRecord(self.index, self.send, end, self.prompt_tokens, self.max_tokens, tuple(self.times),
                             tuple(self.tokens), self.server_prompt, self.server_completion, self.finish,
                             None if cancelled else self.error, self.detail, self.status, cancelled,
                             self.count_source, self.server_ttft, self.output_ids, self.spec_verify_ct,
                             self.spec_accept_length, self.cached, tuple(self.impossible), self.turn,
                             self.history, self.due)


async def stop_or_timeout(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or until `stop` is set. Not asyncio.wait_for: before Python 3.12 it swallows a cancel that
    arrives as the event is set, and a level that stalled sets its load's stop and cancels it at once; the open loop
    then went on to wait out every request's timeout (docs/measurement.md, "Round 5")."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()


async def sent_and_settled(sending, tasks) -> None:
    """Run `sending` (a loop that starts request tasks into `tasks`), then wait for those requests. Cancelled, as a
    level that detected a stall cancels its load, the requests are cancelled too: an open loop's requests are tasks
    of their own, and left running they waited out the request timeout after the stall was known."""
    try:
        await sending
    except BaseException:
        for t in list(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)  # cancelled here, gather cancels them itself


class LoadGenerator:
    # A failed request's worker waits this long before its next one, so a server refusing everything gets at most
    # 2 x concurrency failing requests per second.
    FAIL_BACKOFF_S = 0.5

    def __init__(self, target: Target, workload: Workload, *, stream_id: int = 0, request_timeout: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.target, self.workload, self.stream_id = target, workload, stream_id
        if workload.multi_turn is not None and (workload.prompt_format != "ids" or target.wire.name != "sglang"):
            raise UsageError(f"a multi-turn workload sends each reply back as the ids the server produced: it needs "
                             f"SGLang's native /generate and prompt_format \"ids\" (api {target.wire.name!r}, "
                             f"prompt_format {workload.prompt_format!r})")
        self.request_timeout = request_timeout
        self.clock = clock
        self.records: list[RequestRecord] = []
        self.in_flight: dict[int, _Progress] = {}
        self.last_chunk_time: float | None = None
        self.last_end_time: float | None = None
        self.connection_retries = 0  # reused keep-alive connections the server had closed: retried, never errors
        self._next_index = 0
        self._client: StreamClient | None = None

    # ------------------------------------------------------------------ session
    async def __aenter__(self) -> "LoadGenerator":
        raise_open_files_limit()
        self._client = StreamClient(self.target.url, self.target.headers(),
                                    fresh=self.target.new_connection_per_request, connect_timeout=30.0,
                                    clock=self.clock)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._client is not None:
            self._client.close()

    def snapshot(self, now: float) -> list[RequestRecord]:
        """Finished records plus the in-flight ones as they stand (marked cancelled: not done, not failed)."""
        return self.records + [p.record(now, cancelled=True) for p in list(self.in_flight.values())]

    # ------------------------------------------------------------------ load shapes
    async def closed_loop(self, concurrency: int, stop: asyncio.Event, streams: range | list[int] | None = None
                          ) -> None:
        """`concurrency` streams back to back; this generator drives `streams` of them (all by default, a share
        when the streams are sharded over processes). Stream k sends requests k, k + C, k + 2C, ...: the same
        prompts per stream whichever process drives it."""
        if self.workload.multi_turn is not None:
            await asyncio.gather(*(self._conversations(k, concurrency, stop)
                                   for k in (range(concurrency) if streams is None else streams)))
            return

        async def worker(k: int) -> None:
            j = 0
            while not stop.is_set():
                rec = await self.one_request(k + concurrency * j)
                j += 1
                if rec.error:
                    await stop_or_timeout(stop, self.FAIL_BACKOFF_S)

        await asyncio.gather(*(worker(k) for k in (range(concurrency) if streams is None else streams)))

    async def _conversations(self, k: int, concurrency: int, stop: asyncio.Event) -> None:
        """Virtual user `k`: conversation after conversation, each of `turns` requests sending the whole history
        (prompts and the replies' ids as the server produced them) and new tokens of its own, a think time after each
        reply. A turn that failed, or whose reply came without its ids, ends its conversation (its record says why)."""
        mt = self.workload.multi_turn
        assert mt is not None
        j = 0
        while not stop.is_set():
            history: list[int] = []
            for turn in range(mt.turns):
                index = k + concurrency * (j * mt.turns + turn)
                ids = history + self.workload.user_turn(self.stream_id, index, turn)
                rec = await self.one_request(index, Prompt(ids=ids, tokens=len(ids)), turn=turn, history=len(history))
                if rec.error or rec.output_ids is None or stop.is_set():
                    if rec.error:
                        await self._wait(stop, self.FAIL_BACKOFF_S)
                    break
                history = ids + list(rec.output_ids)
                if mt.think_s > 0:
                    await self._wait(stop, mt.think_s)
            j += 1

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> None:
        await stop_or_timeout(stop, seconds)

    async def open_loop(self, rate: float, stop: asyncio.Event, *, burstiness: float = 1.0,
                        max_concurrency: int | None = None, seed: int = 0) -> None:
        """Poisson arrivals (gamma intervals with shape `burstiness`, as bench_serving), optional cap; a workload
        with a trace replays it instead, at the speed that offers `rate` on average."""
        if self.workload.trace is not None:
            await self.replay(self.workload.trace, rate / self.workload.trace.rate, stop)
            return
        rng = np.random.default_rng([seed, self.stream_id, 1])
        sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        tasks: set[asyncio.Task] = set()

        async def capped() -> None:
            if sem is None:
                await self.one_request()
                return
            async with sem:
                if not stop.is_set():
                    await self.one_request()

        async def send() -> None:
            while not stop.is_set():
                t = asyncio.create_task(capped())
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                await stop_or_timeout(stop, rng.gamma(burstiness, 1.0 / (rate * burstiness)))

        await sent_and_settled(send(), tasks)

    async def replay(self, trace: Trace, speedup: float, stop: asyncio.Event, passes: int | None = None) -> None:
        """The trace's requests on their timestamps / `speedup`, pass after pass until `stop` (or `passes` of them),
        whatever the server's answers (an open loop); each request records when it was due and what of its prompt
        earlier ones sent (its history: what a prefix cache may serve)."""
        w, t0 = self.workload, self.clock()
        tasks: set[asyncio.Task] = set()
        end = None if passes is None else passes * len(trace.requests)

        async def send() -> None:
            k = 0
            while not stop.is_set() and (end is None or k < end):
                at = t0 + trace.due_s(k, speedup)
                if at > self.clock():
                    await stop_or_timeout(stop, at - self.clock())
                if stop.is_set():
                    break
                p = trace.prompt(k, seed=w.seed, low=w.vocab_low, high=w.vocab_high)
                t = asyncio.create_task(self.one_request(k, p, history=trace.allowed[k % len(trace.requests)],
                                                         due=at))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                k += 1

        await sent_and_settled(send(), tasks)

    # ------------------------------------------------------------------ one request
    async def one_request(self, index: int | None = None, prompt: Prompt | None = None, *, turn: int | None = None,
                          history: int | None = None, due: float | None = None) -> RequestRecord:
        if index is None:
            index = self._next_index
            self._next_index += 1
        w, tg = self.workload, self.target
        prompt = prompt if prompt is not None else w.prompt(self.stream_id, index)
        path = urlsplit(tg.url).path.rstrip("/") + tg.wire.path
        body = tg.wire.body(prompt, w, tg.model, tg.shape)
        body.update(w.extra_body)
        payload = dumps(body)
        p = _Progress(index, self.clock(), prompt.tokens, prompt.max_tokens or w.osl, keep_text=w.tokenizer is not None)
        p.turn, p.history, p.keep_ids, p.due = turn, history, turn is not None, due
        self.in_flight[index] = p
        cancelled = False
        try:
            if hasattr(asyncio, "timeout"):  # 3.11+: a deadline on this task, not a new task per request
                async with asyncio.timeout(self.request_timeout):
                    await self._stream(path, payload, p)
            else:
                await asyncio.wait_for(self._stream(path, payload, p), self.request_timeout)
        except asyncio.CancelledError:
            cancelled = True
            raise
        except asyncio.TimeoutError:
            p.fail("timeout", f"no answer within the request timeout ({self.request_timeout:g} s)")
        except StreamError as e:
            p.fail("connection", str(e))
        except ConnectionError as e:
            p.fail("connection", f"{type(e).__name__}: {e}")
        except OSError as e:  # the socket could not be made: out of open files (EMFILE), above all
            if e.errno == errno.EMFILE:
                p.fail("open_files", f"the client process is out of open files ({e}; ulimit -n)")
            else:
                p.fail("connection", f"{type(e).__name__}: {e}")
        finally:
            rec = p.record(self.clock(), cancelled=cancelled)
            del self.in_flight[index]
            self.records.append(rec)
            self.last_end_time = rec.end_time
        return rec

    async def _stream(self, path: str, payload: bytes, p: _Progress) -> None:
        """One streamed request: each SSE event is read where its bytes land (sglperf.stream), so the per-token
        work is the JSON and the wire's few fields."""
        assert self._client is not None, "use LoadGenerator as an async context manager"
        wire, prev, done = self.target.wire, 0, False
        times, tokens = p.times, p.tokens
        sampled, last = p.keep_ids or p.index % OUTPUT_SAMPLE_EVERY == 0, [b""]  # its last event: the output ids

        parse, chunk, fast = wire.parse, wire.chunk, wire.count

        def on_event(data: bytes, now: float) -> None:
            nonlocal prev, done
            if done:
                return
            if sampled and not (len(data) < 10 and data.strip() == b"[DONE]"):
                last[0] = data
            # an ordinary chunk in the middle of a stream is counted without parsing it (Wire.count)
            count = fast(data) if fast is not None else None
            if count is not None:
                p.count_source = "usage"
            elif len(data) < 10 and data.strip() == b"[DONE]":  # before JSON: a failed parse raises, at a cost
                done = True
                return
            else:
                try:
                    obj = parse(data)
                except ValueError:
                    p.fail("bad_chunk", f"not JSON: {data.strip()[:120]!r}")
                    return
                if not isinstance(obj, dict):
                    p.fail("bad_chunk", f"not an object: {data[:120]!r}")
                    return
                if "error" in obj:
                    p.fail("stream_error", f"error inside an HTTP-200 stream: {json.dumps(obj['error'])[:300]}")
                    return
                count = chunk(obj, p, prev)
            if type(count) is not int or count < prev:  # a count read off the server's answer, checked
                p.fail("bad_chunk", f"token count {json.dumps(count)[:40]} after {prev}: not a whole number that "
                                    f"only grows: {data.strip()[:120]!r}")
                done = True
                return
            if count > prev:  # the tokens this chunk added arrived now
                times.append(now)
                tokens.append(count - prev)
                prev = count
                self.last_chunk_time = now

        answer, retried = await self._client.post(path, payload, on_event)
        self.connection_retries += retried
        p.status = answer.status
        if answer.status != 200:
            p.fail("http_status", f"HTTP {answer.status}: {answer.head.decode(errors='replace')[:300].strip()}")
            return
        if answer.content_type != "text/event-stream":
            p.fail("bad_stream", f"HTTP 200 with Content-Type {answer.content_type or '(none)'}, not an SSE stream: "
                                 f"{answer.head[:200].decode(errors='replace')!r}")
            return
        if sampled and p.error is None and p.finish is not None:
            p.output_ids = _output_ids(wire, last[0])
        if p.error is None and p.finish is None:
            p.fail("no_finish", "the stream ended without a finish reason" + ("" if done else " (and no [DONE])"))
        if p.count_source == "chunks":
            tok = self.workload.tokenizer
            if p.server_completion is not None:
                p.reconcile(p.server_completion, "usage")
            elif tok is not None and p.texts is not None:
                p.reconcile(tok.count("".join(p.texts)), "retokenized")
        n = sum(p.tokens)
        if p.error is None and n < p.max_tokens:
            how = ("ignore_eos" if self.target.shape.ignore_eos else "min_tokens" if self.target.shape.min_tokens
                   else "the server accepts neither ignore_eos nor min_tokens, so it may stop early")
            p.fail("short_output", f"{n} tokens generated, {p.max_tokens} asked ({how})")
        elif p.error is None and n > p.max_tokens:
            p.fail("long_output", f"{n} tokens generated, {p.max_tokens} asked: the server went past the length "
                                  f"limit it was sent ({self.target.wire.limit_field}), or its chunks count tokens "
                                  f"it did not generate")
