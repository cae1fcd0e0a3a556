"""Per profile: the tuned config is not worse than the base config at any level, and gains where the base
config's cap binds (the seed: +28% at 2048)."""

import pytest

from fixtures.plugin import allure_on
from sglperf import report
from sglperf.verdict import check_ab


def test_config_ab(perf_profile, perf_session, request):
    prof = perf_session.profile(perf_profile)
    if allure_on(request.config):
        import allure

        allure.dynamic.epic(prof.name)
        allure.dynamic.feature("A/B")
        allure.dynamic.title(f"A/B: {prof.ab.tuned if prof.ab else '?'} vs {prof.ab.base if prof.ab else '?'}")
    if prof.ab is None:
        pytest.skip(f"profile {prof.name} declares no [ab] pair")
    runs = {name: perf_session.runs.get((prof.name, name)) for name in (prof.ab.base, prof.ab.tuned)}
    levels = perf_session.levels(prof)
    missing = [f"{c} c{lv}" for c in runs for lv in levels
               if (prof.name, c, lv) not in perf_session.measurements]
    if missing or not all(runs.values()):
        pytest.skip(f"A/B needs both configs measured in this session; missing: {', '.join(missing) or 'servers'}")
    res = {c: {lv: perf_session.measurements[(prof.name, c, lv)].result for lv in levels} for c in runs}
    invalid = [f"{c} c{lv}" for c in res for lv, r in res[c].items() if not r.valid]
    if invalid:
        pytest.fail(f"INVALID MEASUREMENT: cannot judge the A/B, invalid levels: {', '.join(invalid)}", pytrace=False)
    base, tuned = runs[prof.ab.base], runs[prof.ab.tuned]
    if base.ceiling is None or tuned.ceiling is None:
        pytest.skip("A/B needs each config's ceiling from /server_info")
    cvs = {}
    bf, _ = base.baseline()
    for c in (prof.ab.base, prof.ab.tuned):  # run-to-run noise the baseline measured, where calibrated
        cvs[c] = {lv: e.noise_cv for lv in levels
                  if bf and (e := bf.entries(c, lv).get("sustained_output_tps")) and e.noise_cv is not None}
    v = check_ab(res[prof.ab.base], res[prof.ab.tuned], base.ceiling, tuned.ceiling,
                 margin=prof.measurement.ab_margin, base_cv=cvs[prof.ab.base], tuned_cv=cvs[prof.ab.tuned])
    rec = perf_session.recorder(prof)
    rec.doc["ab"] = {"base": prof.ab.base, "tuned": prof.ab.tuned, "passed": v.passed, "gains": v.gains,
                     "lines": list(v.lines), "problems": list(v.problems)}
    rec.flush()
    print("\n".join(v.lines))
    if allure_on(request.config):
        report.attach_text("A/B per level", "\n".join(v.lines + v.problems))
    assert v.passed, f"THROUGHPUT REGRESSION (A/B): {prof.ab.tuned} vs {prof.ab.base}:\n" + "\n".join(
        v.lines) + "\n" + "; ".join(v.problems)
