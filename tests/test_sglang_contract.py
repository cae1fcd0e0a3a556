"""The simulator against real SGLang 0.5.23 on the CPU: both read the same way (/server_info, /metrics after one
request, one streamed /generate) and compared by sim/contract.differences, which allows only what sim/contract.py
lists as left out. Also: every series the SGLang adapter reads is one SGLang exposes, the counters SGLang creates
lazily are declared in its source, and every flag the suite vendors is one the installed SGLang's parser knows.

Needs `sglperf sglang prepare --cpu`; skipped without it, except where SGLPERF_REQUIRE_SGLANG=1 (CI) makes a
missing SGLang a failure."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import requests

from sglperf import engines
from sglperf.engines import sglang_cpu
from sglperf.engines.sglang import VENDORED_FLAGS, SGLang
from sglperf.run.launch import LaunchSpec, launch
from sglperf.run.profiles import load as load_profile
from sglperf.sim import contract

from .conftest import SIM

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "cpu-sglang.toml"
PROMPT = list(range(100, 116))  # 16 word tokens of the tiny model
OSL = 8


def _require_sglang() -> None:
    prepared = sglang_cpu.python().exists() and (sglang_cpu.model_dir() / "model.safetensors").exists()
    if prepared:
        return
    why = f"real SGLang on the CPU is not prepared ({sglang_cpu.python()}): run `sglperf sglang prepare --cpu`"
    if os.environ.get("SGLPERF_REQUIRE_SGLANG") == "1":
        pytest.fail(why + " (SGLPERF_REQUIRE_SGLANG=1: CI must test against it)")
    pytest.skip(why)


def read_surface(url: str) -> contract.Surface:
    info = requests.get(f"{url}/server_info", timeout=30).json()
    chunks = []
    with requests.post(f"{url}/generate", json={"input_ids": PROMPT, "stream": True, "sampling_params": {
            "max_new_tokens": OSL, "temperature": 0, "ignore_eos": True}}, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks.append(json.loads(line[6:]))
    metrics = requests.get(f"{url}/metrics", timeout=30).text
    return contract.Surface(info, contract.families(metrics), chunks, metrics)


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    """(real, simulated): SGLang started as profile cpu-sglang starts it (config rr4), and the simulator."""
    _require_sglang()
    prof = load_profile(PROFILE)
    cfg = prof.configs[0]
    argv = [str(sglang_cpu.python()), "-m", "sglang.launch_server", "--model-path", str(sglang_cpu.model_dir()),
            *prof.server.args, *cfg.args]
    logs = tmp_path_factory.mktemp("logs")
    real = launch(LaunchSpec("sglang", argv, logs, env=dict(prof.server.env),
                             launch_timeout_s=prof.server.launch_timeout_s, terminate_timeout_s=30))
    sim = launch(LaunchSpec("sim", [*SIM, "--preset", "ci", "--random-seed", "1", "--enable-metrics", *cfg.args],
                            logs, launch_timeout_s=30, terminate_timeout_s=10))
    try:
        yield read_surface(real.url), read_surface(sim.url)
    finally:
        for srv in (sim, real):
            assert not srv.stop().survivors


def test_the_simulator_answers_as_sglang_does_but_for_what_it_lists_as_left_out(surfaces):
    real, sim = surfaces
    assert contract.differences(real, sim) == []


def test_every_series_the_sglang_adapter_reads_is_one_sglang_exposes(surfaces):
    real, _ = surfaces
    adapter = engines.get("sglang")
    samples = {line.split("{")[0].split()[0] for line in real.metrics_text.splitlines()
               if line and not line.startswith("#")}
    lazy = {f.removesuffix("_total") for f in contract.METRICS_LAZY} | set(contract.METRICS_LAZY)
    missing = sorted(s.sample for s in adapter.series.values() if s.sample not in samples and s.sample not in lazy)
    assert missing == []


def test_the_counters_sglang_creates_lazily_are_declared_in_its_source():
    _require_sglang()
    site = subprocess.run([str(sglang_cpu.python()), "-c",
                           "import sglang, os; print(os.path.dirname(sglang.__file__))"],
                          capture_output=True, text=True, check=True, env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    source = "\n".join(p.read_text(errors="replace") for p in Path(site.stdout.strip()).rglob("*.py")
                       if "metrics" in p.name)
    assert sorted(f for f in contract.METRICS_LAZY if f'"{f}"' not in source) == []


def test_every_vendored_flag_is_one_the_installed_sglang_parser_knows():
    """Known as SGLang's own parser takes it: a flag or alias it defines, or a prefix of exactly one (argparse's
    abbreviations: `--tp` for `--tp-size`)."""
    _require_sglang()
    code = ("import argparse, json; from sglang.srt.server_args import ServerArgs; p = argparse.ArgumentParser(); "
            "ServerArgs.add_cli_args(p); print(json.dumps(sorted(p._option_string_actions)), p.allow_abbrev)")
    out = subprocess.run([str(sglang_cpu.python()), "-c", code], capture_output=True, text=True,
                         env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    options, abbrev = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    known = json.loads(options)
    vendored = [ln.strip() for ln in VENDORED_FLAGS.read_text().splitlines() if ln.strip().startswith("--")]

    def takes(flag: str) -> bool:
        return flag in known or abbrev == "True" and len([k for k in known if k.startswith(flag)]) == 1

    assert len(vendored) > 50 and [f for f in vendored if not takes(f)] == []


def test_a_metric_renamed_in_the_simulator_is_found():
    info = {k: 1 for k in contract.SERVER_INFO_READ} | {"internal_states": [{k: 1 for k in
                                                                             contract.INTERNAL_STATE_READ}]}
    chunks = [{"text": "a", "output_ids": [1], "meta_info": {"finish_reason": None}},
              {"text": "a b", "output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length", "length": 2}}}]
    real = contract.Surface(info, frozenset({"sglang:num_running_reqs", "sglang:token_usage"}), chunks)
    renamed = contract.Surface(info, frozenset({"sglang:num_running_requests", "sglang:token_usage"}), chunks)
    assert contract.differences(real, real) == []
    assert contract.differences(real, renamed) == [
        "/metrics: the simulator exposes sglang:num_running_requests, SGLang does not",
        "/metrics: SGLang exposes sglang:num_running_reqs, which the simulator neither answers nor lists as left out"]


def test_a_key_the_simulator_drops_or_retypes_is_found():
    info = {k: 1 for k in contract.SERVER_INFO_READ} | {"internal_states": [{k: 1 for k in
                                                                             contract.INTERNAL_STATE_READ}]}
    chunks = [{"text": "a", "output_ids": [1], "meta_info": {"finish_reason": {"type": "length", "length": 1}}}]
    real = contract.Surface(info, frozenset(), chunks)
    sim = contract.Surface({**{k: v for k, v in info.items() if k != "page_size"}, "max_total_num_tokens": "1"},
                           frozenset(), [{**chunks[0], "meta_info": {"finish_reason": "length"}}])
    diff = contract.differences(real, sim)
    assert "/server_info: the simulator has no 'page_size' (SGLang: 1)" in diff
    assert any("'max_total_num_tokens' is a number in SGLang" in d for d in diff)
    assert any("the simulator's last event ends with finish_reason 'length'" in d for d in diff)


@pytest.mark.parametrize("name", ["glm5-nvfp4-tp8", "glm5-nvfp4-tp8-1k1k", "glm5-nvfp4-tp8-8k1k"])
def test_the_glm5_profiles_command_lines_are_parsed_by_the_installed_sglangs_own_parser(name):
    """Each config's arguments through SGLang 0.5.23's ServerArgs parser itself (the real package, on the CPU):
    it parses them and keeps the values the profile asked for."""
    _require_sglang()
    prof = load_profile(name)
    for c in prof.configs:
        argv = prof.launch_argv(c.name, model_path="nvidia/GLM-5-NVFP4")
        args = argv[argv.index("--model-path"):]
        code = ("import argparse, json, sys; from sglang.srt.server_args import ServerArgs; "
                "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p); a = p.parse_args(sys.argv[1:]); "
                "print(json.dumps({k: a.__dict__[k] for k in ('tp_size', 'max_running_requests', 'quantization')}))")
        out = subprocess.run([str(sglang_cpu.python()), "-c", code, *args], capture_output=True, text=True,
                             env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
        assert out.returncode == 0, out.stderr[-2000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got["tp_size"] == 8 and got["quantization"] == "modelopt_fp4" and got["max_running_requests"] in (
            1024, 2048), got


@pytest.mark.parametrize("name, isl, osl, ceiling", [("glm5-nvfp4-tp8-1k1k", 1024, 1024, 241),
                                                     ("glm5-nvfp4-tp8-8k1k", 8192, 1024, 53)])
def test_a_long_context_profiles_ladder_crosses_the_kv_ceiling_its_lengths_give(name, isl, osl, ceiling):
    """The seed's pool (495,488 tokens in 64-token pages) over each request's pages: the ceiling follows the lengths,
    and the ladder has two levels past it for the plateau."""
    prof = load_profile(name)
    c = SGLang().ceiling({"max_total_num_tokens": 495488, "page_size": 64, "max_running_requests": 2048},
                                prof.workload.isl, prof.workload.osl)
    assert (prof.workload.isl, prof.workload.osl) == (isl, osl)
    assert c.effective == ceiling and c.binding == "kv"
    assert len([lv for lv in prof.levels if lv > ceiling]) >= 2 and min(prof.levels) < ceiling
