"""Verdicts on real SGLang on a GPU, replayed through the suite's own decide loop from the run files of two fresh H100
host starts (tests/data/gpu/h100-sglang-0.5.17-2026-12-06, the tiny Llama against the baseline calibrated for it):
a violation one start shows and none repeats is never declared, and a level faster than its baseline is news in the
summary and the history, never a failure."""

import json
import sys
import subprocess
from pathlib import Path

from sglperf.categories import FASTER
from sglperf.decide import decide
from sglperf.decide.floor import Floor
from sglperf.decide.plateau import Plateau
from sglperf.decide.replay import RecordedConfig, server_starts
from sglperf.run import profiles
from sglperf.store import baselines
from sglperf.store.history import read
from sglperf.store.rundoc import load_run

from .conftest import user_env

ROOT = Path(__file__).resolve().parents[1]

DATA = Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17-2026-12-06"
TINY = ROOT / "baselines" / "gpu1-sglang-tiny" / "1-x-nvidia-h100-80gb-hbm3.json"


def replay(name: str, config: str = "rr16") -> RecordedConfig:
    return RecordedConfig(load_run(DATA / name), config, baselines.load(TINY), profiles.load("gpu1-sglang-tiny"),
                          source=TINY.name)


def test_a_recorded_run_hands_its_starts_over_by_the_server_start_that_measured_them():
    """The live run's start 2 re-measured c64 alone for its floor; the plateau's own re-measure took start 3. A
    replay that paired c32's first re-measure with c64's first one compared levels of two different starts."""
    starts = server_starts(load_run(DATA / "false-violation-rr16.json").configs["rr16"])
    assert {n: sorted(v, key=int) for n, v in starts.items()} == {1: ["32", "64"], 2: ["64"], 3: ["32", "64"]}


def test_a_plateau_violation_seen_on_the_last_start_only_is_inconclusive_never_violated():
    """Live, a healthy cap (SGLang's running 15.9 and 16.0 of 16 at both levels) read c32 +47.2% over c64 on its
    third start, with no start left to repeat it, and was declared KV PLATEAU VIOLATED. The same records through the
    loop now: the violation asks for a start to repeat it, none is left, and over all its starts with the
    baseline's between-start noise it is undecided, saying which start showed it."""
    live = load_run(DATA / "false-violation-rr16.json").configs["rr16"].plateau
    assert live.outcome == "violated", "what the live run said"
    ev = replay("false-violation-rr16.json")
    o = decide(Plateau((32, 64)), ev)
    assert o.kind == "fail" and o.message.startswith("INCONCLUSIVE"), o.message
    assert "KV PLATEAU VIOLATED" not in o.message
    assert "start 3 read c32: +47.2% ± 7.8% vs c64" in o.message, o.message
    assert ev.recorded["plateau"].outcome == "inconclusive"


def test_a_level_faster_than_its_baseline_passes_and_says_so():
    """--disable-overlap-schedule made the tiny model's rr16 +41% and +54% faster (the host's Python, not the GPU,
    is its bottleneck). Both floors pass; each says the stack got faster and by how much, and the run file keeps it."""
    ev = replay("faster-no-overlap.json")
    for lv, by in ((32, "+41.4%"), (64, "+53.7%")):
        o = decide(Floor(lv), ev)
        assert o.kind == "pass", o.message
        news = [s for s in o.shown if s.startswith(FASTER)]
        assert len(news) == 1 and by in news[0] and "baseline is stale" in news[0], o.shown
        assert ev.recorded["faster"][lv] == news[0]


def test_a_level_within_its_tolerance_above_the_baseline_is_no_news():
    """The healthy judged run's levels read within the tiny baseline's tolerance: nothing to report."""
    ev = replay("false-violation-rr16.json")
    for lv in (32, 64):
        o = decide(Floor(lv), ev)
        assert not [s for s in o.shown if s.startswith(FASTER)], o.shown
    assert "faster" not in ev.recorded


def test_a_simulated_speed_up_is_in_the_summary_and_the_history_and_the_run_stays_green(tmp_path):
    """sim-ci against a baseline whose c8 floor is half of what the simulator serves: the floor passes, and the
    run's summary and its history line say the level is faster than its baseline."""
    bf = json.loads((ROOT / "baselines" / "sim-ci" / "sim-ci.json").read_text())
    entry = bf["configs"]["rr24-cds4"]["8"]["sustained_output_tps"]
    entry["value"] = round(entry["value"] / 2, 2)
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(bf))
    cmd = [sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim", "--perf-config",
           "rr24-cds4", "--levels", "8", "-k", "floor", "--baseline-file", str(path), "--reports-dir",
           str(tmp_path / "reports")]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=user_env())
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert f"    {FASTER}: sim-ci/rr24-cds4 c8: " in out, out[-3000:]
    (line,) = read(tmp_path / "reports" / "history.jsonl")
    (level,) = [lv for lv in line["levels"] if lv["level"] == 8]
    assert level["faster"].startswith(f"{FASTER}: sim-ci/rr24-cds4 c8: ")


def test_a_violation_one_start_shows_is_inconclusive_even_where_no_noise_lets_all_starts_be_judged():
    """Without a baseline's between-start noise the levels cannot be judged over all their starts: the violation
    start 3 showed stands alone, and with no start left to repeat it the plateau stays undecided, saying so."""
    run = load_run(DATA / "false-violation-rr16.json")
    ev = RecordedConfig(run, "rr16", None, profiles.load("gpu1-sglang-tiny"), source="none")
    o = decide(Plateau((32, 64)), ev)
    assert o.kind == "fail" and o.message.startswith("INCONCLUSIVE"), o.message
    assert "that violation showed on server start 3 only, and no start was left to repeat it" in o.message


def test_a_level_above_its_baseline_but_not_past_its_tolerance_is_no_news():
    """c32 at 9,900 ± 100 tok/s against 8,578.9 and a tolerance of 23.7%: above, but inside baseline x 1.237."""
    def higher(doc):
        return doc.model_copy(update={"sustained_output_tps": 9900.0, "sustained_output_tps_ci95": 100.0})

    ev = RecordedConfig(load_run(DATA / "faster-no-overlap.json"), "rr16", baselines.load(TINY),
                        profiles.load("gpu1-sglang-tiny"), source=TINY.name, restate=higher)
    o = decide(Floor(32), ev)
    assert o.kind == "pass" and not [s for s in o.shown if s.startswith(FASTER)], o.shown


def test_one_unsettled_metric_of_a_level_asks_for_another_start_though_the_others_are_settled():
    """c32's sustained output tok/s (8,404.6 on its first start) clears a floor of half the baseline for every start
    allowed: settled. Its total tok/s (16,820.2) reads below an entry of 17,000 with a 1% tolerance: a regression on
    one start, which stands only over all the starts allowed. One metric unsettled is enough to take start 2."""
    bf = baselines.load(TINY)
    out = bf.configs["rr16"]["32"]["sustained_output_tps"]
    entries = {"sustained_output_tps": out.model_copy(update={"value": 8578.88, "tolerance": 0.5, "noise_cv": None}),
               "sustained_total_tps": out.model_copy(update={"metric": "sustained_total_tps", "value": 17000.0,
                                                             "tolerance": 0.01, "noise_cv": None,
                                                             "min_tolerance": 0.01})}
    two = bf.model_copy(update={"configs": {"rr16": {"32": entries}}})
    ev = RecordedConfig(load_run(DATA / "false-violation-rr16.json"), "rr16", two, profiles.load("gpu1-sglang-tiny"),
                        source="two metrics")
    o = decide(Floor(32), ev)
    assert any("start 2 read 8,877.6 tok/s" in s for s in o.shown), o.shown
