"""Per profile: the tuned config is not worse than the base config at any level, and gains where the base
config's cap binds (the seed: +28% at 2048)."""

import pytest

from fixtures.plugin import allure_on, settle
from sglperf.decide import decide
from sglperf.decide.ab import AB
from sglperf.report import allure as report


def test_config_ab(perf_profile, perf_session, request):
    prof = perf_session.profile(perf_profile)
    if allure_on(request.config):
        report.label_ab(prof)
    ev = next((r for c in prof.configs if (r := perf_session.config_run(prof.name, c.name)) is not None), None)
    if ev is None:
        pytest.skip(f"A/B needs its configs measured in this session; none of {prof.name}'s was")
    settle(decide(AB(), ev), attach="A/B per level", request=request)
