"""Per (config, level): the sustained-throughput floor and the latency ceilings from the baseline, request health,
the client's count against the server's, and (a workload that shares prefixes: a shared prefix, conversations, a
trace) the prefix cache's share."""

import pytest

from fixtures.plugin import allure_on, benchmark_round, evidence_on_failure, judge_level, settle
from sglperf.decide import decide
from sglperf.decide.count import ServerCount
from sglperf.decide.floor import Floor, LatencyCeilings
from sglperf.decide.health import RequestHealth
from sglperf.decide.prefix import PrefixCache
from sglperf.report import allure as report
from sglperf.records import level_name


@pytest.mark.measures
def test_sustained_throughput_floor(perf_config, level, benchmark, request):
    run = perf_config
    with evidence_on_failure(request, run):
        m = benchmark_round(benchmark, run.measure, level)
        if allure_on(request.config):
            report.label_level(run.profile.name, run.name, level, f"{level_name(level)}: sustained throughput floor")
            report.measured_parameters(m.result)
            report.attach_level(m)
        settle(decide(Floor(level), run), attach="floor", request=request)


def test_latency_ceilings(perf_config, level, perf_level, request):
    judge_level(request, perf_config, level, "latency ceilings", LatencyCeilings(level), attach="latency verdicts")


def test_request_health(perf_config, level, perf_level, request):
    judge_level(request, perf_config, level, "request health", RequestHealth(level))


def test_client_matches_server_count(perf_config, level, perf_level, request):
    run = perf_config
    if allure_on(request.config):
        report.label_level(run.profile.name, run.name, level, f"{level_name(level)}: client vs server count")
    settle(decide(ServerCount(level), run))


@pytest.mark.workload("shared_prefix", "multi_turn", "trace")
def test_prefix_cache(perf_config, level, perf_level, request):
    judge_level(request, perf_config, level, "prefix cache", PrefixCache(level))
