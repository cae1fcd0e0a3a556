"""Between-start noise as a first-class number: a baseline pools its levels' run-to-run variances (so five runs give
many more than four degrees of freedom where the levels agree, and a level that stands apart keeps its own), keeps
the calibration runs' within-run part apart, and says the smallest drop each floor catches."""

import dataclasses
import json
import re
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

from sglperf.judge.noise import MAX_DF, Noise, moderate, prior
from sglperf.store import baselines
from sglperf.judge import calibration
from sglperf.judge.noise import of as noise_of

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
    bf, notes = calibration.calibrate(runs_of({lv: 0.02 for lv in (8, 16, 24, 32, 64, 96)}, n=5), isl=32, osl=32)
    entries = [m["sustained_output_tps"] for lvls in bf.configs.values() for m in lvls.values()]
    assert all(e.noise_df > 4 for e in entries), "pooled: more than the n - 1 = 4 a level has alone"
    assert bf.pooled[0].levels == 6 and bf.pooled[0].cv == pytest.approx(0.02, rel=0.5)
    assert any("caught with 95% power" in n for n in notes)


def test_a_level_that_stands_apart_keeps_most_of_its_own_variance():
    cvs = {8: 0.01, 16: 0.01, 24: 0.01, 32: 0.01, 64: 0.08, 96: 0.01}
    bf, _ = calibration.calibrate(runs_of(cvs, n=5, seed=5), isl=32, osl=32)
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


def _host_runs(rng, host_sd, start_sd, hosts=4, per_host=3, levels=6):
    """Runs of one profile from `hosts` machines (their fingerprints' host_id), each machine's levels offset alike."""
    mu = rng.uniform(500, 3000, levels)
    docs = []
    for h in range(hosts):
        offset = rng.normal(0, host_sd)
        for i in range(per_host):
            docs.append(rundocs.run_doc(f"h{h}r{i}", {8 * (j + 1): rundocs.result(
                8 * (j + 1), value=float(m * (1 + offset) * (1 + rng.normal(0, start_sd))), ci=1.0)
                for j, m in enumerate(mu)}, fingerprint={"driver": "575.51", "host_id": f"host{h}"}))
    return docs


def test_calibrate_tells_the_hosts_part_of_the_noise_and_a_floor_over_starts_keeps_it():
    """Twelve runs from four machines that differ by 3% while restarts on one differ by 1%: calibrate finds most of
    the between-start noise stays with the host (from the fingerprints' host_id), and the tolerance for three
    starts shrinks only by the restart part, not to a third of the variance."""
    rng = np.random.default_rng(3)
    docs = _host_runs(rng, host_sd=0.03, start_sd=0.01)
    bf, notes = calibration.calibrate(docs, isl=32, osl=32, starts=3)
    assert any(n.startswith("hosts: 4 (host0: 3 runs") for n in notes)
    e = bf.entries("rr24-cds4", 8)["sustained_output_tps"]
    n = noise_of(e)
    assert e.hosts == 4 and 0.015 < n.host <= n.cv
    blind = Noise(n.cv, n.df, n.within, n.runs)  # the same noise with its host part unknown
    assert n.tolerance(3) > blind.tolerance(3) and n.tolerance(3) > 0.8 * n.tolerance(1)
    assert "over the 3 starts the profile allows" in e.note


def test_one_start_with_a_wide_interval_does_not_tighten_the_floor():
    """Eight runs 3% apart: one whose start read with a ±26% interval (a mode change in its window, its value
    ordinary) is that start's trouble. Counted at full weight its SE made the within-run part most of the noise and
    the floor's tolerance small; each SE counts at most the run-to-run CV, in calibrate and in extend."""
    docs = _host_runs(np.random.default_rng(6), host_sd=0.0, start_sd=0.03, hosts=8, per_host=1)
    plain, _ = calibration.calibrate(docs, isl=32, osl=32)
    wide = docs[3].configs["rr24-cds4"].levels["8"]
    wide.sustained_output_tps_ci95 = 0.26 * wide.sustained_output_tps
    with_wide, _ = calibration.calibrate(docs, isl=32, osl=32)
    tol = [b.entries("rr24-cds4", 8)["sustained_output_tps"].tolerance for b in (plain, with_wide)]
    assert tol[1] >= 0.85 * tol[0]
    later = _host_runs(np.random.default_rng(7), host_sd=0.0, start_sd=0.03, hosts=1, per_host=2)
    for i, d in enumerate(later):
        d.run_id = f"later{i}"
        for lv, r in d.configs["rr24-cds4"].levels.items():
            r.sustained_output_tps = plain.entries("rr24-cds4", int(lv))["sustained_output_tps"].value
    later[0].configs["rr24-cds4"].levels["8"].sustained_output_tps_ci95 = 0.26 * later[0].configs[
        "rr24-cds4"].levels["8"].sustained_output_tps
    grown, _ = calibration.extend(plain, later)
    assert grown.entries("rr24-cds4", 8)["sustained_output_tps"].tolerance >= 0.85 * tol[0]


def test_hosts_named_on_the_command_line_and_runs_that_do_not_say():
    rng = np.random.default_rng(4)
    docs = _host_runs(rng, host_sd=0.03, start_sd=0.01, hosts=2)
    for d in docs:
        d.fingerprint.pop("host_id")
    bf, notes = calibration.calibrate(docs, isl=32, osl=32)
    assert any("hosts: not known for every run" in n for n in notes)
    assert bf.entries("rr24-cds4", 8)["sustained_output_tps"].hosts is None
    labels = {d.run_id: d.run_id[:2] for d in docs}
    bf, notes = calibration.calibrate(docs, isl=32, osl=32, hosts=labels)
    assert bf.entries("rr24-cds4", 8)["sustained_output_tps"].hosts == 2


def test_calibrate_refuses_a_host_label_for_a_run_it_was_not_given(tmp_path):
    rng = np.random.default_rng(5)
    paths = []
    for d in _host_runs(rng, host_sd=0.0, start_sd=0.01, hosts=1, per_host=2, levels=3):
        p = tmp_path / f"{d.run_id}.json"
        p.write_text(d.model_dump_json())
        paths.append(str(p))
    out = subprocess.run([sys.executable, "-m", "sglperf", "baseline", "calibrate", *paths, "--dry-run",
                          "--host", "a:nosuchrun", "--file", str(tmp_path / "b.json")], capture_output=True, text=True)
    assert out.returncode == 2 and "--host 'a:nosuchrun': no run 'nosuchrun' among the runs given" in out.stderr


def test_extend_grows_a_baseline_by_later_runs_and_says_when_they_refute_its_noise(tmp_path):
    """A baseline whose calibration runs' files are gone grows by runs made since: its entries count as their runs.
    Runs that keep to its noise leave the tolerance about where it was; runs from hosts that read the level apart
    widen it, and the note says the new runs are outside the noise it had. A run already calibrated is refused."""
    rng = np.random.default_rng(7)
    old, _ = calibration.calibrate(_host_runs(rng, host_sd=0.005, start_sd=0.01), isl=32, osl=32, starts=3)
    e0 = old.entries("rr24-cds4", 8)["sustained_output_tps"]
    same = _host_runs(np.random.default_rng(8), host_sd=0.005, start_sd=0.01, hosts=3, per_host=2)
    for i, d in enumerate(same):  # the same machines' levels: means of the first calibration's
        d.run_id = f"s{i}"
        for lv, r in d.configs["rr24-cds4"].levels.items():
            base = old.entries("rr24-cds4", int(lv))["sustained_output_tps"].value
            r.sustained_output_tps = base * (1 + rng.normal(0, 0.01))
    kept, notes = calibration.extend(old, same, starts=3)
    e1 = kept.entries("rr24-cds4", 8)["sustained_output_tps"]
    assert e1.runs == e0.runs + 6 and e1.noise_df > e0.noise_df
    assert e1.noise_cv == pytest.approx(e0.noise_cv, rel=0.35)
    assert e1.value == pytest.approx((12 * e0.value + sum(
        d.configs["rr24-cds4"].levels["8"].sustained_output_tps for d in same)) / 18, abs=0.01)
    assert e0.source in e1.source and all(d.run_id in e1.source for d in same)
    wide = _host_runs(np.random.default_rng(9), host_sd=0.0, start_sd=0.0, hosts=3, per_host=2)
    for i, d in enumerate(wide):  # half of them 8% low at every level: a state the calibration never saw
        for lv, r in d.configs["rr24-cds4"].levels.items():
            base = old.entries("rr24-cds4", int(lv))["sustained_output_tps"].value
            r.sustained_output_tps = base * (0.92 if i % 2 else 1.0)
        d.run_id = f"w{i}"
    grown, notes = calibration.extend(old, wide, starts=3)
    e2 = grown.entries("rr24-cds4", 8)["sustained_output_tps"]
    assert e2.noise_cv > 2 * e0.noise_cv and e2.tolerance > e0.tolerance
    line = next(n for n in notes if n.startswith("rr24-cds4 c8:"))
    assert "-8.0%" in line and "F p = " in line and float(line.split("F p = ")[1].split(")")[0]) < 0.01
    with pytest.raises(baselines.BaselineError, match="already in the baseline's calibration"):
        calibration.extend(old, _host_runs(np.random.default_rng(1), 0.0, 0.01, hosts=1, per_host=1))


def test_restarts_inside_a_run_average_only_their_own_part_of_the_between_start_noise():
    """p32 c128 on the H200: run to run 4.1% on one host, 1.9% between a run's restarts. A floor over three starts
    keeps all but the restarts' part whole; a baseline that never measured restarts divides all but the host's."""
    from sglperf.judge.noise import restart_share

    old, kept = Noise(0.04, 36, runs=34), Noise(0.04, 36, runs=34, restart=0.019)
    assert kept.spread(1) == pytest.approx(old.spread(1))
    assert kept.spread(3) ** 2 == pytest.approx(0.04 ** 2 - 0.019 ** 2 + 0.019 ** 2 / 3 + 0.04 ** 2 / 34)
    assert old.spread(3) ** 2 == pytest.approx(0.04 ** 2 / 3 + 0.04 ** 2 / 34)
    assert kept.tolerance(3) > old.tolerance(3) and kept.detectable(3) > old.detectable(3)
    assert Noise(0.04, 36, runs=34, restart=0.10).parts() == pytest.approx((0.0, 0.04 ** 2))  # capped at between
    # three starts of 2,217.6, 2,186.7 and 2,305.0 (own SE 1.1%) and a pair that agree: what restarts draw afresh
    sd, df = restart_share([[(2217.6, 0.011), (2186.7, 0.017), (2305.0, 0.013)], [(1500.0, 0.005), (1500.0, 0.005)],
                            [(1000.0, 0.01)]])
    assert df == 3 and 0.015 < sd < 0.025
    assert restart_share([[(1000.0, 0.01)]]) is None


def test_the_h200_baseline_on_later_runs_passes_healthy_hosts_and_fails_a_planted_ten_percent():
    """The committed gpu1 baseline (20 runs on 9 hosts, extended by 14 healthy judged runs of 2026-12-02 to 04 on 7
    more) judging five of its calibration runs of 2026-12-02 and a run with 4 idle layers (+12.5% layer work), each
    level over the clean starts it recorded, as at its last start (`?`: undecided, a regression otherwise). Healthy:
    no level regresses. p32 c128 of host 383f094197cf's first run (2,246, 2,234 and 2,332 over three starts, the
    server's CPU time per token 14% above the same host's next run) failed against the 20-run baseline, whose noise
    took restarts as fresh draws; it passes now that the floor keeps what stays with a run (judge/noise.restart).
    p16 c8 of a one-start run is undecided: its lockstep-counted interval (±3.2%) is wider than its floor's 3.1%
    (live, the level is measured again after a restart). The planted slowdown fails at least four of its six
    levels. The six runs judged live, three in a row on each of two fresh hosts, pass; the slowed one fails."""

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-02"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))

    def failing(path):
        return failing_floors(path, bf)

    healthy = {p.name[9:15]: failing(p) for p in sorted(data.glob("20261202-*.json"))}
    assert healthy == {"023025": [], "024117": ["p16 c8?"], "025136": [], "054238": [], "054655": []}
    assert len(failing(next(data.glob("idle4-*.json")))) >= 4
    # three runs judged against it on a fresh host (00d3737c2478), in a row, and three more on another
    # (640030ab0495) after plateau levels stop once narrow enough for the band: green live, no regression here (the
    # third's p16 c8 stopped on one start, decided live against the floor of then, 3.9%)
    assert [failing(p) for p in sorted(data.glob("judged-*.json"))] == [[], [], ["p16 c8?"], [], [], []]
    # the documented slowed run on that host (--ubatch-size 8), its one level over three starts
    assert failing(next(data.glob("slowed-*.json"))) == ["p16 c64"]


def test_h200_levels_the_hypervisor_disturbed_are_invalid_never_regressions_and_real_drops_still_fail():
    """Five runs of 2026-12-04 on one fresh host (kernel v1252) whose hypervisor stole up to 1.08 cores of the 3-4
    the p32 levels wanted from its second run on; each level settled as test_sustained_throughput_floor settles it
    at its last start. Run 1 (quiet) passes everywhere. Run 2's p32 c128 had starts 1 and 3 disturbed and its one
    undisturbed start (4.6% stolen, just under its limit) straddled the floor: live INCONCLUSIVE, as if a longer level
    could have decided; it is INVALID naming both starts. Run 3 (cut by the device call) had every p32 start
    disturbed: INVALID, not the regressions its means read. The documented slowed run and the planted 4 idle layers
    (about -10%) still fail as regressions wherever an undisturbed start decided."""
    from sglperf.decide.settle import settle_over_starts
    from sglperf.judge.floor import check_floor
    from sglperf.store.rundoc import load_run

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-04"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))

    def settled(name):
        return settle_floors(next(data.glob(name)), bf)

    assert set(settled("judged-*-042471.json").values()) == {"pass"}
    second = settled("judged-*-68720d.json")
    assert [k for k, m in second.items() if m != "pass"] == ["p32 c128"]
    assert second["p32 c128"].startswith("INVALID MEASUREMENT: p32 c128 cannot be judged against its floor: the "
                                         "host disturbed the server starts not counted (start 1: disturbed: the "
                                         "hypervisor stole 0.71 cores")
    assert "; start 3: disturbed: the hypervisor stole 0.19 cores" in second["p32 c128"]
    assert "2,271.5 ± 206.2" in second["p32 c128"]
    cut = settled("judged-*-2aac97.json")
    assert {k for k, m in cut.items() if m != "pass"} == {"p32 c8", "p32 c64"}
    # p32 c8: every start disturbed, INVALID; p32 c64's second start was cut mid-level by the device call: the real
    # loop calls that INFRASTRUCTURE naming the interruption, as the live run would have (a copy of the loop had
    # judged the cut start's numbers)
    assert cut["p32 c8"].startswith("INVALID MEASUREMENT")
    assert cut["p32 c64"].startswith("INFRASTRUCTURE: p32 c64: interrupted before the level finished")
    assert settled("slowed-*.json")["p16 c64"].startswith("THROUGHPUT REGRESSION")
    # its two disturbed starts alone (16% and 9% of the CPU stolen) read -69%: more than any such steal explains
    c = load_run(next(data.glob("slowed-*.json"))).configs["p16"]
    disturbed = [c.levels["64"], c.replicates["64"][0]]
    v = check_floor(disturbed, bf.entries("p16", "64")["sustained_output_tps"], where="p16 c64", baseline_source="b",
                    log_path=None, last=True)
    o = settle_over_starts([v], disturbed, where="p16 c64", against="floor")
    assert o.kind == "fail" and re.match(r"^THROUGHPUT REGRESSION: p16 c64: .*-6\d\.\d% vs baseline.*\n"
                                         r"\(every start was disturbed, and steal alone disturbed them: the hypervisor "
                                         r"took at most 16%", o.message, re.S)
    planted = settled("planted-*.json")
    assert {k for k, m in planted.items() if m.startswith("THROUGHPUT REGRESSION")} == {
        "p16 c8", "p16 c64", "p16 c128", "p32 c8"}
    assert planted["p32 c64"].startswith("INVALID MEASUREMENT")
    assert planted["p32 c128"].startswith("INFRASTRUCTURE: p32 c128: interrupted")  # its one start, cut mid-level


def test_the_h200_p32_plateau_of_three_healthy_runs_is_decided_as_a_pass_by_its_equivalence_test():
    """Three judged runs of 2026-12-03 on a fresh host (01d59ecd4f8f), replayed as test_plateau judges them: the
    levels of the first start, then over all starts with the baseline's between-start noise where that start leaves
    it undecided. p32 c128 reads 5-8% under c64 there; with the 95% interval inside ±15% two of the three were
    INCONCLUSIVE live, with the equivalence test's 90% interval (plateau.TOST_SHARE) all three pass."""
    from sglperf.judge.plateau import check_plateau
    from sglperf.judge.starts import over_starts
    from sglperf.store.rundoc import load_run
    from sglperf.records import Ceiling, LevelResult

    def result(doc):  # a stored level as the suite held it
        return LevelResult(**{f.name: getattr(doc, f.name) for f in dataclasses.fields(LevelResult)})

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-03"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))
    outcomes = []
    for path in sorted(data.glob("judged-*.json")):
        c = load_run(path).configs["p32"]
        ceiling = Ceiling(**c.server.ceiling)
        starts = {lv: [result(x) for x in [c.levels[str(lv)], *c.replicates.get(str(lv), [])]] for lv in (64, 128)}
        v = check_plateau({lv: s[0] for lv, s in starts.items()}, ceiling, band=0.15)
        if v.outcome == "inconclusive":
            noise = {lv: noise_of(bf.entries("p32", str(lv))["sustained_output_tps"]) for lv in starts}
            v = check_plateau(over_starts(starts, noise), ceiling, band=0.15)
        outcomes.append(v.outcome)
    assert outcomes == ["pass"] * 3


def test_a_fresh_h200_host_that_slowed_within_minutes_is_no_regression_and_its_steal_is_named():
    """Three judged runs of 2026-12-04 on one fresh host (03b60be43191, kernel v1252), none of them in the
    baseline's calibration. Run 1: green live. Run 2, minutes later: live, p32 c128 was a THROUGHPUT REGRESSION,
    2,217.6, 2,186.7 and 2,305.0 over three starts (-8.9%), the floor at -5.4% for three starts as if each restart
    drew the between-start noise afresh; run 1 on the same host read 2,447.5. The baseline now keeps what stays with
    a run however often it restarts (judge/noise.Noise.restart) and, extended by 14 healthy runs on 7 more hosts,
    passes it. Run 3 (cut by the device call): the hypervisor stole 2.0-4.8% of the CPU p16 c64/c128 wanted, under
    the default 5% limit, and they read 4-7% low: live, THROUGHPUT REGRESSION at p16 c128. Judged with the profile's
    2% limit (`max_steal_share`) from the steal each start recorded, the starts it disturbed are set aside and each
    level passes on its other start (p16 c64 -2.7%, c128 -4.4%); with the 5% limit, both are regressions."""
    from sglperf.run import profiles
    from sglperf.environment.host import STEAL_REASON, steal_limit

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-04b"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))
    share = profiles.load("gpu1-llamacpp").measurement.max_steal_share

    def rejudged(s, share=share):  # the start's disturbances as the profile's steal limit names them
        h = s.host or {}
        wanted = sum(h.get(k) or 0.0 for k in ("other_cores", "client_cores", "server_cores", "steal_cores"))
        steal = h.get("steal_cores") or 0.0
        if steal > steal_limit(wanted, share) and not s.disturbances:
            return s.model_copy(update={"disturbances": [f"{STEAL_REASON} {steal:.2f} cores of the {wanted:.2f}"]})
        return s

    def settled(name, share=share):
        return settle_floors(next(data.glob(name)), bf, restate=lambda s: rejudged(s, share))

    def regressions(out):
        return [k for k, m in out.items() if m.startswith("THROUGHPUT REGRESSION")]

    first, second, cut = settled("*-9aade8.json"), settled("*-f75a21.json"), settled("*-c3d14d.json")
    assert regressions(first) == regressions(second) == regressions(cut) == []
    assert second["p32 c128"] == "pass"
    assert cut["p16 c64"] == cut["p16 c128"] == "pass"
    assert share == 0.02 and regressions(settled("*-c3d14d.json", 0.05)) == ["p16 c64", "p16 c128"]


def test_the_committed_h200_baseline_on_a_quiet_fresh_host_three_green_the_slowdowns_caught_where_it_says():
    """The live runs of 2026-12-04 against the committed baseline (restart-aware noise, 36 runs on 17 hosts), on a
    fresh quiet host (8668caec46f5, steal under 0.01 cores), replayed as each floor settled: three judged runs green
    in a row, the documented slowed run (-67.9%) a regression, and the planted 4 idle layers caught at the four
    levels whose floors catch a 10% drop (p16 c8/c64/c128, p32 c8: -7.7 to -10.2%). p32 c64 and c128 read -6.0% and
    -5.0%: inside their floors (tolerance 8.9% and 8.3%), which the baseline says catch 15-17% (docs/gpu-proof.md)."""
    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-04c"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))

    def regressions(path):
        return failing_floors(path, bf)

    assert bf.entries("p32", "128")["sustained_output_tps"].restart_cv == pytest.approx(0.019, abs=1e-4)
    assert [regressions(p) for p in sorted(data.glob("judged-*.json"))] == [[]] * 3
    assert regressions(next(data.glob("slowed-*.json"))) == ["p16 c64"]
    assert regressions(next(data.glob("planted-*.json"))) == ["p16 c8", "p16 c64", "p16 c128", "p32 c8"]


def floor_outcomes(path: Path, bf, slow_host=None, restate=None) -> dict:
    """Each floor of a stored run decided by the suite's own loop (decide.Floor over the starts it recorded, none left
    to take), as test_sustained_throughput_floor decided it live: where -> Outcome."""
    from sglperf.decide import decide
    from sglperf.decide.floor import Floor
    from sglperf.decide.replay import RecordedConfig
    from sglperf.run import profiles
    from sglperf.store.rundoc import load_run

    run, out = load_run(path), {}
    prof = profiles.load(run.profile)
    for cname in run.configs:
        ev = RecordedConfig(run, cname, bf, prof, source="b", where=cname, slow_host=slow_host, restate=restate)
        for lv in ev.levels:
            out[f"{cname} c{lv}"] = decide(Floor(lv), ev)
    return out


def settle_floors(path: Path, bf, slow_host=None, restate=None) -> dict[str, str]:
    """`floor_outcomes` in words: "pass", or the failure's (or the skip's) words."""
    return {where: "pass" if o.kind == "pass" else o.message
            for where, o in floor_outcomes(path, bf, slow_host, restate).items()}


def failing_floors(path: Path, bf) -> list[str]:
    """The levels whose floor failed (`?`: undecided), as decided live."""
    return [where + ("?" if o.message.startswith("INCONCLUSIVE") else "")
            for where, o in floor_outcomes(path, bf).items() if o.kind == "fail"]


def test_on_an_h200_host_whose_cpu_probed_a_fifth_slower_a_drop_that_share_explains_is_invalid_naming_it():
    """2026-12-04: a judged run on a host whose CPU probe read 33.5 before and after it, against 41-43 at the
    session's start, failed p16 c128 at -5.6%, nothing else named: a GPU server schedules, tokenizes and serves HTTP
    on the CPU. The fresh quiet host's runs (tests/data/gpu/h200-2026-12-04c) replayed as if probed that much slower
    than the baseline's runs: the planted slowdown's -8 to -10% lies within what such a CPU explains (INVALID, the
    host named), the slowed run's -68% does not (still THROUGHPUT REGRESSION, saying so), and what passed passes."""
    from sglperf.environment.host_speed import SlowerHost

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-04c"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))
    slow = SlowerHost(now=33.5, then=42.0, band=0.12)

    def settled(name):
        return settle_floors(next(data.glob(name)), bf, slow)

    planted = settled("planted-*.json")
    for k in ("p16 c8", "p16 c64", "p16 c128", "p32 c8"):
        assert planted[k].startswith(f"INVALID MEASUREMENT: {k} cannot be judged against its floor: this host's CPU "
                                     f"probed 20% slower than on the runs the baseline was taken on"), planted[k]
        assert "Measured: " in planted[k] and "vs baseline" in planted[k], "what it measured is still shown"
    assert planted["p32 c64"] == planted["p32 c128"] == "pass"
    slowed = settled("slowed-*.json")["p16 c64"]
    assert slowed.startswith("THROUGHPUT REGRESSION: p16 c64") and slowed.endswith(
        "may be the host's; this drop is more than that)"), slowed
    assert set(settled("judged-*-dcb516.json").values()) == {"pass"}


def test_the_h200_runs_of_2026_12_05_against_the_baseline_they_extended():
    """Live on two fresh hosts with the host CPU probe before every level (tests/data/gpu/h200-2026-12-05), replayed
    as the suite settled them. The slowed run's host probed 19% slower than the baseline's runs over its levels
    (67.8 against 83.8, band ±15%): its -69% is still a THROUGHPUT REGRESSION, saying the host's share is smaller.
    The judged run on that host probed 13% slower (just past the band: 72.6 against 83.8 / 1.15) and every floor
    passes on its undisturbed starts, so nothing needed the host's excuse. A calibration run's p32 c128 had every
    start disturbed by steal (5%, 2%, 34% of the CPU wanted): its plateau is not judged (INVALID naming the steal
    live), where before it would have compared the stolen starts."""
    from sglperf.environment import host_speed
    from sglperf.judge.plateau import check_plateau
    from sglperf.judge.starts import over_starts
    from sglperf.store.rundoc import load_run
    from sglperf.records import Ceiling, LevelResult

    data = Path(__file__).parent / "data" / "gpu" / "h200-2026-12-05"
    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))
    assert bf.host_speed.runs == 2 and bf.host_speed.score == pytest.approx(83.75, abs=0.01)

    def as_result(doc):
        return LevelResult(**{f.name: getattr(doc, f.name) for f in dataclasses.fields(LevelResult)})

    def settled(name):  # the host as the suite judged it live then: by the mean of the run's level probes
        path = next(data.glob(name))
        run = load_run(path)
        probes = [x.host_cpu_speed for c in run.configs.values()
                  for lv in c.levels for x in [c.levels[lv], *c.replicates.get(lv, [])]]
        now, _ = host_speed.summarize(probes)
        slow = host_speed.slower(now, bf.host_speed.score, bf.host_speed.cv, bf.host_speed.runs)
        return slow, settle_floors(path, bf, slow)

    slow, out = settled("slowed-*.json")
    assert slow is not None and slow.share == pytest.approx(0.19, abs=0.01)
    assert out["p16 c64"].startswith("THROUGHPUT REGRESSION: p16 c64") and "-69.2% vs baseline" in out["p16 c64"]
    assert out["p16 c64"].endswith("may be the host's; this drop is more than that)")
    slow, out = settled("judged-*.json")
    assert slow.share == pytest.approx(0.134, abs=0.002) and set(out.values()) == {"pass"}, out
    c = load_run(next(data.glob("calib-*-47f9b0.json"))).configs["p32"]
    starts = {lv: [as_result(x) for x in [c.levels[str(lv)], *c.replicates.get(str(lv), [])]] for lv in (64, 128)}
    assert all(s.disturbances for s in starts[128]) and len(starts[128]) == 3
    ceiling = Ceiling(**c.server.ceiling)
    first = check_plateau({lv: s[0] for lv, s in starts.items()}, ceiling, band=0.15)
    noise = {lv: noise_of(bf.entries("p32", str(lv))["sustained_output_tps"]) for lv in starts}
    over = check_plateau(over_starts(starts, noise), ceiling, band=0.15)
    assert first.outcome == over.outcome == "inconclusive" and not first.problems and not over.problems
    assert over.disturbed and all("c128: disturbed: the hypervisor stole" in d for d in over.disturbed)


def test_the_h200_ab_of_every_judged_run_on_a_fresh_host_passes_as_the_suite_settled_it():
    """p32 against p16 on the H200 (twice the slots: no loss below p16's cap, a gain past it), replayed from the
    judged runs of 2026-12-04 and 2026-12-05 against the committed baseline, each level as its floor judged it over
    its starts: CI leaves the CPU engines' A/B out (their gain is as large as the host's CPU), so this is where a
    real engine's A/B is judged in the suite's own tests."""
    from sglperf.judge.ab import check_ab
    from sglperf.judge.starts import judged_start, starts_judged
    from sglperf.store.rundoc import load_run
    from sglperf.records import Ceiling, LevelResult

    from sglperf.run import profiles

    bf = baselines.load(baselines.default_path("gpu1-llamacpp", "1 x NVIDIA H200"))
    margin = profiles.load("gpu1-llamacpp").measurement.ab_margin
    data = Path(__file__).parent / "data" / "gpu"
    paths = sorted(data.glob("h200-2026-12-04c/judged-*.json")) + sorted(data.glob("h200-2026-12-05/judged-2*.json"))
    assert len(paths) == 4
    outcomes = []
    for path in paths:
        run = load_run(path)
        judged, counts, noise, ceilings = {}, {}, {}, {}
        for cname in ("p16", "p32"):
            c = run.configs[cname]
            noise[cname] = {int(lv): noise_of(bf.entries(cname, lv)["sustained_output_tps"]) for lv in c.levels}
            starts = {int(lv): [LevelResult(**{f.name: getattr(x, f.name) for f in dataclasses.fields(LevelResult)})
                                for x in [c.levels[lv], *c.replicates.get(lv, [])]] for lv in c.levels}
            judged[cname] = {lv: judged_start(s, noise[cname][lv]) for lv, s in starts.items()}
            counts[cname] = {lv: starts_judged(s, noise[cname][lv]) for lv, s in starts.items()}
            ceilings[cname] = Ceiling(**c.server.ceiling)
        v = check_ab(judged["p16"], judged["p32"], ceilings["p16"], ceilings["p32"], margin=margin,
                     base_noise=noise["p16"], tuned_noise=noise["p32"], base_starts=counts["p16"],
                     tuned_starts=counts["p32"])
        outcomes.append(v.outcome)
        assert all(g > 0.3 for lv, g in v.gains.items() if lv > 16), v.lines  # past p16's cap: +40-70%
    assert outcomes == ["pass"] * 4
