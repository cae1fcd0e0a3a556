"""Bad input, round 5: secrets in forms round 4 missed (a password with an unencoded '/', '?' or '#', a server URL's
userinfo, an abbreviated secret flag, an API key no header can carry), impossible inputs refused before launch (a
non-finite rate, a length past any context window), each naming what it refuses and never quoting the secret."""

import subprocess
import sys
from pathlib import Path

import pytest

from sglperf import engines
from sglperf import redact as r
from sglperf.categories import UsageError
from sglperf.engines.base import check_url
from sglperf.store import fleet

from .conftest import user_env
from .test_faults import assert_clean, leaked, run_doc, suite

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("url,shown,password", [
    ("postgresql://fleet:ab/cdSEC9@db:5432/sg", "postgresql://fleet:<redacted>@db:5432/sg", "ab/cdSEC9"),
    ("postgresql://fleet:ab?cd#SEC9@db/sg", "postgresql://fleet:<redacted>@db/sg", "ab?cd#SEC9"),
    ("postgresql://fleet@db/sg?password=ab#SEC9", "postgresql://fleet@db/sg?password=<redacted>", "ab#SEC9"),
    ("http://user:pa/ss@127.0.0.1:30000", "http://user:<redacted>@127.0.0.1:30000", "pa/ss"),
])
def test_a_password_with_an_unencoded_slash_question_mark_or_hash_is_found_and_hidden_whole(url, shown, password):
    assert r.url_password(url) == password
    assert r.redact_url(url) == shown


def test_a_database_url_whose_password_holds_a_slash_is_taken_apart_without_quoting_a_piece_of_it():
    """urlsplit cut 'fleet:ab/cdSEC9@db' at the '/', read 'ab' as a port and said so ("Port could not be cast to
    integer value as 'ab'"); libpq's URI parser did the same. The password now never reaches either parser."""
    db = fleet.check_url("postgresql://fleet:ab/cdSEC9@db:5432/sg?sslmode=disable")
    assert (db.host, db.port, db.user, db.password, db.database) == ("db", 5432, "fleet", "ab/cdSEC9", "sg")
    assert db.params() == {"sslmode": "disable", "host": "db", "port": 5432, "dbname": "sg", "user": "fleet",
                           "password": "ab/cdSEC9"}
    with pytest.raises(fleet.FleetError) as e:
        fleet.check_url("postgresql://fleet:ab/cdSEC9@db:port/sg")
    assert "SEC9" not in str(e.value) and "'ab'" not in str(e.value) and "<redacted>" in str(e.value)


def test_a_server_urls_password_is_never_quoted_in_its_usage_error():
    with pytest.raises(UsageError) as e:
        check_url("http://user:SEC-URL-9@127.0.0.1:0", "--server-url")
    assert "SEC-URL-9" not in str(e.value) and "user:<redacted>@127.0.0.1:0" in str(e.value)


@pytest.mark.parametrize("argv,values", [
    (["--admin-api=SEC-A1"], ["SEC-A1"]),
    (["--ssl-keyfile-passw", "SEC-A2"], ["SEC-A2"]),
    (["--api-k=SEC-A3", "--ssl-keyfile", "/keys/server.pem"], ["SEC-A3"]),
])
def test_an_abbreviated_secret_flag_is_as_secret_as_the_flag_and_a_path_flag_it_begins_is_not(argv, values):
    """argparse servers (SGLang, the simulator) take any unambiguous abbreviation of a flag."""
    assert r.argv_secrets(argv) == values
    shown = r.redact_argv(argv)
    assert not [v for v in values if v in " ".join(shown)]
    assert [a for a in argv if a.startswith("/")] == [a for a in shown if a.startswith("/")], \
        "--ssl-keyfile is a path, a flag of its own"


@pytest.mark.parametrize("key,why", [("ab\ncd-SEC", "line break"), ("abcé-SEC", "non-ASCII"),
                                     ("ab cd-SEC", "a space")])
def test_an_api_key_no_http_header_can_carry_is_refused_before_anything_starts_and_never_shown(tmp_path, key, why):
    """The HTTP client raised InvalidHeader or UnicodeEncodeError quoting the whole key into the traceback,
    stdout and Allure. Now: a usage error (pytest exit 4) naming the variable and what is wrong."""
    p, out = suite(tmp_path, "--levels", "8", env={"SGLPERF_API_KEY": key})
    assert p.returncode == 4 and "USAGE ERROR: SGLPERF_API_KEY: the API key holds" in out, out[-2000:]
    assert why in out and "SEC" not in out
    assert not (tmp_path / "reports" / "servers").exists()


def test_an_abbreviated_secret_flag_and_a_server_url_password_leave_no_file_of_the_run_holding_them(tmp_path):
    """--admin-api=... reaches the simulator (it accepts the abbreviation, as SGLang does) and is logged by it;
    nothing the suite writes keeps the value."""
    allure = tmp_path / "allure"
    p, out = suite(tmp_path, "--levels", "8", "--alluredir", str(allure), "--server-arg=--admin-api=ADM-SEC-77")
    assert p.returncode in (0, 1), out[-2000:]
    assert run_doc(tmp_path)["configs"]["rr24-cds4"]["levels"]["8"]["valid"]
    assert leaked([tmp_path / "reports", allure], ["ADM-SEC-77"]) == [] and "ADM-SEC-77" not in out
    assert_clean(tmp_path)


@pytest.mark.parametrize("args,says", [
    (["--rates", "inf"], "rates must be finite numbers of requests per second > 0, got 'inf'"),
    (["--rates", "nan"], "rates must be finite numbers of requests per second > 0, got 'nan'"),
    (["--levels", "8", "--length-mix", "0.5,100000000,128"], "maxima from 1 to 10,000,000 tokens"),
    (["--levels", "8", "--ci-target", "0.7"], "--ci-target 0.7: input should be less than or equal to 0.5"),
    (["--levels", "8", "--ci-target", "nan"], "--ci-target nan: input should be a finite number"),
    (["--levels", "8", "--max-seconds", "inf"], "--max-seconds inf: input should be a finite number"),
    (["--rates", "5", "--max-concurrency", "1500000000"], "past the most this kernel lets any process open"),
])
def test_bench_refuses_what_no_measurement_can_be_before_it_connects(args, says):
    p = subprocess.run([sys.executable, "-m", "sglperf", "bench", "--url", "http://127.0.0.1:9", *args],
                       capture_output=True, text=True, timeout=60, env=user_env(), cwd=ROOT)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr[-1500:]


def test_a_profile_length_past_any_context_window_is_refused_naming_the_key(tmp_path):
    from sglperf.run import profiles

    src = (ROOT / "profiles" / "sim-mix.toml").read_text()
    bad = tmp_path / "huge.toml"
    bad.write_text(src.replace("isl_max = ", "isl_max = 100000000 #", 1))
    with pytest.raises(UsageError) as e:
        profiles.load(str(bad))
    assert "isl_max" in str(e.value) and "10000000" in str(e.value)


H100_METRICS = Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17" / "metrics.txt"


@pytest.mark.parametrize("bad", ['sglang:num_queue_reqs{tp_rank="0"} abc', 'sglang:num_queue_reqs{tp_rank="0 3',
                                 "sglang:gen_throughput 12.5.3"])
def test_one_malformed_sample_costs_that_sample_only_and_is_named(bad):
    """Real SGLang's /metrics page (an H100), one line broken: the other series are still read, the broken line is
    counted and quoted (the level's warnings say so), where the whole page was lost."""
    real = H100_METRICS.read_text()
    whole = engines.get("sglang").parse_metrics(real, 1.0)
    broken = real.replace("# TYPE sglang:num_running_reqs gauge\n", f"# TYPE sglang:num_running_reqs gauge\n{bad}\n")
    assert broken != real
    s = engines.get("sglang").parse_metrics(broken, 1.0)
    assert s is not None and s.unparsed_lines == 1 and s.unparsed_example == bad
    assert (s.decode_tokens_total, s.running, s.max_total_tokens) == (whole.decode_tokens_total, whole.running,
                                                                      whole.max_total_tokens)


def _final_chunk(path: Path) -> dict:
    """The last data line of a real SGLang /generate stream: its final meta_info."""
    lines = [ln[len("data: "):] for ln in path.read_text().splitlines() if ln.startswith("data: {")]
    return __import__("json").loads(lines[-1])


H100 = Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17"
NGRAM = Path(__file__).parent / "data" / "gpu" / "h100-sglang-0.5.17-third-start" / "ngram-answers"


@pytest.mark.parametrize("stream, change, said", [
    (H100 / "generate-stream.txt", {"cached_tokens": 5}, "cached_tokens 5 for a prompt of 4 tokens"),
    (H100 / "generate-stream.txt", {"cached_tokens": -1}, "cached_tokens -1"),
    (H100 / "generate-stream.txt", {"cached_tokens": "abc"}, "cached_tokens 'abc'"),
    (NGRAM / "generate-stream-ngram.txt", {"spec_verify_ct": 0}, "spec_verify_ct 0 and spec_accept_length 8.0"),
    (NGRAM / "generate-stream-ngram.txt", {"spec_accept_length": -1}, "spec_accept_length -1 for 32 tokens"),
    (NGRAM / "generate-stream-ngram.txt", {"spec_accept_length": 1e9}, "spec_accept_length 1000000000.0"),
    (NGRAM / "generate-stream-ngram.txt", {"spec_accept_length": "abc"}, "spec_accept_length 'abc'"),
])
def test_a_number_no_request_can_have_is_kept_in_the_servers_words_never_clipped_or_dropped(stream, change, said):
    """Real SGLang's final meta_info (an H100; its NGRAM drafting server's for the verify counts), one field made
    impossible: the record keeps it as the server sent it, and takes no reading from it."""
    from sglperf.measure.client import _Progress
    from sglperf.measure.wire import NATIVE

    obj = _final_chunk(stream)
    healthy = _Progress(0, 0.0, obj["meta_info"]["prompt_tokens"], 32)
    NATIVE.chunk(obj, healthy, 0)
    assert not healthy.impossible
    obj["meta_info"].update(change)
    p = _Progress(0, 0.0, obj["meta_info"]["prompt_tokens"], 32)
    NATIVE.chunk(obj, p, 0)
    assert len(p.impossible) == 1 and said in p.impossible[0], p.impossible
    assert p.cached is None if "cached_tokens" in change else p.spec_accept_length is None


def test_a_level_whose_server_reported_an_impossible_number_is_invalid_quoting_it():
    from dataclasses import replace

    from sglperf.measure.metrics import MeasurementPolicy, level_result

    from .test_metrics import closed_loop

    recs = closed_loop(4, 1.0, 30.0)
    recs[20] = replace(recs[20], impossible=("cached_tokens 160 for a prompt of 128 tokens",))
    r = level_result(recs, concurrency=4, rate=None, isl=recs[0].prompt_tokens, osl=10, policy=MeasurementPolicy())
    assert not r.valid
    assert any("numbers no request can have in 1 of" in x and "#20: cached_tokens 160 for a prompt of 128" in x
               for x in r.invalid_reasons), r.invalid_reasons


@pytest.mark.parametrize("raw,pin", [("2.6", 2.6), ("0.5", 1.0), ("0", None), ("-1", None), ("nan", None),
                                     ("", None), (None, None), ("inf", float("inf"))])
def test_the_acceptance_pin_is_read_as_sglang_reads_it(raw, pin):
    """SGLang's spec_utils: the pin is on only above 0 (nan compares false), and a step accepts at least one token.
    The simulator pinned -1 and 0 to 1.0 and recorded no pin; nan left it never ready."""
    from types import SimpleNamespace

    from sglperf.sim.args import read_accept_pin
    from sglperf.sim.state import spec_config

    assert read_accept_pin(raw) == pin
    a = SimpleNamespace(speculative_algorithm="EAGLE", speculative_num_draft_tokens=4, speculative_num_steps=3,
                        fault_ignore_accept_pin=False, sim_accept_length=2.5, sim_verify_cost=0.35)
    env = {} if raw is None else {"SGLANG_SIMULATE_ACC_LEN": raw}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        cfg = spec_config(a)
    assert cfg["accept_pinned"] == (pin is not None)
    assert cfg["accept_length"] == (2.5 if pin is None else min(pin, 5.0)), "clamped to the draft + 1, never nan"


@pytest.mark.parametrize("raw,says", [("abc", "'abc': \"abc\" is not a valid float value, which SGLang refuses"),
                                      ("inf", "'inf': pin a finite acceptance length")])
def test_a_pin_the_server_would_refuse_or_clamp_is_a_usage_error_before_anything_starts(tmp_path, raw, says):
    """=inf divided by zero in the pin check after a whole run; ="abc" is what SGLang itself refuses at start."""
    p, out = suite(tmp_path, "--levels", "8", env={"SGLANG_SIMULATE_ACC_LEN": raw})
    assert p.returncode == 4 and f"USAGE ERROR: SGLANG_SIMULATE_ACC_LEN={says}" in out, out[-2000:]
    assert not (tmp_path / "reports" / "servers").exists()


def test_an_offered_rate_past_the_open_file_limit_is_named_a_rate_not_streams(tmp_path):
    """An open-loop profile's level is an offered rate: the open-file check says so, counting a second of its
    arrivals in flight (the least it holds), where it called a rate of 1e9 req/s "a level of 1e9 streams"."""
    p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "--profile", "sim-rate", "--levels",
                        "1000000000", "-q", "-p", "no:randomly", "--reports-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 4, p.stdout[-2000:] + p.stderr[-2000:]
    assert "an offered rate of 1,000,000,000 req/s holds at least" in p.stderr, p.stderr[-2000:]
    assert "streams" not in p.stderr
