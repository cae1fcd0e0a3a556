"""Per config: throughput plateaus where the KV pool (or the admission cap) is full, as predicted from
/server_info, and the server's own numbers say which of the two it is."""

from fixtures.plugin import allure_on, evidence_on_failure, settle
from sglperf.decide import decide
from sglperf.decide.plateau import Plateau
from sglperf.report import allure as report


def test_kv_plateau(perf_config, perf_session, request):
    run = perf_config
    if allure_on(request.config):
        report.label_config(run.profile.name, run.name, f"{run.name}: KV plateau")
        report.attach_text("server command line", " ".join(run.server.display_argv) or "(external server)")
        report.attach_json("server_info.json", run.server_info)
    with evidence_on_failure(request, run):
        if allure_on(request.config):
            report.attach_curve(run, perf_session.results(run.profile.name, run.name))
        settle(decide(Plateau(tuple(perf_session.levels(run.profile))), run))
