"""What checking output during the levels costs the load generator, per output token, beside what the client already
spends per token on the same chunks: one request in OUTPUT_SAMPLE_EVERY keeps its last chunk whole and parses it for
its output ids (measure/client._output_ids), where every chunk is counted by the wire's fast path (Wire.count).

    python benchmarks/output_sampling_cost.py [--osl 128] [--rounds 2000]

Both are timed in one process, interleaved, on SGLang-shaped /generate chunks (cumulative output_ids and text, the
meta_info last); the ratio is what to read, the absolute ns depend on the CPU."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sglperf.measure.client import _output_ids
from sglperf.measure.wire import NATIVE
from sglperf.records import OUTPUT_SAMPLE_EVERY


def chunk(ids: list[int], final: bool) -> bytes:
    meta = {"id": "x" * 32, "finish_reason": {"type": "length", "length": len(ids)} if final else None,
            "prompt_tokens": 128, "completion_tokens": len(ids), "cached_tokens": 0, "dp_rank": None}
    return json.dumps({"text": " ".join(f"w{i}" for i in ids), "output_ids": ids, "meta_info": meta},
                      separators=(",", ":")).encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2000)
    a = ap.parse_args()
    ids = list(range(1000, 1000 + a.osl))
    stream = [chunk(ids[:n], n == a.osl) for n in range(1, a.osl + 1)]
    per_token, sampled = [], []
    for _ in range(a.rounds):
        t0 = time.perf_counter_ns()
        for c in stream[:-1]:
            NATIVE.count(c)
        NATIVE.parse(stream[-1])
        t1 = time.perf_counter_ns()
        _output_ids(NATIVE, stream[-1])
        t2 = time.perf_counter_ns()
        per_token.append((t1 - t0) / a.osl)
        sampled.append((t2 - t1) / a.osl / OUTPUT_SAMPLE_EVERY)
    base, extra = statistics.median(per_token), statistics.median(sampled)
    print(f"osl {a.osl}, one request in {OUTPUT_SAMPLE_EVERY} sampled, {a.rounds} rounds")
    print(f"  counting the chunks (fast path + final parse): {base:8.1f} ns per output token")
    print(f"  output ids of the sampled requests:            {extra:8.1f} ns per output token")
    print(f"  ratio: +{extra / base:.1%} of the chunk-reading work the client already does per token")


if __name__ == "__main__":
    main()
