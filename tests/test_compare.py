"""`sglperf compare RUN_A RUN_B` on real GPU run files: a slowed stack named SLOWER at each level with its interval
and the flag that changed, two healthy runs NO CHANGE, runs of other hardware or with garbage output not compared,
and the rule's verdicts at their edges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglperf.cli import main
from sglperf.judge import compare as rule
from sglperf.judge.noise import Noise

from .rundocs import result, run_doc

GPU = Path(__file__).parent / "data" / "gpu"
DAY = GPU / "h100-sglang-0.5.17-2026-12-06"
SHAPES = GPU / "h100-sglang-0.5.17-shapes"
HEALTHY_TINY = DAY / "judged-20261206-152703-4560db.json"
TINY_BASELINE = Path(__file__).parent.parent / "baselines" / "gpu1-sglang-tiny" / "1-x-nvidia-h100-80gb-hbm3.json"


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["compare", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_smaller_cuda_graph_batch_is_slower_at_every_level_naming_the_flag(capsys, tmp_path):
    rc, out, _ = run(capsys, HEALTHY_TINY, DAY / "slowed-cg8.json", "--baseline", TINY_BASELINE,
                     "--json", tmp_path / "cmp.json", "--plot", tmp_path / "cmp.png")
    assert rc == 1
    assert "rr16 c32: A 9,783.8" in out and "SLOWER" in out
    assert "server_args (+ --cuda-graph-max-bs-decode=8)" in out
    doc = json.loads((tmp_path / "cmp.json").read_text())
    verdicts = {c["level"]: c for c in doc["levels"]}
    assert set(verdicts) == {"c32", "c64"}
    for c in verdicts.values():
        assert c["verdict"] == "SLOWER" and c["change_high"] < -0.05 and c["between_start_noise"]
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"


def test_two_healthy_runs_of_the_8b_shape_are_no_change(capsys):
    rc, out, _ = run(capsys, SHAPES / "20261207-010758-8c3525.json", SHAPES / "20261207-011349-96f39b.json")
    assert rc == 0
    assert out.count("NO CHANGE") == 2 and "within-run noise only" in out
    assert "0 of 2 levels SLOWER" in out


def test_the_tiny_models_start_to_start_noise_leaves_two_healthy_runs_undecided_not_slower(capsys):
    """Its baseline's between-start CV (about 10%) widens the interval past what one start's own interval says."""
    rc, out, _ = run(capsys, HEALTHY_TINY, DAY / "judged-20261206-153038-99c354.json", "--baseline", TINY_BASELINE)
    assert rc == 0 and "SLOWER:" not in out and out.count("UNDECIDED") == 2


def test_json_to_stdout_is_machine_readable(capsys):
    rc, out, _ = run(capsys, HEALTHY_TINY, DAY / "faster-no-overlap.json", "--baseline", TINY_BASELINE, "--json", "-")
    doc = json.loads(out)
    assert rc == 0 and doc["changed"]["rr16"].endswith("(+ --disable-overlap-schedule)")
    assert all(c["change"] > 0.2 for c in doc["levels"])


def test_other_hardware_is_not_comparable(capsys):
    rc, out, _ = run(capsys, HEALTHY_TINY, GPU / "h200-sglang-0.5.17" / "suite-run-cut.json")
    assert rc == 0
    assert "NOT COMPARABLE: other hardware class: A 1 x NVIDIA H100 80GB HBM3, B 1 x NVIDIA H200" in out
    assert "SLOWER:" not in out and "NO CHANGE" not in out


def test_a_run_whose_output_canary_failed_has_no_speed(capsys, tmp_path):
    a, b = run_doc("a", {8: result(8, value=1000.0)}), run_doc("b", {8: result(8, value=500.0)})
    from sglperf.store.rundoc import CanaryDoc

    b.configs["rr24-cds4"].canary = CanaryDoc(outputs=[], outcome="degenerate")
    for doc in (a, b):
        (tmp_path / f"{doc.run_id}.json").write_text(doc.model_dump_json())
    rc, out, _ = run(capsys, tmp_path / "a.json", tmp_path / "b.json")
    assert rc == 0 and "NOT COMPARABLE: output canary failed (rr24-cds4: degenerate)" in out


@pytest.mark.parametrize("args, said", [
    (["missing.json", str(HEALTHY_TINY)], "missing.json"),
    ([str(HEALTHY_TINY), str(HEALTHY_TINY), "--config", "rr64"], "--config rr64: not a config of both runs"),
    ([str(HEALTHY_TINY), str(HEALTHY_TINY), "--plot", "/nonexistent-dir/x.png"], "--plot"),
])
def test_bad_input_is_named(capsys, args, said):
    rc, _, err = run(capsys, *args)
    assert rc == 2 and said in err


@pytest.mark.parametrize("low, high, verdict", [
    (-0.20, -0.08, rule.SLOWER),
    (-0.07, -0.01, rule.SLOWER),  # sure it is slower, and it may reach past the margin
    (-0.03, -0.01, rule.NO_CHANGE),  # real but immaterial: inside the margin
    (-0.04, 0.04, rule.NO_CHANGE),
    (-0.09, 0.02, rule.UNDECIDED),
    (0.01, 0.09, rule.FASTER),
])
def test_the_verdict_by_the_interval_and_the_margin(low, high, verdict):
    assert rule.verdict((low + high) / 2, low, high, 0.05) == verdict


def test_between_start_noise_widens_the_interval():
    a, b = rule.Side(1000.0, 10.0, 1), rule.Side(900.0, 9.0, 1)
    own = rule.change("x", "c8", a, b, None)
    both = rule.change("x", "c8", a, b, Noise(cv=0.05, df=20.0, within=0.005, runs=6))
    assert own.verdict == rule.SLOWER and not own.between_known
    assert both.high - both.low > 3 * (own.high - own.low) and both.between_known


GLM = GPU / "h100-sglang-0.5.17-glm-slowdowns"


@pytest.mark.parametrize("slowed, flag, c32, c64", [
    ("cg8-20261207-045913-1c4f7b.json", "--cuda-graph-max-bs-decode=8", "-80.5%", "-84.7%"),
    ("no-overlap-20261207-050228-49d6ef.json", "--disable-overlap-schedule", "-26.7%", "-27.2%"),
])
def test_the_glm_shaped_moe_slowed_by_a_deployment_flag_is_slower_at_both_levels_naming_it(capsys, slowed, flag,
                                                                                            c32, c64):
    """Real SGLang 0.5.17 serving the GLM-shaped MoE on one H100 start, three runs back to back: healthy, then with a
    smaller CUDA-graph batch, then without the overlap scheduler (which a GPU-bound shape needs: the tiny model ran
    44% faster without it)."""
    rc, out, _ = run(capsys, GLM / "healthy-20261207-045647-5a46d5.json", GLM / slowed)
    assert rc == 1
    assert "rr16 c32: A 4,478.1 ± 2.6% (1 start)" in out and f"{c32} (95%:" in out and f"{c64} (95%:" in out
    assert out.count("SLOWER: all of the interval below zero") == 2
    assert f"server_args (+ {flag})" in out
