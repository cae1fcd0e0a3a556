"""SGLang (`sglang serve`): /server_info for capacity, /flush_cache between levels, sglang:* series, native
/generate with token ids and ignore_eos; launch flags checked by the installed SGLang's own parser where it
imports, else by the vendored 0.5.23 flag list."""

from __future__ import annotations

import argparse
import json
import math
import sys
from importlib import metadata
from pathlib import Path

from ..fileio import cache_dir
from ..records import Ceiling, ServerSample
from .base import Engine, FlagCheck, Series, server_count
from .sglang_model import SHAPES, make_model

VENDORED_FLAGS = Path(__file__).resolve().parent.parent / "data" / "sglang-0.5.23-flags.txt"


def gpu_model_dir(name: str = "llama-tiny") -> Path:
    """The config and tokenizer of the model shape `name` (sglang_model.SHAPES) for SGLang on a GPU (its weights are
    SGLang's dummy ones); the directory names the shape, so a changed shape is made anew."""
    kind, shape = SHAPES[name]
    return cache_dir() / f"sglang-gpu-model-{kind}-{shape['hidden_size']}x{shape['num_hidden_layers']}-dummy"


# a profile's model placeholder -> the shape it names
GPU_MODELS = {"{sglang_gpu_model}": "llama-tiny", "{sglang_gpu_glm_moe_model}": "glm-moe-tiny",
              "{sglang_gpu_glm_moe_wide_model}": "glm-moe-wide", "{sglang_gpu_llama8b_model}": "llama-8b"}


def vendored_flags() -> set[str]:
    return {ln.strip() for ln in VENDORED_FLAGS.read_text().splitlines() if ln.startswith("--")}


def installed_flags() -> tuple[set[str], str] | None:
    """The flags of the SGLang installed beside sglperf (flags are renamed between versions), or None."""
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
    except Exception:  # not installed, or it cannot import on this machine (no CUDA): use the vendored list
        return None
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    return flags, f"the installed sglang {metadata.version('sglang')}'s parser"


def check_flags(argv: list[str], known: set[str]) -> list[str]:
    """Problems SGLang's parser would have with argv: unknown flags, and prefixes it finds ambiguous
    (argparse allow_abbrev: `--cuda-graph-max-bs` matches two flags in 0.5.23 and exits 2)."""
    problems = []
    for a in argv:
        if not a.startswith("--"):
            continue
        flag = a.split("=", 1)[0]
        if flag in known:
            continue
        matches = sorted(k for k in known if k.startswith(flag))
        if len(matches) > 1:
            problems.append(f"{flag}: ambiguous option, could match {', '.join(matches)} (SGLang exits 2)")
        elif not matches:
            problems.append(f"{flag}: not a flag of this SGLang (unrecognized arguments, exit 2)")
    return problems


def predict_ceiling(max_total_num_tokens: int, page_size: int, isl: int, osl: int,
                    admission_cap: int | None) -> Ceiling:
    """KV ceiling = max_total_num_tokens / tokens per request (page-rounded); the effective cap is the smaller."""
    per = math.ceil((isl + osl) / page_size) * page_size
    kv = max_total_num_tokens // per
    if admission_cap is not None and admission_cap < kv:
        return Ceiling(kv, admission_cap, admission_cap, "cap", per)
    return Ceiling(kv, admission_cap, kv, "kv", per)


class SGLang(Engine):
    name = "sglang"
    wire = "sglang"
    info_paths = ("/server_info", "/get_server_info")
    ready_line = "The server is fired up and ready to roll!"  # logged after its warm-up request answered
    flush_path = "/flush_cache"
    loads_path = "/v1/loads"
    series = {
        "decode_tokens_total": Series("sglang:realtime_tokens_total", {"mode": "decode"}),
        "first_tokens_total": Series("sglang:time_to_first_token_seconds_count"),
        # a finished request's completion tokens, over both is_streaming labels: the count of what it streamed
        # while it drafts (measure/server_view.drafting)
        "output_tokens_total": Series("sglang:generation_tokens_total"),
        "running": Series("sglang:num_running_reqs"),
        "queued": Series("sglang:num_queue_reqs"),
        "token_usage": Series("sglang:token_usage", combine="mean"),  # a ratio per DP rank: averaged
        "used_tokens": Series("sglang:num_used_tokens"),
        "max_total_tokens": Series("sglang:max_total_num_tokens"),
        "retracted_total": Series("sglang:num_retracted_requests_total"),
        "gen_throughput": Series("sglang:gen_throughput"),
        # forward passes by mode ("decode_none" on the CPU, "decode_..." with CUDA graphs): with the decode tokens,
        # the mean running count the scheduler itself counted at every step (its num_running_reqs gauge is only
        # written at its log points: --decode-log-interval, 40 steps by default)
        "decode_steps_total": Series("sglang:cuda_graph_passes_total", {"mode": "decode*"}),
        "spec_accept_length": Series("sglang:spec_accept_length", combine="mean"),
        "cache_hit_rate": Series("sglang:cache_hit_rate", combine="mean"),  # a ratio per rank: averaged
    }

    def sample_from(self, values: dict[str, float], t: float) -> ServerSample:
        """Each decode pass emits one token per running request, so the decode tokens counted between two scrapes
        over the decode passes between them is the mean running count there (not while it drafts: a verify step
        emits what it accepted, measure/server_view.drafting)."""
        values = dict(values)
        if values.get("decode_steps_total") is not None and values.get("decode_tokens_total") is not None:
            values["busy_slot_steps_total"] = values["decode_tokens_total"]
        return super().sample_from(values, t)

    def parse_loads(self, obj: dict, t: float) -> ServerSample | None:
        loads = obj.get("loads") if isinstance(obj, dict) else None
        if not loads:
            return None

        def total(key):
            vals = [x.get(key) for x in loads if isinstance(x.get(key), (int, float))]
            return float(sum(vals)) if vals else None

        usage = [x.get("token_usage") for x in loads if isinstance(x.get("token_usage"), (int, float))]
        return ServerSample(time=t, running=total("num_running_reqs"), queued=total("num_waiting_reqs"),
                            used_tokens=total("num_used_tokens"), max_total_tokens=total("max_total_num_tokens"),
                            token_usage=sum(usage) / len(usage) if usage else None,
                            gen_throughput=total("gen_throughput"))

    PLACEHOLDERS = ("{sglang_cpu_python}", "{sglang_cpu_model}")

    def prepare(self, argv: list[str]) -> None:
        """Real SGLang on the CPU (engines/sglang_cpu.py) where the launch template names it; the tiny model's
        config and tokenizer for a GPU host (`--load-format dummy`) where it names that."""
        if any(part in self.PLACEHOLDERS for part in argv):
            from . import sglang_cpu

            sglang_cpu.prepare()
        for placeholder, name in GPU_MODELS.items():
            if placeholder in argv and not (gpu_model_dir(name) / "config.json").exists():
                kind, shape = SHAPES[name]
                make_model(sys.executable, gpu_model_dir(name), weights=False, kind=kind, shape=shape)

    def resolve(self, part: str) -> str:
        from . import sglang_cpu

        if part == "{sglang_cpu_python}":
            return str(sglang_cpu.python())
        if part == "{sglang_cpu_model}":
            return str(sglang_cpu.model_dir())
        if part in GPU_MODELS:
            return str(gpu_model_dir(GPU_MODELS[part]))
        return super().resolve(part)

    def vocab_size(self, url, api_key, info, timeout=10.0):
        """From the model's config.json where the model path is a local directory (SGLang's /server_info gives the
        path, not the size)."""
        path = info.get("model_path") or info.get("tokenizer_path")
        try:
            config = json.loads((Path(path) / "config.json").read_text()) if path else None
        except (OSError, ValueError):
            return None
        n = config.get("vocab_size") if isinstance(config, dict) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def served_model(self, url, api_key, info, timeout=10.0):
        return info.get("served_model_name") or super().served_model(url, api_key, info, timeout)

    def ceiling(self, info: dict, isl: int, osl: int) -> Ceiling | None:
        total = server_count(info, "max_total_num_tokens")
        if not total:
            return None
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        cap = (server_count(state, "effective_max_running_requests_per_dp",
                            where="/server_info internal_states[0]")
               or server_count(info, "max_running_requests"))
        return predict_ceiling(total, server_count(info, "page_size") or 1, isl, osl, cap)

    def check_flags(self, argv: list[str]) -> FlagCheck:
        found = installed_flags()
        known, source = found if found else (vendored_flags(), "the vendored SGLang 0.5.23 flag list")
        return FlagCheck(source, tuple(check_flags(argv, known)))
