"""Against the simulator's ci preset, the client's sustained output tok/s agrees with the server's own count over
the same window within 1% at every level of a ladder that crosses the KV ceiling (48 requests)."""

import asyncio

import pytest

from sglperf import engines
from sglperf.run import profiles
from sglperf.judge.plateau import check_plateau
from sglperf.measure.client import Target, Workload
from sglperf.measure.level import LevelSpec, measure_level
from sglperf.measure.metrics import MeasurementPolicy
from sglperf.records import Ceiling

LADDER = [4, 16, 48, 96]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    from sglperf.run.launch import LaunchSpec, launch

    from .conftest import SIM

    srv = launch(LaunchSpec("sim", [*SIM, "--preset", "ci", "--random-seed", "3", "--enable-metrics"],
                            tmp_path_factory.mktemp("logs"), launch_timeout_s=30))
    try:
        async def run():
            out = []
            for i, c in enumerate(LADDER):
                m = await measure_level(Target(srv.url), Workload(32, 32, seed=i), LevelSpec(concurrency=c,
                                        max_seconds=40), MeasurementPolicy(ci_target=0.02), engine=engines.get("sim"))
                out.append(m)
            return out

        yield asyncio.run(run())
    finally:
        assert not srv.stop().survivors


@pytest.mark.parametrize("i", range(len(LADDER)), ids=[f"c{c}" for c in LADDER])
def test_client_sustained_matches_the_servers_count(ladder, i):
    m = ladder[i]
    r = m.result
    assert m.scrape_source == "metrics"
    assert r.valid, r.invalid_reasons
    print(f"c{r.concurrency}: client {r.sustained_output_tps:.1f} tok/s, server {r.server_output_tps:.1f}, "
          f"ratio {r.server_ratio:.4f}")
    assert abs(r.server_ratio - 1) <= 0.01


def test_the_plateau_shows_on_the_server_side(ladder):
    at_ceiling, past = ladder[2].result, ladder[3].result
    assert past.server_max_running <= 48
    assert past.server_mean_queued > 0
    # not violated as the suite judges a plateau (plateau.check_plateau, sim-ci's band): a fixed 7% on point values
    # went red on a 2-core Intel Xeon CI host, 2026-12-03 (c96 2,832.6 against c48 2,615.6)
    ceiling = Ceiling(kv=48, cap=None, effective=48, binding="kv", tokens_per_request=64)
    v = check_plateau({48: at_ceiling, 96: past}, ceiling, band=profiles.load("sim-ci").measurement.plateau_band)
    assert v.outcome != "violated", v.message
