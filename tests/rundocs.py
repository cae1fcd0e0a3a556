"""Run documents for tests: complete, valid RunDocs built from LevelResults, as the recorder writes them."""

from __future__ import annotations

import dataclasses

from sglperf.records import LevelResult, Summary
from sglperf.store.rundoc import ConfigDoc, LevelDoc, RunDoc

NO_SUMMARY = Summary(None, None, None, None, 0)


def result(level: int = 8, *, valid: bool = True, value: float | None = 1000.0, ci: float | None = 1.0,
           ttft_p99: float | None = 3.0) -> LevelResult:
    return LevelResult(
        concurrency=level, rate=None, isl=32, osl=32, valid=valid, invalid_reasons=() if valid else ("x",),
        sustained_output_tps=value, sustained_output_tps_ci95=ci, sustained_total_tps=None, whole_run_output_tps=None,
        whole_run_total_tps=None, peak_output_tps=None, achieved_concurrency=None, server_output_tps=None,
        server_ratio=None, server_mean_running=None, server_max_running=None, server_mean_queued=None,
        server_mean_token_usage=None, server_retractions=None, ttft_ms=Summary(None, None, None, ttft_p99, 1),
        tpot_ms=NO_SUMMARY, itl_ms=NO_SUMMARY, e2e_ms=NO_SUMMARY, errors={}, window_start=None, window_end=None,
        window_s=0.0, ci_batches=0, lifetime_s=None, completed=0, completed_in_window=0, requests_sent=0, cancelled=0,
        duration_s=0.0, client_lag_p99_ms=None, client_cpu_share=None)


def run_doc(run_id: str, levels: dict[int, LevelResult], *, config: str = "rr24-cds4", profile: str = "sim-ci",
            hardware_class: str = "sim:ci", fingerprint: dict | None = None) -> RunDoc:
    return RunDoc(run_id=run_id, profile=profile, engine="sim", sglperf_version="0.1.0",
                  started="2026-11-29T00:00:00+00:00", finished="2026-11-29T00:01:00+00:00", complete=True,
                  status="finished", fingerprint=fingerprint if fingerprint is not None else {"driver": "575.51"},
                  hardware_class=hardware_class,
                  configs={config: ConfigDoc(levels={str(lv): LevelDoc(**_fields(r), stop_reason="converged")
                                                     for lv, r in levels.items()})})


def _fields(r: LevelResult) -> dict:
    """r's fields, one level deep: what to_dict gives the validator, without its deep copy (the interval
    simulations build 10,000 run documents)."""
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}


def bench_levels(doc: dict) -> list[dict]:
    """The levels of a `sglperf bench --json` document (a RunDoc of kind "bench", one config), in order."""
    assert doc["kind"] == "bench"
    return list(doc["configs"]["bench"]["levels"].values())


def bench_engine(doc: dict) -> dict:
    """What the bench document says of the engine it measured (detected or given, wire, prompts, negotiation)."""
    return doc["configs"]["bench"]["server"]["engine"]
