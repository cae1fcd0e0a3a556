"""A run file as llm-d Benchmark Reports (schema v0.2.1 of llm-d-benchmark, the layout its dashboards and analysis
read): one report per measured level, the level being a stage of the run (`run.eid` is the run's id, `run.uid`
names the config and level). The stack carries the engine, its version, flags, GPUs and fingerprint; the load the
workload and the level; the results the level's latency and throughput.

Only what the suite trusts is written: an invalid level, or a config whose output canary failed, gets no report
(its numbers are not a measurement), and the caller is told which were left out. Intervals have no field of their
own in v0.2.1: the sustained throughput's 95% interval rides in its Statistics as `ci95_low`/`ci95_high` (the
schema's Statistics admits extra keys; llm-d's own reader keeps `mean` and drops them), and the whole-run and peak
rates are in `results.profiling.sglperf` beside the starts and the stop rule.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from ..redact import redact, redact_argv
from ..store.rundoc import ConfigDoc, RunDoc

SCHEMA_VERSION = "0.2.1"
PARALLEL_FLAGS = {"tp": ("--tp-size", "--tp", "--tensor-parallel-size"), "dp": ("--dp-size", "--dp"),
                  "ep": ("--ep-size", "--ep"), "pp": ("--pp-size", "--pp")}


@dataclass(frozen=True)
class Report:
    name: str  # <run_id>-<config>-<level>: the file it goes to
    doc: dict


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:32]


def parse_args(server_args: str | None) -> dict[str, object]:
    """`--flag value` / `--flag=value` / `--flag` into {flag: value or None}, secrets replaced."""
    argv = redact_argv(shlex.split(server_args or ""))
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out[name] = value if (eq or value) else None
        i += 1
    return out


def parallelism(args: dict[str, object]) -> dict[str, int]:
    out = {}
    for key, flags in PARALLEL_FLAGS.items():
        for f in flags:
            if isinstance(args.get(f), str) and str(args[f]).isdigit():
                out[key] = int(str(args[f]))
    return out


def component(config: str, fp: dict) -> dict:
    args = parse_args(fp.get("server_args"))
    gpus = int(fp.get("gpu_count") or 0)
    return {
        "metadata": {"schema_version": "0.0.1", "label": config, "cfg_id": fp.get("server_args_hash") or _hash(args),
                     "description": f"{fp.get('engine') or 'engine'} serving config {config} (sglperf profile)"},
        "standardized": {  # v0.2.1's JSON schema keeps `kind` here (v0.2's model copied it from the metadata)
            "kind": "inference_engine", "tool": str(fp.get("engine") or "unknown"),
            "tool_version": str(fp.get("server_version") or fp.get("sglang") or "unknown"),
            "role": "replica", "replicas": 1,
            "model": {"name": str(fp.get("model_path") or "unknown")},
            "accelerator": {"model": str(fp.get("gpu_name") or fp.get("cpu") or "unknown"), "count": gpus,
                            "parallelism": parallelism(args)}},
        "native": {"args": args, "config": {"fingerprint": redact({k: v for k, v in fp.items()
                                                                  if k not in ("server_args",)})}},
    }


def _stats(summary, units: str) -> dict | None:
    """A suite latency summary (records.Summary, ms: mean, median, p90, p99) as Statistics in `units`."""
    if summary is None or summary.mean is None:
        return None
    out = {"units": units, "mean": summary.mean}
    for ours, theirs in (("median", "p50"), ("p90", "p90"), ("p99", "p99")):
        if getattr(summary, ours) is not None:
            out[theirs] = getattr(summary, ours)
    return out


def _rate(value: float | None, half: float | None = None, units: str = "tokens/s") -> dict | None:
    if value is None:
        return None
    out: dict[str, object] = {"units": units, "mean": value}
    if half is not None:
        out.update(ci95_low=value - half, ci95_high=value + half)
    return out


def results(lv, starts: list) -> dict:
    dur = lv.window_s or None
    return {
        "request_performance": {"aggregate": {
            "requests": {"total": lv.requests_sent, "failures": sum((lv.errors or {}).values()),
                         "incomplete": lv.cancelled,
                         "input_length": {"units": "count", "mean": lv.isl},
                         "output_length": {"units": "count", "mean": lv.osl}},
            "latency": {k: v for k, v in {
                "time_to_first_token": _stats(lv.ttft_ms, "ms"),
                "time_per_output_token": _stats(lv.tpot_ms, "ms/token"),
                "inter_token_latency": _stats(lv.itl_ms, "ms/token"),
                "request_latency": _stats(lv.e2e_ms, "ms")}.items() if v},
            "throughput": {k: v for k, v in {
                "output_token_rate": _rate(lv.sustained_output_tps, lv.sustained_output_tps_ci95),
                "total_token_rate": _rate(lv.sustained_total_tps),
                "request_rate": _rate(lv.completed_in_window / dur if dur and lv.completed_in_window else None,
                                      units="queries/s")}.items() if v}}},
        "profiling": {"sglperf": {"measurement": "sustained: the steady-state window of the level",
                                  "window_s": lv.window_s, "stop_reason": lv.stop_reason,
                                  "whole_run_output_tps": lv.whole_run_output_tps,
                                  "peak_output_tps": lv.peak_output_tps, "server_start": lv.server_start,
                                  "achieved_concurrency": lv.achieved_concurrency,
                                  "starts": [{"sustained_output_tps": r.sustained_output_tps,
                                              "ci95": r.sustained_output_tps_ci95, "valid": r.valid}
                                             for r in starts]}},
    }


def level_report(run: RunDoc, config: str, c: ConfigDoc, key: str, stage: int) -> Report:
    lv = c.levels[key]
    fp = run.config_fingerprint(config) or {}
    workload = fp.get("workload") or (run.fingerprint or {}).get("workload") or f"random {lv.isl}/{lv.osl}"
    # a length mix (log-normal, clipped), a conversation (prompts grow by turn) and a trace (its own lengths, up to
    # isl/osl) are no fixed length; a trace's requests are sampled from recorded traffic, the rest made at random
    spread = "other" if str(workload).startswith(("length_mix", "multi_turn", "trace")) else "fixed"
    load_std: dict[str, object] = {
        "tool": "sglperf", "tool_version": run.sglperf_version,
        "source": "sampled" if str(workload).startswith("trace") else "random", "stage": stage,
        "input_seq_len": {"distribution": spread, "value": lv.isl},
        "output_seq_len": {"distribution": spread, "value": lv.osl}}
    if lv.concurrency is not None:
        load_std["concurrency"] = lv.concurrency
    else:
        load_std["rate_qps"] = lv.rate
    doc = {
        "version": SCHEMA_VERSION,
        "run": {"uid": f"{run.run_id}/{config}/{lv.name}", "eid": run.run_id,
                "time": {"start": run.started, "end": run.finished, "duration": f"PT{lv.duration_s:.3f}S"},
                "description": f"sglperf profile {run.profile}, config {config}, level {lv.name} ({run.status})",
                "keywords": ["sglperf", run.profile, config, lv.name]},
        "scenario": {"stack": [component(config, fp)],
                     "load": {"metadata": {"schema_version": "0.0.1", "cfg_id": _hash([workload, lv.name]),
                                           "description": workload},
                              "standardized": load_std,
                              "native": {"args": redact(dict(run.options))}}},
        "results": results(lv, [lv, *c.replicates.get(key, [])]),
    }
    return Report(f"{run.run_id}-{config}-{lv.name}", doc)


def reports(run: RunDoc) -> tuple[list[Report], list[str]]:
    """(the run's reports, what was left out and why)."""
    out, left = [], []
    failed = {f.split(":")[0] for f in run.canary_failures()}
    for config, c in run.configs.items():
        if config in failed:
            left.append(f"{config}: every level: its output canary failed (a server returning garbage has no speed)")
            continue
        for stage, key in enumerate(sorted(c.levels, key=float)):
            lv = c.levels[key]
            if not lv.valid:
                left.append(f"{config} {lv.name}: invalid: {'; '.join(lv.invalid_reasons) or 'no reason given'}")
                continue
            out.append(level_report(run, config, c, key, stage))
    return out, left
