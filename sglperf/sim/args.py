"""The simulator's command line: SGLang 0.5.23's names, types and defaults for the flags the suite passes, plus
simulator-only flags (`--preset`, `--time-scale`, `--slowdown`, `--prefill-slowdown`, `--noise-cv`, `--fault-*`).

Why argparse with allow_abbrev: SGLang's parser is a plain ArgumentParser, so prefixes like `--tp 8` work and an
unknown flag exits 2 with "unrecognized arguments" -- the launcher's error handling is exercised on the same codes.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

from .presets import DEFAULT_PRESET, PRESETS, Preset, auto_max_running_requests

KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
QUANTIZATIONS = ["awq", "fp8", "gptq", "marlin", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
                 "modelopt_fp8", "modelopt_fp4", "modelopt_mixed", "petit_nvfp4", "nvfp4_online", "w8a8_int8",
                 "w8a8_fp8", "moe_wna16", "qoq", "w4afp8", "mxfp4", "compressed-tensors"]
MOE_RUNNER_BACKENDS = ["auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm",
                       "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
                       "flashinfer_megamoe", "cutlass", "aiter", "marlin", "humming"]
SCHEDULE_POLICIES = ["lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn",
                     "shortest-prefill-first"]
DSA_KV_DTYPES = {"auto", "bf16", "bfloat16", "fp8_e4m3"}


def human_readable_int(value: str) -> int:
    """SGLang's size parser: 32k -> 32000, 1Mi -> 1048576."""
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?)\s*", value)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size: {value!r}")
    num, unit, binary = m.groups()
    base = 1024 if binary else 1000
    power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit.lower()]
    return int(float(num) * base**power)


def fraction(value: str) -> float:
    x = float(value)
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return x


def positive(value: str) -> float:
    x = float(value)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return x


def non_negative(value: str) -> float:
    x = float(value)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglperf sim", description="SGLang-compatible simulator (only the GPU engine is "
                                "simulated: real process, sockets and clock).")
    g = p.add_argument_group("SGLang flags (0.5.23 names and meaning)")
    g.add_argument("--model-path", "--model", dest="model_path", default=None)
    g.add_argument("--tokenizer-path", default=None)
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    g.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    g.add_argument("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--max-queued-requests", type=int, default=None)
    g.add_argument("--num-continuous-decode-steps", type=int, default=1)
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--max-total-tokens", type=human_readable_int, default=None)
    g.add_argument("--chunked-prefill-size", type=int, default=None)
    g.add_argument("--max-prefill-tokens", type=human_readable_int, default=16384)
    g.add_argument("--context-length", type=human_readable_int, default=None)
    g.add_argument("--page-size", type=int, default=None)
    g.add_argument("--schedule-policy", choices=SCHEDULE_POLICIES, default="fcfs")
    g.add_argument("--schedule-conservativeness", type=float, default=1.0)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--api-key", default=None)
    g.add_argument("--admin-api-key", default=None)  # guards SGLang's admin endpoints; the simulator has none
    g.add_argument("--ssl-keyfile-password", default=None)  # SGLang's; the simulator serves plain HTTP
    g.add_argument("--enable-metrics", action="store_true")
    g.add_argument("--decode-log-interval", type=int, default=40)
    g.add_argument("--stream-interval", type=int, default=1)
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--log-level", default="info")
    g.add_argument("--log-level-http", default=None)
    g.add_argument("--random-seed", type=int, default=None)
    g.add_argument("--quantization", choices=QUANTIZATIONS, default=None)
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    g.add_argument("--moe-runner-backend", choices=MOE_RUNNER_BACKENDS, default="auto")
    g.add_argument("--attention-backend", default=None)
    g.add_argument("--disable-radix-cache", action="store_true")
    g.add_argument("--disable-cuda-graph", action="store_true")
    g.add_argument("--skip-server-warmup", action="store_true")
    g.add_argument("--watchdog-timeout", type=float, default=300)
    g.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    g.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    g.add_argument("--load-format", default="auto")
    g.add_argument("--enable-dp-attention", action="store_true")
    # speculative decoding (SGLang's EAGLE path with a model's own MTP head, as GLM-5's recipes serve it)
    g.add_argument("--speculative-algorithm", choices=("EAGLE", "EAGLE3", "NEXTN", "NGRAM", "STANDALONE"),
                   default=None)
    g.add_argument("--speculative-num-steps", type=int, default=None)
    g.add_argument("--speculative-eagle-topk", type=int, default=None)
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    _simulator_flags(p.add_argument_group("simulator only"))
    _fault_flags(p.add_argument_group("simulator faults (each plays one way a real server goes wrong)"))
    return p


def _simulator_flags(s) -> None:
    s.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET)
    s.add_argument("--time-scale", type=positive, default=1.0,
                   help="engine runs X times faster than real time: a client measures X times the tok/s and 1/X "
                        "the latencies of the simulated system")
    s.add_argument("--slowdown", type=positive, default=1.0,
                   help="engine throughput factor: 0.85 plays a 15%% regression (every step takes 1/0.85 as long)")
    s.add_argument("--prefill-slowdown", type=non_negative, default=0.0, metavar="F",
                   help="prefill steps take (1 + F) as long, decode steps unchanged: 0.5 plays a prefill kernel "
                        "50%% slower (TTFT grows, throughput barely moves)")
    s.add_argument("--sim-accept-length", type=positive, default=2.5, metavar="L",
                   help="with --speculative-algorithm: the tokens a verify step accepts on average (the draft's "
                        "quality); SGLANG_SIMULATE_ACC_LEN in the environment pins it exactly, as in SGLang")
    s.add_argument("--sim-verify-cost", type=non_negative, default=0.35, metavar="F",
                   help="with --speculative-algorithm: a verify step takes (1 + F) decode steps (the kernels' part)")
    s.add_argument("--noise-cv", type=non_negative, default=0.0,
                   help="coefficient of variation of step times, and of one run-wide factor drawn at start (a GPU's "
                        "state differs from one server start to the next)")
    s.add_argument("--noise-seed", type=int, default=None,
                   help="seeds that noise (default: fresh at every start, as hardware is; --random-seed seeds "
                        "sampling only, as SGLang's does)")


def _fault_flags(s) -> None:
    s.add_argument("--fault-crash-after", type=float, default=None, metavar="SECONDS")
    s.add_argument("--fault-hang-after", type=float, default=None, metavar="SECONDS")
    s.add_argument("--fault-slow-start", type=float, default=0.0, metavar="SECONDS")
    s.add_argument("--fault-startup-fail", action="store_true")
    s.add_argument("--fault-error-rate", type=fraction, default=0.0, metavar="P")
    s.add_argument("--fault-truncate-rate", type=fraction, default=0.0, metavar="P")
    s.add_argument("--fault-degenerate-output", type=int, default=None, metavar="N",
                   help="from the N-th request on (1: all), every output token is id 0, at the same speed: a kernel "
                        "that returns zeros")
    s.add_argument("--fault-plateau-drop", type=fraction, default=0.0, metavar="F",
                   help="past the ceiling, throughput falls with the queue: with as many requests waiting as "
                        "running it is F lower (a plateau that is not one)")
    s.add_argument("--fault-metrics-padding", type=non_negative, default=0.0, metavar="MB",
                   help="/metrics carries about MB megabytes of other, valid series (a large exporter's page)")
    s.add_argument("--fault-ignore-accept-pin", action="store_true",
                   help="speculative decoding ignores SGLANG_SIMULATE_ACC_LEN (a server where the pin does not hold)")
    s.add_argument("--fault-short-rate", type=fraction, default=0.0, metavar="P",
                   help="requests that finish with finish_reason length but fewer tokens than asked")


@dataclass(frozen=True)
class Resolved:
    """What SGLang's resolution pipeline would have made of the flags (shown in /server_info)."""

    args: argparse.Namespace
    preset: Preset
    model_path: str
    served_model_name: str
    max_total_num_tokens: int
    page_size: int
    context_len: int
    chunked_prefill_size: int
    max_running_requests: int
    mem_fraction_static: float
    kv_cache_dtype: str
    random_seed: int
    warnings: tuple[str, ...]

    def server_args(self) -> dict:
        d = dict(vars(self.args))
        d.update(model_path=self.model_path, tokenizer_path=self.args.tokenizer_path or self.model_path,
                 served_model_name=self.served_model_name, page_size=self.page_size,
                 context_length=self.context_len, chunked_prefill_size=self.chunked_prefill_size,
                 mem_fraction_static=self.mem_fraction_static, kv_cache_dtype=self.kv_cache_dtype,
                 random_seed=self.random_seed)
        return d


def resolve(args: argparse.Namespace) -> Resolved:
    """Resolution errors raise (-> traceback, exit 1), as in SGLang's ServerArgs.resolve_once()."""
    import logging
    import random

    getattr(logging, args.log_level.upper())  # SGLang: invalid level -> AttributeError, exit 1
    preset = PRESETS[args.preset]
    warnings = []
    kv_dtype = args.kv_cache_dtype
    if "GlmMoeDsaForCausalLM" in preset.architectures:
        assert kv_dtype in DSA_KV_DTYPES, "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"
        if kv_dtype == "auto":
            kv_dtype = preset.kv_cache_dtype
    if args.dp_size > 1 and args.enable_dp_attention is False and args.dp_size * args.tp_size > 8:
        raise ValueError(f"--dp-size {args.dp_size} x --tp-size {args.tp_size} needs more GPUs than this node has.")
    context_len = args.context_length or preset.context_len
    page_size = args.page_size or preset.page_size
    chunked = args.chunked_prefill_size if args.chunked_prefill_size is not None else preset.chunked_prefill_size
    profiled = preset.kv_pool_tokens(args.mem_fraction_static, None)
    pool = profiled
    if args.max_total_tokens is not None:
        if args.max_total_tokens > profiled:
            warnings.append(f"max_total_tokens={args.max_total_tokens} is larger than the profiled value "
                            f"{profiled}. Use the profiled value instead.")
        else:
            pool = args.max_total_tokens // page_size * page_size
    if pool < page_size:
        raise ValueError(f"Not enough memory for the KV cache: {pool} tokens.")
    auto_rr = auto_max_running_requests(pool, context_len)
    rr = args.max_running_requests if args.max_running_requests is not None else auto_rr
    if rr > pool // 2:
        warnings.append(f"max_running_requests={rr} exceeds token_capacity//2={pool // 2}; capped.")
        rr = pool // 2
    if rr < 1:
        raise ValueError(f"--max-running-requests must be positive, got {rr}")
    if args.num_continuous_decode_steps < 1:
        raise ValueError("--num-continuous-decode-steps must be >= 1")
    seed = args.random_seed if args.random_seed is not None else random.randint(0, 2**30)
    return Resolved(args, preset, args.model_path or preset.model_path,
                    args.served_model_name or args.model_path or preset.model_path, pool, page_size, context_len,
                    chunked, rr, args.mem_fraction_static or preset.default_mem_fraction_static, kv_dtype, seed,
                    tuple(warnings))


ACCEPT_PIN_ENV = "SGLANG_SIMULATE_ACC_LEN"


def read_accept_pin(raw: str | None) -> float | None:
    """SGLANG_SIMULATE_ACC_LEN read as SGLang reads it: a float, the pin off at or below 0 and for nan (which compares
    false), 1 for a value under 1 (a step accepts at least its own token); SGLang refuses to start on anything
    float() does not take, with this message. The simulator and the fingerprint share it, so what the run file says
    was pinned is what the server pinned."""
    if raw is None or not raw.strip():
        return None
    try:
        pin = float(raw)
    except ValueError:
        raise ValueError(f'"{raw}" is not a valid float value') from None
    if math.isnan(pin) or pin <= 0:
        return None
    return max(pin, 1.0)
