"""The simulator's prefix cache, as SGLang's RadixAttention behaves for a client: a prompt's longest prefix that an
earlier prompt shared is served from cache (its `cached_tokens`), and only the rest is prefilled. Token-granular
(SGLang's page size 1), least recently used first out when it holds more tokens than the KV pool. A prompt is
cached when it arrives (SGLang caches it once its prefill ran: a few steps later), and `/flush_cache` empties it."""

from __future__ import annotations

from collections import OrderedDict


class RadixCache:
    def __init__(self, capacity_tokens: int, enabled: bool = True):
        self.capacity, self.enabled = capacity_tokens, enabled
        self._nodes: OrderedDict[int, None] = OrderedDict()  # one per cached prefix, by its running hash
        self.prompt_tokens = self.cached_tokens = 0  # since the last flush: the server's hit rate

    def admit(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` were cached; then `ids` is cached too. At most len(ids) - 1: the last
        prompt token is always computed (it gives the first output token)."""
        if not self.enabled:
            return 0
        hit, h, missed = 0, 0, False
        for tok in ids:
            h = hash((h, tok))
            if not missed and h in self._nodes:
                self._nodes.move_to_end(h)
                hit += 1
                continue
            missed = True
            self._nodes[h] = None
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)
        hit = min(hit, max(0, len(ids) - 1))
        self.prompt_tokens += len(ids)
        self.cached_tokens += hit
        return hit

    def insert(self, ids: list[int]) -> None:
        """A finished request's prompt and output ids cached, as SGLang caches a finished request's tokens: the next
        turn of a conversation, which sends them back with its new message, finds them (no hit is counted here)."""
        if not self.enabled:
            return
        h = 0
        for tok in ids:
            h = hash((h, tok))
            self._nodes[h] = None
            self._nodes.move_to_end(h)
        while len(self._nodes) > self.capacity:
            self._nodes.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def flush(self) -> None:
        self._nodes.clear()
        self.prompt_tokens = self.cached_tokens = 0
