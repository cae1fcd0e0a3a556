"""Wrong output that still passed (round 5): the outputs sampled during a level are read whole, against the
vocabulary, and a loop shared by several outputs is a broken server's signature. Healthy outputs recorded from real
SGLang (tests/data/outputs) never trip it; each planted class does."""

import json
from pathlib import Path

import pytest

from sglperf.judge.canary import UNDER_LOAD, CanaryRules, check_under_load

DATA = Path(__file__).parent / "data" / "outputs"
HEALTHY = json.loads((DATA / "cpu-sglang-healthy.json").read_text())["levels"]
GPU = json.loads((DATA / "h100-sglang-healthy.json").read_text())["levels"]
RULES, LENGTH, VOCAB = CanaryRules(), 16, 32000


def healthy(level: str = "rr32-c8") -> list[tuple[int, ...]]:
    return [tuple(o) for o in HEALTHY[level]]


def test_every_level_of_a_healthy_real_sglang_run_passes_though_its_random_model_loops_now_and_then():
    """The tiny random-weight Llama's greedy outputs loop on their own ids in up to 6 of a level's 7-52 samples."""
    assert sum(len(v) for v in HEALTHY.values()) == 213
    for level, outs in HEALTHY.items():
        assert check_under_load([tuple(o) for o in outs], RULES, LENGTH, VOCAB) is None, level


def test_every_level_of_healthy_real_sglang_runs_on_an_h100_passes_though_the_glm_moe_cycles_on_one_pair():
    """Random weights on a GPU: nearly every greedy output cycles on two ids from its first token, each prompt its
    own pair, except the GLM-shaped MoE's attractor (0 5709), shared by 15-25% of its outputs at every level."""
    from collections import Counter

    from sglperf.judge.canary import loop

    for level, outs in GPU.items():
        outs = [tuple(o) for o in outs]
        assert check_under_load(outs, RULES, LENGTH, VOCAB) is None, level
        if level.startswith("glm-moe-wide"):
            (pair, n), = Counter(loop(o, RULES) for o in outs).most_common(1)
            assert pair == (0, 5709) and 0.15 <= n / len(outs) <= 0.26, (level, n, len(outs))


def test_a_steady_minority_one_output_in_three_all_one_id_is_degenerate():
    outs = [tuple([7] * 32) if i % 3 == 0 else o for i, o in enumerate(healthy())]
    why = check_under_load(outs, RULES, LENGTH, VOCAB)
    assert why.startswith(UNDER_LOAD) and "loop on the same ids 7" in why, why


def test_a_late_onset_the_last_four_requests_of_a_level_is_degenerate():
    outs = healthy("rr32-c48")[:-4] + [tuple([0] * 32)] * 4
    why = check_under_load(outs, RULES, LENGTH, VOCAB)
    assert why.startswith(UNDER_LOAD) and "4 of 20 sampled outputs loop on the same ids 0" in why
    assert "outputs 17, 18, 19, 20" in why


def test_an_onset_in_the_last_two_samples_of_a_level_is_degenerate_where_no_earlier_sample_looped_on_that_id():
    """One request in 8 is sampled: on a 2-core host zeros from the 300th request on reached 2 of c16's 24 samples."""
    outs = healthy("rr32-c48")[:-2] + [tuple([0] * 32)] * 2
    why = check_under_load(outs, RULES, LENGTH, VOCAB)
    assert why == (f"{UNDER_LOAD}: the last 2 of 20 sampled outputs all loop on id 0, which no earlier output of the "
                   f"level did: the server broke partway through the level")
    assert check_under_load(healthy("rr32-c48")[:-1] + [tuple([0] * 32)], RULES, LENGTH, VOCAB) is None, "one"
    looped_before = [tuple([0] * 32)] + healthy("rr32-c48")[:-2] + [tuple([0] * 32)] * 2
    assert "onset" not in (check_under_load(looped_before, RULES, LENGTH, VOCAB) or "")


def test_a_late_onset_in_a_real_suite_run_withholds_it(tmp_path):
    """The simulator writing zeros from its 250th request on: the first level is clean, the last is not."""
    import subprocess
    import sys

    from .conftest import user_env

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim", "--perf-config",
           "rr24-cds4", "--levels", "8,16", "--server-arg=--fault-degenerate-output=250", "--reports-dir",
           str(tmp_path / "reports")]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300, env=user_env())
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "OUTPUT DEGENERATE" in out or "INVALID MEASUREMENT: sim-ci/rr24-cds4 c16: output " \
        "degenerate under load" in out, out[-3000:]
    assert "sim-ci/rr24-cds4 c8: output degenerate" not in out
    assert not (tmp_path / "reports" / "history.jsonl").exists()


def test_a_tail_gone_wrong_past_the_canarys_length_is_degenerate():
    """Only ids past the 16th were never looked at: a kernel that breaks as the KV cache grows passed."""
    outs = [o[:16] + (0,) * 16 for o in healthy()]
    assert "loop on the same ids 0 (over the whole output or its last 16 ids" in check_under_load(outs, RULES, LENGTH)


def test_a_short_cycle_shared_by_half_the_outputs_is_degenerate_and_by_a_quarter_is_not():
    """42 43 42 43 ... passed the one-id rules. A shared cycle needs half the outputs: the GLM MoE's healthy
    attractor pair reaches a quarter."""
    base = healthy("rr4-c32")
    assert "loop on the same ids 42 43" in check_under_load([tuple([42, 43] * 16)] * 10 + base, RULES, LENGTH, VOCAB)
    assert check_under_load([tuple([42, 43] * 16)] * 3 + base, RULES, LENGTH, VOCAB) is None


@pytest.mark.parametrize("bad", [32000, 10 ** 9, -1])
def test_an_id_outside_the_vocabulary_in_one_sampled_output_is_degenerate(bad):
    outs = healthy()
    outs[5] = outs[5][:10] + (bad,) + outs[5][11:]
    why = check_under_load(outs, RULES, LENGTH, VOCAB)
    assert f"1 of 52 sampled outputs hold ids outside the vocabulary [0, 32000), e.g. {bad}" in why


def test_two_outputs_on_the_same_loop_are_not_yet_a_signature():
    outs = [tuple([9] * 32)] * 2 + healthy("rr32-c2")
    assert check_under_load(outs, RULES, LENGTH, VOCAB) is None
