"""The built-in simulator (`python -m sglperf.sim`): SGLang's surface, so everything of the SGLang adapter holds;
its hardware is the simulated preset, and its flags are checked by its own parser."""

from __future__ import annotations

from .base import FlagCheck, Series
from .sglang import SGLang, check_flags


class Sim(SGLang):
    name = "sim"
    host_cpu_matters = False  # it measures how far it fell behind real time itself (sim_behind_share)
    series = {**SGLang.series,
              "sim_engine_s_total": Series("sglperf_sim:engine_seconds_total"),
              "sim_behind_s_total": Series("sglperf_sim:behind_seconds_total")}

    def hardware_class(self, info: dict, argv: list[str], gpu_rows: list[dict]) -> str:
        sim = (info or {}).get("sglperf_simulator") or {}
        return f"sim:{sim.get('preset', 'unknown')}"

    def vocab_size(self, url, api_key, info, timeout=10.0):
        n = ((info or {}).get("sglperf_simulator") or {}).get("vocab_size")
        return n if isinstance(n, int) and n > 0 else None

    def check_flags(self, argv: list[str]) -> FlagCheck:
        from ..sim.args import build_parser

        known = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
        return FlagCheck("the simulator's parser", tuple(check_flags(argv, known)))
