"""Per chunk, side by side in one run: SGLang native chunks counted without parsing (NativeGenerate.count) against
parsed and read (NativeGenerate.parse + chunk), the path every chunk took before and the last one still takes.

    python benchmarks/native_chunk_count.py [--tokens 32] [--repeat 5]

The chunks are shaped as SGLang 0.5.23 writes them (compact JSON; cumulative text and output_ids; meta_info last,
finish_reason null until the last chunk). The per-chunk CPU is the best of --repeat timings of every ordinary chunk of
one request, over and over; the ratio is what to read, the absolute µs depend on the CPU.
"""

from __future__ import annotations

import argparse
import timeit

import orjson

from sglperf.measure.client import _Progress
from sglperf.measure.wire import NATIVE


def ordinary_chunks(n: int) -> list[bytes]:
    """The SSE payloads of one n-token request, but its last (which both paths parse)."""
    out = []
    for i in range(1, n):
        meta = {"id": "0123456789abcdef0123456789abcdef", "finish_reason": None, "prompt_tokens": 32,
                "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": i,
                "cached_tokens": 0}
        out.append(b" " + orjson.dumps({"text": " w" * i, "output_ids": list(range(1000, 1000 + i)),
                                        "meta_info": meta}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--number", type=int, default=5000)
    a = ap.parse_args()
    chunks = ordinary_chunks(a.tokens)
    p = _Progress(0, 0.0, 32, a.tokens)
    assert [NATIVE.count(c) for c in chunks] == [NATIVE.chunk(NATIVE.parse(c), p, 0) for c in chunks]

    def parsed() -> None:
        for c in chunks:
            NATIVE.chunk(NATIVE.parse(c), p, 0)

    def counted() -> None:
        for c in chunks:
            NATIVE.count(c)

    per = {}
    for name, f in (("parse + chunk", parsed), ("count", counted)):
        per[name] = min(timeit.repeat(f, number=a.number, repeat=a.repeat)) / a.number / len(chunks) * 1e6
        print(f"{name:<14} {per[name]:6.2f} µs per chunk")
    print(f"count / parse + chunk: {per['count'] / per['parse + chunk']:.2f}")


if __name__ == "__main__":
    main()
