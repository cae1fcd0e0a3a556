"""Real SGLang 0.5.17 on one H100 serving three model shapes on one host start (tests/data/gpu/h100-sglang-0.5.17-
shapes): the GLM-shaped MoE at GLM's real width (gpu1-sglang), a dense 8B Llama and the tiny Llama, judged again by
the suite's own loop. The GLM MoE's decode step is GPU time: its levels read alike to 0.2% across server starts,
where the tiny model's swing by 9-13%."""

import json
from pathlib import Path

import pytest

from sglperf.decide import decide
from sglperf.decide.ab import AB
from sglperf.decide.plateau import Plateau
from sglperf.decide.replay import RecordedConfig, RecordedRun
from sglperf.judge.canary import UNDER_LOAD, CanaryRules, check_under_load
from sglperf.run import profiles
from sglperf.store.rundoc import load_run

DATA = Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17-shapes"
OUTPUTS = json.loads((Path(__file__).parent / "data" / "outputs" / "h100-sglang-healthy.json").read_text())["levels"]
GLM_RR16 = ("20261207-010140-a1b972", "20261207-011146-b1b653")  # two server starts, rr16
GLM_RR64 = "20261207-010419-ce6659"
LLAMA8B = ("20261207-010758-8c3525", "20261207-011349-96f39b")
TINY = "20261207-011003-fe1711"


def run(stem: str):
    return load_run(DATA / f"{stem}.json")


def rechecked(doc):
    """A level as today's output check judges it: live, an earlier rule called the GLM MoE's shared healthy cycle
    (0 5709, in 15-25% of its outputs) degenerate; its sampled outputs pass now (tests/test_output_check.py)."""
    kept = tuple(r for r in doc.invalid_reasons if not r.startswith(UNDER_LOAD))
    return doc.model_copy(update={"invalid_reasons": kept, "valid": not kept})


def test_the_glm_moes_sampled_outputs_pass_todays_check_at_every_level_the_live_rule_refused():
    for stem, config in ((GLM_RR16[0], "rr16"), (GLM_RR64, "rr64")):
        for lv, doc in run(stem).configs[config].levels.items():
            assert any(r.startswith(UNDER_LOAD) for r in doc.invalid_reasons), "what the live run said"
            outs = [tuple(o) for o in OUTPUTS[f"glm-moe-wide-{config}-c{lv}"]]
            assert check_under_load(outs, CanaryRules(), 16, 32000) is None


@pytest.mark.parametrize("stems,config,spread", [(GLM_RR16, "rr16", 0.002), (LLAMA8B, "rr16", 0.001)])
def test_a_shape_whose_decode_step_is_gpu_time_reads_alike_across_server_starts(stems, config, spread):
    """Between two server starts on one host start: the GLM MoE's c32 4,432.2 and 4,431.4 tok/s, c64 4,432.3 and
    4,440.7; the 8B's 2,296.4 and 2,298.6, 2,331.8 and 2,332.3. Each level's own 95% interval: +/-0.8-2.8%."""
    a, b = (run(s).configs[config].levels for s in stems)
    for lv in ("32", "64"):
        x, y = a[lv].sustained_output_tps, b[lv].sustained_output_tps
        assert abs(x / y - 1) < spread, (lv, x, y)
        for d in (a[lv], b[lv]):
            assert d.sustained_output_tps_ci95 / d.sustained_output_tps < 0.03
            assert 0.98 < d.server_ratio < 1.02, "the client's count is the server's"


def test_the_glm_moes_plateaus_pass_on_the_cap_and_on_the_kv_pool():
    """rr16 at c32/c64/c96, SGLang running 16.0 of its cap 16: flat within 2.6%; rr64 past the 48-request pool at
    c64 and c96: 8,360.6 and 8,552.0 tok/s, running 49 of 48 (SGLang admits past the pool and retracts)."""
    prof = profiles.load("gpu1-sglang")
    for stem, config, attributed in ((GLM_RR16[0], "rr16", "cap"), (GLM_RR64, "rr64", "kv")):
        ev = RecordedConfig(run(stem), config, None, prof, source="none", restate=rechecked)
        o = decide(Plateau((32, 64, 96)), ev)
        assert o.kind == "pass", o.message
        assert ev.recorded["plateau"].attributed_to == attributed


def test_the_glm_moes_ab_gains_past_the_cap_with_its_interval():
    """rr64 over rr16 on one host start: +60% at c32, +89% at c64, +98% at c96; past rr16's cap +81.4% (95%:
    +76.9% .. +85.9%), where the tiny model's read +55-80% with intervals 38-59 points wide."""
    doc = run(GLM_RR16[0])
    doc.configs["rr64"] = run(GLM_RR64).configs["rr64"]
    session = RecordedRun(doc, None, profiles.load("gpu1-sglang"), restate=rechecked)
    o = decide(AB(), session.ab())
    assert o.kind == "pass", o.message
    gains = session.recorded["ab"].gains
    assert [round(gains[lv], 2) for lv in ("32", "64", "96")] == [0.60, 0.89, 0.98], gains
    assert "+81.4% (+76.9% .. +85.9%)" in "\n".join(o.shown)


def test_the_tiny_model_on_the_same_host_start_reads_its_levels_wider():
    lv = run(TINY).configs["rr16"].levels
    assert lv["32"].sustained_output_tps_ci95 / lv["32"].sustained_output_tps > 0.07
