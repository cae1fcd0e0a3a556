"""The output canary: degenerate outputs, known answers and changes since the baseline, decided from what the
server gave for a few greedy prompts."""

import dataclasses

import pytest

from sglperf.judge.canary import CanaryRules, check_canary
from sglperf.measure.client import Workload
from sglperf.measure.prompts import Prompt
from sglperf.measure.wire import CHAT, NATIVE, OPENAI
from sglperf.records import CanaryOutput, Shape

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


@pytest.mark.parametrize("wire,answer,want", [
    (NATIVE, {"text": " t5 t6", "output_ids": [5, 6], "meta_info": {}}, ((5, 6), " t5 t6")),
    (OPENAI, {"choices": [{"text": " w1 w2", "finish_reason": "length"}]}, (None, " w1 w2")),
    (CHAT, {"choices": [{"message": {"role": "assistant", "content": "4"}}]}, (None, "4")),
])
def test_each_wire_reads_its_own_non_streamed_answer(wire, answer, want):
    assert wire.answer(answer) == want


def test_a_server_that_streams_anyway_is_read_whole():
    assert OPENAI.answer_of_stream([{"choices": [{"text": " a"}]}, {"choices": [{"text": " b"}]}]) == (None, " a b")
    assert CHAT.answer_of_stream([{"choices": [{"delta": {"content": "4"}}]}]) == (None, "4")
    assert NATIVE.answer_of_stream([{"text": " t1", "output_ids": [1]}, {"text": " t1 t2", "output_ids": [1, 2]}]) \
        == ((1, 2), " t1 t2")


def test_the_greedy_request_is_the_ladders_request_not_streamed():
    w = Workload(16, 8, temperature=0.7)
    body = OPENAI.greedy(Prompt(ids=[1, 2]), dataclasses.replace(w, temperature=0.0), "m", Shape())
    assert body["stream"] is False and "stream_options" not in body and body["temperature"] == 0.0
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 8 and body["ignore_eos"] is True
