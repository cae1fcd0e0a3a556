"""Per (config, level): the sustained-throughput floor from the baseline, and request health."""

import pytest

from fixtures.plugin import INFRA, INVALID, REGRESSION
from sglperf import fingerprint
from sglperf.verdict import check_floor


def _level_failure(run, m):
    """Infrastructure or invalid-measurement failure message, or None when the level can be judged."""
    r = m.result
    if r.incomplete:
        return f"{INFRA}: {run.where} c{r.concurrency}: {r.note}. Server log: {run.log_path}"
    if not r.valid:
        return (f"{INVALID}: {run.where} c{r.concurrency} cannot be trusted: " + "; ".join(r.invalid_reasons)
                + f". Server log: {run.log_path}")
    return None


def test_sustained_throughput_floor(perf_config, level, perf_level):
    run, m = perf_config, perf_level
    bf, path = run.baseline()
    failure = _level_failure(run, m)
    if failure:
        pytest.fail(failure, pytrace=False)
    if bf is None:
        pytest.skip(f"no baseline for {run.profile.name} on hardware class {run.hardware_class!r} ({path}): run "
                    f"`pytest perf_tests --profile {run.profile.name} --update-baselines`, review the candidate "
                    f"it writes beside that path, and commit it")
    entries = bf.entries(run.name, level)
    if not entries:
        pytest.skip(f"{path} has no entry for {run.name} c{level}")
    verdicts = []
    for entry in entries.values():
        env = fingerprint.describe_diff(entry.fingerprint, run.fingerprint) if entry.fingerprint else ""
        verdicts.append(check_floor(m.result, entry, where=f"{run.where} c{level}", baseline_source=str(path),
                                    log_path=run.log_path, env_diff=env))
    failed = [v for v in verdicts if not v.passed]
    assert not failed, "\n".join(v.message for v in failed)


def test_request_health(perf_config, level, perf_level):
    run, r = perf_config, perf_level.result
    if r.incomplete:
        pytest.fail(f"{INFRA}: {run.where} c{level}: {r.note}. Server log: {run.log_path}", pytrace=False)
    bad = [rec for rec in perf_level.records if rec.error]
    examples = "; ".join(f"#{rec.index} {rec.error}: {rec.error_detail}" for rec in bad[:3])
    assert not r.errors, f"{INVALID}: {run.where} c{level}: {sum(r.errors.values())} failed requests {r.errors}: " \
                         f"{examples}. Server log: {run.log_path}"
    wrong_len = [rec for rec in perf_level.records if rec.ok and rec.output_tokens != run.workload.osl]
    assert not wrong_len, f"{INVALID}: {len(wrong_len)} requests did not generate exactly {run.workload.osl} tokens"
    wrong_prompt = [rec for rec in perf_level.records if rec.ok and rec.server_prompt_tokens not in
                    (None, run.workload.isl)]
    assert not wrong_prompt, (f"{INVALID}: the server counted {wrong_prompt[0].server_prompt_tokens} prompt tokens "
                              f"for a {run.workload.isl}-token prompt ({len(wrong_prompt)} requests)")
    assert r.valid, f"{INVALID}: {run.where} c{level}: " + "; ".join(r.invalid_reasons)
