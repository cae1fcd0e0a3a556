"""benchmarks/nightly_time.py counts what a level costs after its stop: the drain until the requests in flight at the
stop have ended, within the suite's drain timeout (level._drain: 3 median lifetimes + 10 s)."""

import importlib.util
from pathlib import Path

import pytest

from sglperf.records import RequestRecord

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def nightly_time():
    spec = importlib.util.spec_from_file_location("nightly_time", ROOT / "benchmarks" / "nightly_time.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rec(i: int, send: float, end: float) -> RequestRecord:
    return RequestRecord(i, send, end, 128, 128, (send + 0.1, end), (1, 127))


def test_the_drain_lasts_until_the_last_request_in_flight_at_the_stop_has_ended(nightly_time):
    records = [rec(0, 0.0, 4.0), rec(1, 1.0, 5.0), rec(2, 6.0, 10.0), rec(3, 8.0, 13.5), rec(4, 11.0, 15.0)]
    # at 9.0: requests 2 (ends 10.0) and 3 (ends 13.5) are in flight; 4, sent later, is no part of this stop's drain
    assert nightly_time.drain_after(records, 9.0) == pytest.approx(4.5)
    assert nightly_time.drain_after(records, 5.5) == 0.0  # nothing in flight: the next level may start at once


def test_a_drain_is_never_counted_past_the_suites_drain_timeout(nightly_time):
    # finished lifetimes of 4 s: the suite gives up on a request still running 3 x 4 + 10 = 22 s after the stop
    records = [rec(i, float(i), i + 4.0) for i in range(5)] + [rec(5, 8.0, 100.0)]
    assert nightly_time.drain_after(records, 9.0) == pytest.approx(22.0)
