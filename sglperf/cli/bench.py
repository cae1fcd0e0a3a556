"""`sglperf bench`: an ad-hoc sweep of a running server: live progress per level, a table, a run document
(`--json`: the suite's typed RunDoc, kind "bench") and per-request records.

Why a separate command: engineers tune by hand between suite runs; it runs each level through the suite's own code
(connect, run_level), so the same level sends the same prompts and gets the same maths.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .. import engines
from ..categories import SglperfError, UsageError
from ..fileio import check_writable, write_jsonl
from ..interrupts import interrupt_on_sigterm, resume
from ..measure.client import Workload
from ..measure.level import LevelSpec, parse_levels, run_level
from ..measure.metrics import MeasurementPolicy
from ..measure.negotiate import connect
from ..measure.prompts import FORMATS, MAX_TOKENS, LengthMix, SharedPrefix, Tokenizer
from ..measure.shards import parse_client_procs, resolve_client_procs
from ..store.recorder import RunRecorder, ServerDoc
from ..records import LevelResult
from ..redact import api_key_from_env, register, url_secrets
from ..argtypes import fraction, positive
from ..run.profiles import MeasurementSection
from ..environment.host import open_files_problem

CONFIG = "bench"  # the run document's one config
# bench's measurement flags -> the profile's [measurement] keys they are (run/profiles.MeasurementSection)
KNOBS = {"--ci-target": "ci_target", "--max-seconds": "level_max_seconds", "--min-seconds": "level_min_seconds",
         "--stall-timeout": "stall_timeout_s", "--request-timeout": "request_timeout_s"}


def int_list(text: str) -> list[int]:
    try:
        return list(parse_levels(text))
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--levels ")) from None


def vocab_range(text: str) -> tuple[int, int]:
    parts = [x.strip() for x in text.split(",")]
    try:
        low, high = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (two integers, e.g. 1000,30000), got {text!r}") from None
    if not 0 <= low < high:
        raise argparse.ArgumentTypeError(f"expected 0 <= LOW < HIGH, got {text!r}")
    return low, high


def shared_prefix(text: str) -> SharedPrefix:
    parts = [x.strip() for x in text.split(",")]
    try:
        groups, tokens = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GROUPS,TOKENS (two integers, e.g. 8,96), got {text!r}") from None
    if groups < 1 or tokens < 1:
        raise argparse.ArgumentTypeError(f"expected GROUPS >= 1 and TOKENS >= 1, got {text!r}")
    return SharedPrefix(groups, tokens)


def length_mix(text: str) -> LengthMix:
    parts = [x.strip() for x in text.split(",")]
    try:
        sigma, isl_max, osl_max = float(parts[0]), *(int(x) for x in parts[1:])
    except (ValueError, IndexError, TypeError):
        raise argparse.ArgumentTypeError(f"expected SIGMA,ISL_MAX,OSL_MAX (e.g. 0.6,1024,512), got {text!r}") from None
    if not 0 < sigma <= 3 or not 1 <= isl_max <= MAX_TOKENS or not 1 <= osl_max <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"expected 0 < SIGMA <= 3 and maxima from 1 to {MAX_TOKENS:,} tokens (the "
                                         f"longest context a served model offers), got {text!r}")
    return LengthMix(sigma, isl_max, osl_max)


def float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(not math.isfinite(v) or v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"rates must be finite numbers of requests per second > 0, got {text!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="base URL of a running server, e.g. http://127.0.0.1:30000")
    p.add_argument("--engine", choices=list(engines.NAMES), default=None,
                   help="the server's engine (default: detected by probing /server_info, /props, else OpenAI)")
    p.add_argument("--api", choices=["sglang", "openai"], default=None,
                   help="wire format (default: the engine's own; SGLang also speaks openai)")
    p.add_argument("--prompt-format", choices=list(FORMATS), default="ids",
                   help="token ids (default), text, or chat (/v1/chat/completions, one user message); text and chat "
                        "need --tokenizer")
    p.add_argument("--tokenizer", default=None, help="the model's tokenizer: a tokenizer.json, a directory with one, "
                   "or a model in the local Hugging Face cache (no downloads)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--levels", type=int_list, default=None, help="closed-loop concurrencies, e.g. 8,16,32")
    g.add_argument("--rates", type=float_list, default=None, help="open-loop request rates (req/s)")
    p.add_argument("--max-concurrency", type=positive("--max-concurrency", int, "64"), default=None,
                   help="concurrency cap for --rates")
    p.add_argument("--burstiness", type=positive("--burstiness"), default=1.0)
    p.add_argument("--isl", type=positive("--isl", int, "128"), default=128)
    p.add_argument("--osl", type=positive("--osl", int, "128"), default=128)
    p.add_argument("--vocab-range", type=vocab_range, default=None, help="prompt ids are drawn from [LOW,HIGH) "
                   "(default: from the served model's vocabulary V, [min(1000, V/4), V); else from --tokenizer's)")
    p.add_argument("--shared-prefix", type=shared_prefix, default=None, metavar="GROUPS,TOKENS",
                   help="a shared-prefix workload: each prompt is one of GROUPS system prompts of TOKENS tokens, then "
                        "a question of its own (ISL - TOKENS); the table shows the share served from the prefix cache")
    p.add_argument("--length-mix", type=length_mix, default=None, metavar="SIGMA,ISL_MAX,OSL_MAX",
                   help="each request's lengths drawn log-normal around --isl and --osl as medians, clipped at the "
                        "maxima")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="OpenAI 'model' field (default: the server's first model)")
    for flag, key in KNOBS.items():  # the profile's own fields: one default, one range, one help
        field = MeasurementSection.model_fields[key]
        p.add_argument(flag, type=MeasurementSection.argtype(key, flag), default=field.default,
                       help=f"{field.description} (default {field.default:g}; a profile's [measurement] {key})"
                       .replace("%", "%%"))
    p.add_argument("--ratio", type=fraction("--ratio", lower_open=True, upper_closed=True, example="0.9"),
                   default=0.9, help="steady-state in-flight ratio (0.9)")
    p.add_argument("--client-procs", default="1", help="client processes a closed-loop level's streams are sharded "
                   "over: a count, or auto (from the previous level's rate and the free cores)")
    p.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache between levels")
    p.add_argument("--slo-ttft-ms", type=positive("--slo-ttft-ms", example="500"), default=None,
                   help="goodput: a request meets the SLO when its TTFT is at most this (and its TPOT at most "
                        "--slo-tpot-ms, where given)")
    p.add_argument("--slo-tpot-ms", type=positive("--slo-tpot-ms", example="50"), default=None,
                   help="goodput: TPOT bound of the SLO (ms)")
    p.add_argument("--json", dest="json_path", default=None, help="write the run as JSON")
    p.add_argument("--records", default=None, help="write per-request records as JSONL (.gz to compress)")


def _progress(info: dict) -> None:
    ci = info["ci"]
    sus = info["sustained"]
    sus_s = f"sustained {sus:,.0f} ± {ci:,.0f}" if sus and ci else "sustained …"
    line = (f"[{info['level']}] {info['elapsed']:6.1f} s  done {info['done']:>6}  in flight {info['in_flight']:>5}  "
            f"{info['tps']:>9,.0f} tok/s  {sus_s}  errors {info['errors']}")
    if sys.stderr.isatty():
        print("\r" + line, end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def fmt(x, spec=",.0f") -> str:
    return "-" if x is None else format(x, spec)


def table(results: list[LevelResult]) -> str:
    slo = any(r.slo_met_share is not None for r in results)
    cache = any(r.prefix_cache_allowed is not None for r in results)
    rates = any(r.offered_rps is not None for r in results)
    head = (f"{'level':>7} {'sustained out tok/s':>21} {'total':>8} {'whole-run':>9} {'peak':>7} "
            f"{'TTFT p50/p99 ms':>17} "
            f"{'TPOT p50':>8} {'E2E p50 s':>9} {'conc':>6} {'server':>7} {'running':>7}"
            f"{' goodput tok/s (met)' if slo else ''}{' cache/allowed' if cache else ''}"
            f"{' req/s done/offered' if rates else ''}  valid")
    rows = [head, "-" * len(head)]
    for r in results:
        lvl = r.name
        sus = f"{fmt(r.sustained_output_tps)} ± {fmt(r.sustained_output_tps_ci95, ',.1f')}"
        ttft = f"{fmt(r.ttft_ms.median)}/{fmt(r.ttft_ms.p99)}"
        e2e = fmt(r.e2e_ms.median / 1e3 if r.e2e_ms.median else None, ".2f")
        ratio = fmt(r.server_ratio, ".3f")
        rows.append(f"{lvl:>7} {sus:>21} {fmt(r.sustained_total_tps):>8} {fmt(r.whole_run_output_tps):>9} "
                    f"{fmt(r.peak_output_tps):>7} {ttft:>17} {fmt(r.tpot_ms.median, '.1f'):>8} {e2e:>9} "
                    f"{fmt(r.achieved_concurrency, '.1f'):>6} {ratio:>7} {fmt(r.server_mean_running, '.0f'):>7}"
                    + (f" {fmt(r.goodput_tps)} ({fmt(r.slo_met_share and r.slo_met_share * 100, '.0f')}%)".rjust(20)
                       if slo else "")
                    + (f" {fmt(r.prefix_cache_share, '.3f')}/{fmt(r.prefix_cache_allowed, '.3f')}".rjust(14)
                       if cache else "")
                    + (f" {fmt(r.achieved_rps, '.2f')}/{fmt(r.offered_rps, 'g')}".rjust(20) if rates else "")
                    + f"  {'yes' if r.valid else 'NO: ' + '; '.join(r.invalid_reasons)}")
    rows.append("sustained = steady-state window, ±95% CI (batch means); whole-run and peak as bench_serving defines "
                "them (reported, never gated); server = client sustained / server's own count over the window"
                + ("; goodput = output tok/s of requests sent in the window that met the SLO (met: their share)"
                   if slo else "")
                + ("; cache = share of the window's prompt tokens the server served from its prefix cache, allowed "
                   "= the shared prefix's share" if cache else "")
                + ("; req/s done/offered = requests completed per second in the window against the rate offered"
                   if rates else ""))
    rows += [f"r{r.rate:g}: {r.saturation}" for r in results if r.saturation]
    return "\n".join(rows)


def vocabulary(given: tuple[int, int] | None, served: int | None, tokenizer: Tokenizer | None,
               url: str) -> tuple[int, int]:
    """Prompt ids the served model has: --vocab-range if given (and inside the model's vocabulary, where it is
    known), else [min(1000, V/4), V) of the vocabulary the server says (or the tokenizer's, where it does not)."""
    size = served or (tokenizer.vocab_size if tokenizer is not None else None)
    if given is not None:
        if served is not None and given[1] > served:
            raise UsageError(f"--vocab-range {given[0]},{given[1]}: the served model's vocabulary has {served} "
                             f"tokens; give HIGH <= {served}")
        return given
    if size is None:
        raise UsageError(f"{url} does not say its model's vocabulary size: give --vocab-range LOW,HIGH (prompt ids "
                         f"the model has) or --tokenizer PATH")
    return min(1000, size // 4), size


def run(args: argparse.Namespace, rec: RunRecorder, ctx: dict) -> None:
    """Measure every level into the run document (so an interrupt keeps the finished ones)."""
    key = api_key_from_env()
    register(*url_secrets(args.url))  # http://user:PASSWORD@host: never written
    url = engines.check_url(args.url, "--url")
    engine = engines.get(args.engine) if args.engine else engines.detect(url, key)
    ctx["engine"] = engine.describe() | {"detected": args.engine is None}
    engine.reach(url, key)
    info = engine.server_info(url, key)
    tokenizer = Tokenizer(args.tokenizer) if args.tokenizer else None
    lo, hi = vocabulary(args.vocab_range, engine.vocab_size(url, key, info), tokenizer, url)
    if args.shared_prefix is not None and args.shared_prefix.tokens >= args.isl:
        raise UsageError(f"--shared-prefix {args.shared_prefix.groups},{args.shared_prefix.tokens}: the prefix must be "
                         f"shorter than --isl {args.isl} (each prompt ends in a question of its own)")
    mix = args.length_mix
    if mix is not None and (mix.isl_max < args.isl or mix.osl_max < args.osl or args.shared_prefix is not None):
        raise UsageError(f"--length-mix {mix.sigma:g},{mix.isl_max},{mix.osl_max}: the maxima must be at least --isl "
                         f"{args.isl} and --osl {args.osl}, and a length mix does not combine with --shared-prefix")
    workload = Workload(args.isl, args.osl, seed=args.seed, vocab_low=lo, vocab_high=hi,
                        prompt_format=args.prompt_format, tokenizer=tokenizer, shared_prefix=args.shared_prefix,
                        length_mix=mix)
    conn = connect(url, engine, workload, api=args.api, prompt_format=args.prompt_format, api_key=key,
                   model=args.model, info=info)
    for n in conn.negotiated:
        print(f"sglperf bench: {n}", file=sys.stderr)
    ctx["engine"] = conn.describe(engine) | {"detected": args.engine is None, "vocab_range": [lo, hi]}
    rec.set_server(CONFIG, ServerDoc(url=url, argv=[], server_info=info, engine=ctx["engine"]))
    policy = MeasurementPolicy(ci_target=args.ci_target, steady_state_ratio=args.ratio,
                               slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    setting, previous = parse_client_procs(args.client_procs), None
    for spec in specs(args):
        procs = resolve_client_procs(setting, spec.concurrency, previous) if spec.concurrency else 1
        m = run_level(conn.target, conn.workload, spec, policy, engine=engine, progress=_progress, client_procs=procs,
                      flush=not args.no_flush)
        if sys.stderr.isatty():
            print(file=sys.stderr)
        if m.stop_reason == "interrupted":
            ctx["interrupted_level"] = spec.label
            return
        previous = m.result
        rec.add_level(CONFIG, spec.concurrency if spec.concurrency is not None else spec.label, m.result, m.records,
                      m.server_samples, m.stop_reason, m.scrape_source, m.extra.get("epoch_ms"))
        ctx.setdefault("measurements", []).append(m)


def specs(args: argparse.Namespace) -> list[LevelSpec]:
    common = dict(max_seconds=args.max_seconds, min_seconds=args.min_seconds, stall_timeout_s=args.stall_timeout,
                  request_timeout_s=args.request_timeout)
    if args.rates:
        return [LevelSpec(rate=r, max_concurrency=args.max_concurrency, burstiness=args.burstiness, **common)
                for r in args.rates]
    return [LevelSpec(concurrency=c, **common) for c in (args.levels or [8, 16, 32])]


def check_outputs(args: argparse.Namespace) -> None:
    """--json and --records must be writable before a level is measured, not after."""
    for option, value in (("--json", args.json_path), ("--records", args.records)):
        if value:
            d = Path(value).resolve().parent
            if not d.is_dir():
                raise UsageError(f"{option} {value}: the directory {d} does not exist")
            check_writable(d, f"{option} {value}: the directory", option)


def check_open_files(args: argparse.Namespace) -> None:
    """Every level's streams fit the process's open-file limit, before the first level."""
    setting = parse_client_procs(args.client_procs)
    procs = setting if isinstance(setting, int) else 1  # auto may choose one
    for spec in specs(args):
        streams = spec.concurrency or spec.max_concurrency
        why = open_files_problem(streams, procs, f"--levels {streams}" if spec.concurrency else
                                 f"--max-concurrency {streams}") if streams else None
        if why:
            raise UsageError(why)


def main(args: argparse.Namespace) -> int:
    ctx: dict = {}
    interrupted = False
    interrupt_on_sigterm()  # Ctrl-C and SIGTERM keep the finished levels, in a background job too
    options = {k: v for k, v in vars(args).items() if k != "func"}
    rec = RunRecorder(Path("."), "bench", args.engine or "detected", options, kind="bench",
                      path=Path(args.json_path) if args.json_path else None)
    try:
        check_outputs(args)
        check_open_files(args)
        run(args, rec, ctx)
    except (ValueError, SglperfError) as e:
        resume()
        print(f"sglperf bench: {e.report() if isinstance(e, SglperfError) else e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, UsageError)) else 1
    except KeyboardInterrupt:
        interrupted = True  # the finished levels are still reported and written
    interrupted = interrupted or "interrupted_level" in ctx
    measurements = ctx.get("measurements", [])
    results = [m.result for m in measurements]
    print(table(results))
    if ctx.get("engine"):
        e = ctx["engine"]
        print(f"engine: {e['engine']} ({'detected' if e.get('detected') else 'as given'}), wire {e.get('wire')}, "
              f"{e.get('prompt_format', 'ids')} prompts, "
              f"{'a new connection per request' if e['new_connection_per_request'] else 'keep-alive connections'}")
    if interrupted:
        print(f"interrupted{' during ' + ctx['interrupted_level'] if 'interrupted_level' in ctx else ''}: "
              f"{len(results)} finished level(s) above", file=sys.stderr)
    if ctx.get("engine"):
        rec.doc.engine = ctx["engine"]["engine"]
    rec.finish("interrupted" if interrupted else "finished", not interrupted)
    if args.json_path:
        print(f"run JSON: {args.json_path}")
    if args.records:
        write_jsonl(args.records, ({"level": m.result.concurrency if m.result.concurrency is not None else
                                    f"r{m.result.rate:g}", **vars(r)} for m in measurements for r in m.records))
        print(f"records: {args.records}")
    resume()  # a Ctrl-C while the interrupted run was written was noted, not raised: it ends now
    if interrupted:
        return 130
    return 0 if all(r.valid for r in results) else 1
