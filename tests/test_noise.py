"""Between-start noise as a first-class number: a baseline pools its levels' run-to-run variances (so five runs give
many more than four degrees of freedom where the levels agree, and a level that stands apart keeps its own), keeps
the calibration runs' within-run part apart, and says the smallest drop each floor catches."""

import json
import subprocess
import sys

import numpy as np
import pytest

from sglperf.judge.noise import MAX_DF, Noise, moderate, prior
from sglperf.record import baselines

from . import rundocs


def runs_of(level_cvs: dict[int, float], n: int, seed: int = 3, ci: float = 0.005):
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        levels = {}
        for lv, cv in level_cvs.items():
            value = 1000.0 * lv * (1 + rng.normal(0, cv))
            levels[lv] = rundocs.result(lv, value=value, ci=value * ci)
        docs.append(rundocs.run_doc(f"r{i}", levels))
    return docs


def test_levels_that_agree_pool_their_variances():
    bf, notes = baselines.calibrate(runs_of({lv: 0.02 for lv in (8, 16, 24, 32, 64, 96)}, n=5), isl=32, osl=32)
    entries = [m["sustained_output_tps"] for lvls in bf.configs.values() for m in lvls.values()]
    assert all(e.noise_df > 4 for e in entries), "pooled: more than the n - 1 = 4 a level has alone"
    assert bf.pooled[0].levels == 6 and bf.pooled[0].cv == pytest.approx(0.02, rel=0.5)
    assert any("caught with 95% power" in n for n in notes)


def test_a_level_that_stands_apart_keeps_most_of_its_own_variance():
    cvs = {8: 0.01, 16: 0.01, 24: 0.01, 32: 0.01, 64: 0.08, 96: 0.01}
    bf, _ = baselines.calibrate(runs_of(cvs, n=5, seed=5), isl=32, osl=32)
    e = {int(lv): m["sustained_output_tps"] for lv, m in bf.configs["rr24-cds4"].items()}
    assert e[64].noise_cv > 3 * e[8].noise_cv, "the noisy level is not pooled down to its quiet neighbours"
    assert e[64].tolerance > e[8].tolerance


def test_the_prior_is_worth_nothing_with_too_few_levels_and_everything_where_they_agree():
    assert prior([0.0004, 0.0009], [4, 4])[1] == 0.0
    s0, d0 = prior([0.0004] * 8, [4] * 8)
    # (a sample variance's log is biased low by psi(d/2) - log(d/2): the prior's centre sits a little above)
    assert d0 == MAX_DF and 0.0004 <= s0 <= 0.0006
    assert moderate(0.01, 4, 0.0004, 0.0) == (0.01, 4)


def test_the_within_run_part_is_not_between_start_noise():
    n = Noise(cv=0.03, df=20, within=0.01, runs=5)
    assert n.between == pytest.approx(np.sqrt(0.03 ** 2 - 0.01 ** 2))
    assert n.tolerance(2) < n.tolerance(1), "two starts averaged: a tighter floor"
    assert n.detectable(1) > n.tolerance(1)


def test_how_many_runs_a_drop_needs_or_that_no_number_will_do():
    quiet = Noise(cv=0.01, df=4, within=0.002, runs=5)
    assert quiet.runs_for(quiet.detectable() - 0.002) > 5
    loud = Noise(cv=0.05, df=4, within=0.0, runs=5)
    assert loud.runs_for(0.10) is None, "between-start noise of 5% alone keeps a 10% drop out of reach in one start"
    assert loud.detectable(starts=4) < loud.detectable(starts=1)


def test_calibrate_refuses_one_run_given_twice_and_an_unfinished_run(tmp_path):
    docs = runs_of({8: 0.01, 16: 0.01}, n=2)
    files = []
    for d in docs:
        f = tmp_path / f"{d.run_id}.json"
        f.write_text(d.model_dump_json())
        files.append(str(f))
    twice = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", files[0], files[0],
                            "--dry-run"], capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "run r0 is given twice" in twice.stderr, twice.stderr
    raw = json.loads(docs[1].model_dump_json())
    raw.update(status="interrupted", complete=False)
    (tmp_path / "r1.json").write_text(json.dumps(raw))
    cut = subprocess.run([sys.executable, "-m", "sglperf.cli", "baseline", "calibrate", *files, "--dry-run"],
                         capture_output=True, text=True, timeout=60)
    assert cut.returncode == 2 and "run r1 is interrupted and incomplete: only finished runs" in cut.stderr
