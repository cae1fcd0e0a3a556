"""Per (config, level): the sustained-throughput floor and the latency ceilings from the baseline, and request
health."""

import pytest

from fixtures.plugin import allure_on, evidence_on_failure, settle, settle_over_starts
from sglperf.environment import fingerprint
from sglperf.report import allure as report
from sglperf.categories import INFRA, INVALID
from sglperf.judge.latency import check_ceiling, over_starts, verdict_over_starts
from sglperf.records import METRICS
from sglperf.judge.starts import another_start
from sglperf.judge.floor import check_floor


def _benchmark_info(m) -> dict:
    r = m.result
    return {**{name: metric.read(r) for name, metric in METRICS.items()},
            "sustained_output_tps_ci95": r.sustained_output_tps_ci95, "achieved_concurrency": r.achieved_concurrency,
            "server_output_tps": r.server_output_tps, "errors": r.errors, "valid": r.valid,
            "invalid_reasons": list(r.invalid_reasons), "window_s": r.window_s, "completed": r.completed}


@pytest.mark.measures
def test_sustained_throughput_floor(perf_config, level, benchmark, request):
    run = perf_config
    with evidence_on_failure(request, run):
        # One round through pytest-benchmark: --benchmark-json/--benchmark-autosave/--benchmark-compare see it.
        try:
            m = benchmark.pedantic(run.measure, args=(level,), rounds=1, iterations=1, warmup_rounds=0)
        except KeyboardInterrupt:  # pytest-benchmark marks only an Exception: a round with no time would crash its
            benchmark.has_error = True  # JSON writer at the session's end, before the run file is closed
            raise
        benchmark.extra_info.update(_benchmark_info(m))
        if allure_on(request.config):
            report.label_level(run.profile.name, run.name, level, f"c{level}: sustained throughput floor")
            report.measured_parameters(m.result)
            report.attach_level(m)
        bf, path = run.baseline()
        failure = run.level_failure(m)
        if failure:
            pytest.fail(failure, pytrace=False)
        if bf is None:
            pytest.skip(f"no baseline for {run.profile.name} on hardware class {run.hardware_class!r} ({path}): "
                        f"run `pytest perf_tests --profile {run.profile.name} --update-baselines`, review the "
                        f"candidate it writes beside that path, and commit it")
        entries = {k: e for k, e in bf.entries(run.name, level).items() if not e.is_latency}
        if not entries:
            pytest.skip(f"{path} has no throughput entry for {run.name} c{level}")
        outside = run.host_outside(bf)
        if outside:  # measured and shown, neither passed nor failed: the baseline never measured this machine
            pytest.skip(f"{run.where} c{level}: floor not judged: {outside} ({path})")
        def judge(starts, last=False):
            return [check_floor(starts, e, where=f"{run.where} c{level}", baseline_source=str(path),
                                log_path=run.log_path, last=last,
                                env_diff=fingerprint.describe_diff(e.fingerprint, run.fingerprint)
                                if e.fingerprint else "") for e in entries.values()]

        def clean(starts):  # the starts nothing disturbed decide, where there are any
            return [x for x in starts if not x.result.disturbances] or starts

        def unsettled(verdicts, starts):
            disturbed = all(x.result.disturbances for x in starts)
            return any(another_start(v, len(clean(starts)), entries[v.metric], run.profile.measurement.replicates,
                                     disturbed=disturbed) for v in verdicts)

        starts, verdicts = [m], judge([m.result])
        # undecided after the level's own time, failed, passed too near its floor for one start to say, or failed
        # while the host disturbed it: measured again after a server restart, while the profile allows
        # (judge/verdict.another_start). A slow start or a disturbance passes; a regression stays (SGLang on 2
        # cores had one start read 12-19% low at every level, nothing else running)
        while unsettled(verdicts, starts):
            why = "; ".join(v.message for v in verdicts if v.outcome != "pass") or (
                f"passed the floor for {len(starts)} start(s), not yet the one for the "
                f"{run.profile.measurement.replicates} starts the profile allows")
            more = run.replicate(level, why)
            if more is None:
                break
            starts = more
            print(f"{run.where} c{level}: start {len(starts)} read {starts[-1].result.sustained_output_tps:,.1f} "
                  f"tok/s (re-measured after a server restart: {why[:200]})")
            outside = run.host_outside(bf)
            if outside:  # the restart's probe: the host's CPU changed under the run
                pytest.skip(f"{run.where} c{level}: floor not judged after {len(starts)} starts: {outside} ({path})")
            verdicts = judge([x.result for x in clean(starts)])
        if any(v.outcome == "inconclusive" for v in verdicts):  # no more starts come: decided where it can be
            verdicts = judge([x.result for x in clean(starts)], last=True)
        for x in starts[1:]:
            failure = run.level_failure(x)
            if failure:
                pytest.fail(failure, pytrace=False)
        settle_over_starts(verdicts, [x.result for x in starts], where=f"{run.where} c{level}", against="floor",
                           note=run.replicate_note(level),
                           slow_host=run.host_slower(bf))


def test_latency_ceilings(perf_config, level, perf_level, request):
    """TTFT, TPOT, ITL and E2E percentiles at or below the baseline's ceilings, decided by their intervals; past
    the KV ceiling only the decode-side latencies are judged (requests queue there by design)."""
    run, m = perf_config, perf_level
    if allure_on(request.config):
        report.label_level(run.profile.name, run.name, level, f"c{level}: latency ceilings")
    with evidence_on_failure(request, run):
        bf, path = run.baseline()
        entries = [e for e in (bf.entries(run.name, level).values() if bf else []) if e.is_latency]
        if not entries:
            pytest.skip(f"{path} holds no latency entry for {run.name} c{level} (`sglperf baseline calibrate "
                        f"--metric latency RUN_FILES...` adds them)")
        failure = run.level_failure(m)
        if failure:
            pytest.fail(failure, pytrace=False)
        outside = run.host_outside(bf)
        if outside:
            pytest.skip(f"{run.where} c{level}: latency ceilings not judged: {outside} ({path})")
        past = run.ceiling is not None and level > run.ceiling.effective

        def judge(x):
            return [check_ceiling(x.records, x.result, e, where=f"{run.where} c{level}", baseline_source=str(path),
                                  past_kv_ceiling=past,
                                  env_diff=fingerprint.describe_diff(e.fingerprint, run.fingerprint)
                                  if e.fingerprint else "") for e in entries]

        # a start that does not pass is measured again after a server restart, while the profile allows, and the
        # majority of the starts decides (judge/latency.over_starts); starts the floor re-measured count too
        allowed = run.profile.measurement.replicates
        starts = run.level_starts(level)
        per_start = [judge(starts[0])]
        decided = [over_starts([v.outcome], allowed) for v in per_start[0]]
        while any(d is None for d in decided):
            if len(per_start) < len(starts):
                x = starts[len(per_start)]
            else:
                why = "; ".join(v.message for v in per_start[-1] if v.outcome != "pass")[:300]
                more = run.replicate(level, f"latency ceiling not passed ({why})")
                if more is None:
                    break
                starts, x = more, more[-1]
                failure = run.level_failure(x)
                if failure:
                    pytest.fail(failure, pytrace=False)
            per_start.append(judge(x))
            decided = [over_starts([s[i].outcome for s in per_start], allowed) for i in range(len(entries))]
        verdicts = [verdict_over_starts([s[i] for s in per_start], d) for i, d in enumerate(decided)]
        print("\n".join(v.message for v in verdicts))
        if allure_on(request.config):
            report.attach_text("latency verdicts", "\n".join(v.message for v in verdicts))
        settle(verdicts, where=f"{run.where} c{level}", against="latency ceilings",
               disturbed=[d for x in starts[:len(per_start)] for d in x.result.disturbances], log_path=run.log_path,
               note=run.replicate_note(level))


def test_request_health(perf_config, level, perf_level, request):
    run, r = perf_config, perf_level.result
    if allure_on(request.config):
        report.label_level(run.profile.name, run.name, level, f"c{level}: request health")
    with evidence_on_failure(request, run):
        if r.incomplete:
            pytest.fail(f"{INFRA}: {run.where} c{level}: {r.note}. Server log: {run.log_path}", pytrace=False)
        bad = [rec for rec in perf_level.records if rec.error]
        examples = "; ".join(f"#{rec.index} {rec.error}: {rec.error_detail}" for rec in bad[:3])
        assert not r.errors, (f"{INVALID}: {run.where} c{level}: " + "; ".join(r.invalid_reasons)
                              + f". First failures: {examples}. Server log: {run.log_path}")
        assert r.valid, f"{INVALID}: {run.where} c{level}: " + "; ".join(r.invalid_reasons)


def test_client_matches_server_count(perf_config, level, perf_level, request):
    """The client's sustained output tok/s agrees with the server's own token counter over the same window."""
    run, r = perf_config, perf_level.result
    if allure_on(request.config):
        report.label_level(run.profile.name, run.name, level, f"c{level}: client vs server count")
    if r.incomplete or not r.valid:
        pytest.skip(f"{run.where} c{level}: no valid measurement to compare (see its floor and health tests)")
    if r.server_output_tps is None:
        pytest.skip(f"{run.where}: the server exposes no token counter (scrape source: {perf_level.scrape_source})")
    v = run.server_count(r)
    print(v.message)
    settle([v], where=f"{run.where} c{level}", against="server's count")
