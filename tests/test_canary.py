"""The output canary: degenerate outputs, known answers and changes since the baseline, decided from what the
server gave for a few greedy prompts."""

import pytest

from sglperf.judge.canary import CanaryRules, check_canary
from sglperf.records import CanaryOutput

RULES = CanaryRules(max_top_share=0.9, min_distinct=2, compare_tokens=8)


def out(ids=None, text=None):
    return CanaryOutput((1, 2, 3), None, tuple(ids) if ids is not None else None, text, 0.01)


GOOD = [out(range(100, 116), " ".join(f"t{i}" for i in range(100, 116)))]


def test_a_varied_output_passes():
    assert check_canary(GOOD, RULES, vocab=32000).outcome == "pass"


@pytest.mark.parametrize("ids,text,words", [
    ([0] * 16, " t0" * 16, "all one id (0) in [0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0] (16 ids)"),
    ([7] * 15 + [8], "x y", "id 7 is 15 of 16 ids (94%, limit 90%)"),
    ([5, 40000, 6, 7], "a b c d", "id 40000 outside the vocabulary [0, 32000)"),
    ([5, 6, 7], "   ", "empty text for [5 6 7] (3 ids)"),
    (None, "same same same same", "word 'same' is 4 of 4 words"),
])
def test_degenerate_outputs_are_named_with_their_tokens(ids, text, words):
    v = check_canary([out(ids, text)], RULES, vocab=32000)
    assert v.outcome == "degenerate" and words in v.failure("sim-ci/rr24-cds4"), v.problems
    assert v.failure("sim-ci/rr24-cds4").startswith("OUTPUT DEGENERATE: sim-ci/rr24-cds4: prompt 0: ")


def test_thresholds_come_from_the_rules():
    repeated = [out([7] * 15 + [8], "x y")]
    assert check_canary(repeated, CanaryRules(max_top_share=1.0, min_distinct=2), vocab=32000).outcome == "pass"


def test_a_change_in_the_first_ids_is_named_by_position_with_the_environment_change():
    want = [list(range(100, 103)) + [999] + list(range(104, 116))]
    v = check_canary(GOOD, RULES, vocab=32000, expected=want,
                     env_diff="environment changed since the baseline: driver 580.1 → 590.2")
    assert v.outcome == "changed"
    msg = v.failure("p16")
    assert msg.startswith("OUTPUT CHANGED: p16: prompt 0: output differs from the baseline's at id 3 ")
    assert "environment changed since the baseline: driver 580.1 → 590.2" in msg


def test_a_change_past_the_compared_prefix_passes():
    want = [list(range(100, 112)) + [1, 2, 3, 4]]  # ids 12..15 differ; the first 8 agree
    assert check_canary(GOOD, RULES, vocab=32000, expected=want).outcome == "pass"


def test_words_stand_in_for_ids_where_the_server_gives_none():
    v = check_canary([out(None, "w1 w2 w3 w4")], RULES, expected=[["w1", "w2", "w9", "w4"]])
    assert v.outcome == "changed" and "differs from the baseline's at word 2" in v.problems[0]


def test_a_known_answer_missed_is_output_wrong():
    v = check_canary([out([10, 11, 12], "The answer is 5")], RULES, expect=[r"\b4\b"])
    assert v.outcome == "wrong" and v.failure("glm5").startswith("OUTPUT WRONG: glm5: prompt 0: 'The answer is 5' "
                                                                  "does not match /\\b4\\b/")
