"""Per config: the output canary. A few fixed greedy prompts, sent at concurrency 1 before the ladder, must not give
degenerate tokens, must match the baseline's first ids on this hardware class, and must match each known answer.
Throughput from a server that returns garbage is never a pass, a history point or a baseline."""

import pytest

from fixtures.plugin import allure_on
from sglperf.categories import INFRA
from sglperf.report import allure as report


def test_output_canary(perf_config, request):
    run = perf_config
    if allure_on(request.config):
        report.label_config(run.profile.name, run.name, f"{run.name}: output canary")
    if not run.profile.canary.enabled:
        pytest.skip(f"{run.where}: the profile turns the output canary off ([canary] enabled = false)")
    if run.canary_skip:
        pytest.skip(f"{run.where}: {run.canary_skip}")
    if run.canary_error:
        pytest.fail(f"{INFRA}: {run.where}: {run.canary_error}", pytrace=False)
    v = run.canary_verdict
    took = sum(o.seconds for o in run.canary)
    print(f"{run.where}: output canary, {len(run.canary)} greedy prompts in {took:.2f} s: {v.outcome}")
    print("\n".join(v.lines))
    if allure_on(request.config):
        report.attach_text("canary outputs", "\n".join(v.lines + v.problems))
    if not v.passed:
        pytest.fail(v.failure(run.where), pytrace=False)
