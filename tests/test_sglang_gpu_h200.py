"""gpu1-sglang's GLM-shaped MoE on an H200 (real SGLang 0.5.17, dummy weights; tests/data/gpu/h200-sglang-0.5.17-glm,
docs/gpu-proof.md): one host start, a whole judged run cut by the device call's limit after its A/B, then one run of
each config. Replayed by the suite's own loop: both plateaus and the A/B pass as they did live; the floors have no
baseline for this class, and three runs (one abandoned) are too few to calibrate one."""

from pathlib import Path

import pytest

from sglperf.categories import SglperfError
from sglperf.decide import decide
from sglperf.decide.ab import AB
from sglperf.decide.floor import Floor
from sglperf.decide.plateau import Plateau
from sglperf.decide.replay import RecordedConfig, RecordedRun
from sglperf.judge import calibration
from sglperf.run import profiles
from sglperf.store.rundoc import load_run

DATA = Path(__file__).parent / "data" / "gpu" / "h200-sglang-0.5.17-glm"
FULL = DATA / "full-cut-20261207-190442-42c7c5.json"
H100 = load_run(Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17-glm-baseline" /
                "calib-20261207-115339-401ab5.json")


def test_the_cut_run_is_kept_as_abandoned_and_calibrates_nothing():
    doc = load_run(FULL)
    assert doc.status == "abandoned" and doc.hardware_class == "1 x NVIDIA H200"
    finished = [load_run(p) for p in sorted(DATA.glob("rr*.json"))]
    with pytest.raises(SglperfError, match="at least 2 runs of each level"):
        calibration.calibrate(finished, isl=128, osl=128, starts=3)


@pytest.mark.parametrize("config,attributed", [("rr16", "cap"), ("rr64", "kv")])
def test_both_plateaus_pass_replayed_as_they_did_live(config, attributed):
    """rr16 on its cap of 16 (running 15.9-16.0); rr64 on the 48-request KV pool (running 47.3-48.8), whose first
    start was undecided (c64 -8.6% +/- 8.0% vs c96 straddled the band) and whose second start decided it."""
    ev = RecordedConfig(load_run(FULL), config, None, profiles.load("gpu1-sglang"), source="none")
    o = decide(Plateau((32, 64, 96)), ev)
    assert o.kind == "pass", o.message
    assert ev.recorded["plateau"].attributed_to == attributed


def test_the_ab_gains_past_the_cap_as_on_the_h100():
    """rr64 over rr16: +41.4% at c32, +57.6% at c64, +81.3% at c96 (the H100's: +60%, +89%, +98%)."""
    session = RecordedRun(load_run(FULL), None, profiles.load("gpu1-sglang"))
    o = decide(AB(), session.ab())
    assert o.kind == "pass", o.message
    gains = session.recorded["ab"].gains
    assert [round(gains[lv], 3) for lv in ("32", "64", "96")] == [0.414, 0.576, 0.813], gains


def test_no_h200_baseline_so_each_floor_is_a_skip_naming_the_missing_baseline():
    ev = RecordedConfig(load_run(FULL), "rr16", None, profiles.load("gpu1-sglang"), source="none")
    o = decide(Floor(32), ev)
    assert o.kind == "skip", o.message


def test_the_kv_bound_levels_read_wider_on_the_h200_than_on_the_h100():
    """rr64's levels on the KV pool retract requests (32-38 retractions at c96) and ran to the 30-s limit without
    reaching the 3% target: +/-4.8-16.7% on the H200 against +/-2.8-5.5% on the H100; rr16's stay within 3% on both."""
    def rel(doc, config):
        levels = doc.configs[config].levels
        return {lv: d.sustained_output_tps_ci95 / d.sustained_output_tps for lv, d in levels.items()}

    h200 = [load_run(FULL), load_run(next(DATA.glob("rr64-*.json")))]
    assert max(max(rel(d, "rr64").values()) for d in h200) > 0.15
    assert max(rel(H100, "rr64").values()) < 0.06
    assert max(max(rel(d, "rr16").values()) for d in (load_run(FULL), load_run(next(DATA.glob("rr16-*.json"))))) < 0.03
