"""Per config: throughput plateaus where the KV pool (or the admission cap) is full, as predicted from
/server_info, and the server's own numbers say which of the two it is."""

from dataclasses import replace

import pytest

from fixtures.plugin import allure_on, evidence_on_failure, settle
from sglperf.report import allure as report, plots
from sglperf.categories import INFRA, INVALID
from sglperf.store.recorder import PlateauDoc
from sglperf.judge.plateau import check_plateau


def test_kv_plateau(perf_config, perf_session, request):
    run = perf_config
    if allure_on(request.config):
        report.label_config(run.profile.name, run.name, f"{run.name}: KV plateau")
        report.attach_text("server command line", " ".join(run.server.display_argv) or "(external server)")
        report.attach_json("server_info.json", run.server_info)
    with evidence_on_failure(request, run):
        if allure_on(request.config):
            attach_curve(run, perf_session)
        _check(run, perf_session)


def attach_curve(run, sess) -> None:
    """Throughput vs concurrency with floors, baseline, whole-run, peak and the ceilings, from this run."""
    results = sess.results(run.profile.name, run.name)
    if not results:
        return
    floors, base = {}, {}
    bf, _ = run.baseline()
    if bf is not None:
        for lv in results:
            e = bf.entries(run.name, lv).get("sustained_output_tps")
            if e:
                floors[lv], base[lv] = e.floor, e.value
    c = run.ceiling
    report.attach_png("throughput vs concurrency.png", plots.config_curve(
        run.where, results, floors, base, c.kv if c else None, c.cap if c else None))


def _check(run, perf_session):
    if run.ceiling is None:
        pytest.skip(f"{run.where}: the server's /server_info gives no max_total_num_tokens to predict a ceiling from")
    levels = perf_session.levels(run.profile)
    past = [lv for lv in levels if lv >= run.ceiling.effective]
    if not past or len(past) < 2:
        pytest.skip(f"{run.where}: predicted plateau at {run.ceiling.effective} ({run.ceiling.binding}); needs two "
                    f"levels at or past it, the levels are {levels}")
    results = {}
    for lv in past:
        r = run.measure(lv).result
        if r.incomplete:
            pytest.fail(f"{INFRA}: {run.where} c{lv}: {r.note}", pytrace=False)
        if run.canary_failure("plateau"):
            pytest.fail(run.canary_failure("plateau"), pytrace=False)
        if not r.valid:
            pytest.fail(f"{INVALID}: cannot judge the plateau: c{lv} is invalid: {'; '.join(r.invalid_reasons)}",
                        pytrace=False)
        results[lv] = r
    # the levels of one server start only: what differs between starts moves a start's levels together and cancels
    # in their ratios, while levels of two starts differ by it (SGLang on 2 AMD EPYC cores: c16 of one start read
    # 233 tok/s, c8 of another 334, and a plateau mixing them was "violated" by +43%)
    band = run.profile.measurement.plateau_band
    v = check_plateau(results, run.ceiling, band=band)
    beyond = [lv for lv in past if lv > run.ceiling.effective]
    compared = beyond if len(beyond) >= 2 else past
    # undecided (a ratio's interval straddles the band's edge, or the host disturbed one of its levels): all the levels
    # it compares are measured again on a fresh start, while the profile allows (llama.cpp on 2 cores ran p4 c32 at
    # 825 then 693 tok/s inside one window: ±60%, and the plateau undecided)
    while v.outcome == "inconclusive":
        why = "; ".join(v.unsure + v.disturbed)
        fresh = run.replicate_levels(compared, f"the plateau was undecided ({why[:300]})")
        if fresh is None:
            v = _over_starts(run, results, compared, band, v)
            break
        for m in fresh.values():
            failure = run.level_failure(m)
            if failure:
                pytest.fail(failure, pytrace=False)
        results = {lv: m.result for lv, m in fresh.items()}
        print(f"{run.where}: the plateau's levels c{', c'.join(map(str, compared))} measured again on server start "
              f"{run.starts} (undecided on the one before: {why[:200]})")
        v = check_plateau(results, run.ceiling, band=band)
    perf_session.recorder(run.profile).set_plateau(run.name, PlateauDoc(
        passed=v.passed, attributed_to=v.attributed_to, reference_level=v.reference_level, levels=list(v.levels_past),
        lines=list(v.lines), problems=list(v.problems), ceiling=run.ceiling.__dict__, outcome=v.outcome,
        unsure=list(v.unsure), disturbed=list(v.disturbed)))
    print(v.message)
    # a ratio the host disturbed that no fresh start could decide: INVALID naming what the host did, never a violation
    settle([v], where=run.where, against="plateau", log_path=run.log_path,
           disturbed=v.disturbed if not v.problems and not v.unsure else ())


def _over_starts(run, results, compared, band, v):
    """No start measuring the compared levels together is allowed: decide over all the starts each was measured on,
    the baseline's between-start noise in their intervals (starts.over_starts). The floors' re-measures of an H200
    run had spent its starts on c64 and c128, whose first start ran c64 in two regimes."""
    over = run.over_starts(compared)
    if over is None:
        return v
    again = check_plateau({**results, **over}, run.ceiling, band=band)
    note = (f"  undecided on one start ({'; '.join(v.unsure + v.disturbed)[:200]}); judged over all starts of "
            + ", ".join(f"c{lv} ({len(run.level_starts(lv))})" for lv in compared)
            + ", with the baseline's between-start noise")
    print(f"{run.where}: the plateau{note[1:]}")
    return replace(again, lines=(*again.lines, note))
