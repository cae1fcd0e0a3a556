"""`sglperf bench`: an ad-hoc sweep of a running server: live progress per level, a table, run JSON, records.

Why a separate command: engineers tune by hand between suite runs; the same client and maths as the suite.
"""

from __future__ import annotations

import argparse
import os
import datetime as dt
import sys
from pathlib import Path

from .. import __version__, engines
from ..categories import SglperfError, UsageError
from ..measure.client import Target, Workload
from ..measure.shards import parse_client_procs, resolve_client_procs
from ..fileio import atomic_write_json, write_jsonl
from ..interrupts import interrupt_on_sigterm
from ..measure.level import LevelMeasurement, LevelSpec, run_level
from ..measure.metrics import MeasurementPolicy
from ..measure.negotiate import negotiate
from ..measure.prompts import FORMATS, Tokenizer
from ..records import SCHEMA_VERSION, LevelResult
from ..redact import api_key_from_env, redact


def int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"levels must be positive integers, got {text!r}")
    return vals


def float_list(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"rates must be > 0, got {text!r}")
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
    p.add_argument("--max-concurrency", type=int, default=None, help="concurrency cap for --rates")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=128)
    p.add_argument("--vocab-range", default="1000,30000", help="prompt ids are drawn from [LOW,HIGH)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="OpenAI 'model' field (default: the server's first model)")
    p.add_argument("--ci-target", type=float, default=0.01, help="CI half-width / sustained to stop at (0.01)")
    p.add_argument("--ratio", type=float, default=0.9, help="steady-state in-flight ratio (0.9)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="longest a level may run")
    p.add_argument("--client-procs", default="1", help="client processes a closed-loop level's streams are sharded "
                   "over: a count, or auto (from the previous level's rate and the free cores)")
    p.add_argument("--min-seconds", type=float, default=0.0)
    p.add_argument("--stall-timeout", type=float, default=60.0)
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--no-flush", action="store_true", help="do not POST /flush_cache between levels")
    p.add_argument("--slo-ttft-ms", type=float, default=None,
                   help="goodput: a request meets the SLO when its TTFT is at most this (and its TPOT at most "
                        "--slo-tpot-ms, where given)")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput: TPOT bound of the SLO (ms)")
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
    head = (f"{'level':>7} {'sustained out tok/s':>21} {'total':>8} {'whole-run':>9} {'peak':>7} {'TTFT p50/p99 ms':>17} "
            f"{'TPOT p50':>8} {'E2E p50 s':>9} {'conc':>6} {'server':>7} {'running':>7}"
            f"{' goodput tok/s (met)' if slo else ''}  valid")
    rows = [head, "-" * len(head)]
    for r in results:
        lvl = f"c{r.concurrency}" if r.concurrency is not None else f"r{r.rate:g}"
        sus = f"{fmt(r.sustained_output_tps)} ± {fmt(r.sustained_output_tps_ci95, ',.1f')}"
        ttft = f"{fmt(r.ttft_ms.median)}/{fmt(r.ttft_ms.p99)}"
        e2e = fmt(r.e2e_ms.median / 1e3 if r.e2e_ms.median else None, ".2f")
        ratio = fmt(r.server_ratio, ".3f")
        rows.append(f"{lvl:>7} {sus:>21} {fmt(r.sustained_total_tps):>8} {fmt(r.whole_run_output_tps):>9} "
                    f"{fmt(r.peak_output_tps):>7} {ttft:>17} {fmt(r.tpot_ms.median, '.1f'):>8} {e2e:>9} "
                    f"{fmt(r.achieved_concurrency, '.1f'):>6} {ratio:>7} {fmt(r.server_mean_running, '.0f'):>7}"
                    + (f" {fmt(r.goodput_tps)} ({fmt(r.slo_met_share and r.slo_met_share * 100, '.0f')}%)".rjust(20)
                       if slo else "")
                    + f"  {'yes' if r.valid else 'NO: ' + '; '.join(r.invalid_reasons)}")
    rows.append("sustained = steady-state window, ±95% CI (batch means); whole-run and peak as bench_serving defines "
                "them (reported, never gated); server = client sustained / server's own count over the window"
                + ("; goodput = output tok/s of requests sent in the window that met the SLO (met: their share)"
                   if slo else ""))
    return "\n".join(rows)


def run(args: argparse.Namespace, out: list[LevelMeasurement], ctx: dict) -> None:
    """Measure every level into `out` (so an interrupt keeps the finished ones); `ctx` gets what was learned."""
    key = api_key_from_env()
    url = engines.check_url(args.url, "--url")
    lo, hi = (int(x) for x in args.vocab_range.split(","))
    workload = Workload(args.isl, args.osl, seed=args.seed, vocab_low=lo, vocab_high=hi,
                        prompt_format=args.prompt_format,
                        tokenizer=Tokenizer(args.tokenizer) if args.tokenizer else None)
    engine = engines.get(args.engine) if args.engine else engines.detect(url, key)
    ctx["engine"] = engine.describe() | {"detected": args.engine is None}
    engine.reach(url, key)
    server_info = engine.server_info(url, key)
    ctx["server_info"] = server_info
    model = args.model or engine.served_model(url, key, server_info)
    target = Target.for_engine(url, engine, api=args.api, prompt_format=args.prompt_format, api_key=key, model=model)
    if engine.negotiates:
        target, workload, notes = negotiate(target, workload)
        ctx["engine"]["negotiated"] = notes
        for n in notes:
            print(f"sglperf bench: {n}", file=sys.stderr)
    ctx["engine"]["wire"] = target.wire.name
    ctx["engine"]["prompt_format"] = workload.prompt_format
    policy = MeasurementPolicy(ci_target=args.ci_target, steady_state_ratio=args.ratio,
                               slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    specs = ([LevelSpec(concurrency=c, max_seconds=args.max_seconds, min_seconds=args.min_seconds,
                        stall_timeout_s=args.stall_timeout, request_timeout_s=args.request_timeout)
              for c in (args.levels or [8, 16, 32])]
             if not args.rates else
             [LevelSpec(rate=r, max_concurrency=args.max_concurrency, burstiness=args.burstiness,
                        max_seconds=args.max_seconds, min_seconds=args.min_seconds,
                        stall_timeout_s=args.stall_timeout, request_timeout_s=args.request_timeout) for r in args.rates])
    setting, previous = parse_client_procs(args.client_procs), None
    for spec in specs:
        procs = resolve_client_procs(setting, spec.concurrency, previous) if spec.concurrency else 1
        m = run_level(target, workload, spec, policy, engine=engine, progress=_progress, client_procs=procs,
                      flush=not args.no_flush)
        previous = m.result
        if sys.stderr.isatty():
            print(file=sys.stderr)
        if m.stop_reason == "interrupted":
            ctx["interrupted_level"] = spec.label
            return
        out.append(m)


def check_outputs(args: argparse.Namespace) -> None:
    """--json and --records must be writable before a level is measured, not after."""
    for option, value in (("--json", args.json_path), ("--records", args.records)):
        if value:
            d = Path(value).resolve().parent
            if not d.is_dir() or not os.access(d, os.W_OK):
                why = "is not writable" if d.is_dir() else "does not exist"
                raise UsageError(f"{option} {value}: the directory {d} {why}")


def main(args: argparse.Namespace) -> int:
    measurements: list[LevelMeasurement] = []
    ctx: dict = {}
    interrupted = False
    interrupt_on_sigterm()  # Ctrl-C and SIGTERM keep the finished levels, in a background job too
    try:
        check_outputs(args)
        run(args, measurements, ctx)
    except (ValueError, SglperfError) as e:
        print(f"sglperf bench: {e.report() if isinstance(e, SglperfError) else e}", file=sys.stderr)
        return 2 if isinstance(e, (ValueError, UsageError)) else 1
    except KeyboardInterrupt:
        interrupted = True  # the finished levels are still reported and written
    interrupted = interrupted or "interrupted_level" in ctx
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
    if args.json_path:
        doc = {"schema_version": SCHEMA_VERSION, "kind": "bench", "sglperf_version": __version__,
               "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "status": "interrupted" if interrupted else "finished",
               "arguments": {k: v for k, v in vars(args).items() if k != "func"}, "engine": ctx.get("engine"),
               "server_info": ctx.get("server_info"), "levels": [r.to_dict() for r in results],
               "scrape_source": [m.scrape_source for m in measurements]}
        atomic_write_json(args.json_path, redact(doc))
        print(f"run JSON: {args.json_path}")
    if args.records:
        write_jsonl(args.records, ({"level": i, **vars(rec)} for i, m in enumerate(measurements)
                                   for rec in m.records))
        print(f"records: {args.records}")
    if interrupted:
        return 130
    return 0 if all(r.valid for r in results) else 1
