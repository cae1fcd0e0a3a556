"""What the user asked for, validated before anything is launched: the options of a run (pytest options or any
other front end), each checked on construction with a usage error that names it."""

from __future__ import annotations


from dataclasses import dataclass
from pathlib import Path


from ..argtypes import non_negative, positive
from .profiles import MeasurementSection
from ..store import fleet
from .. import engines
from ..categories import UsageError
from ..measure.shards import parse_client_procs
from ..measure.level import parse_levels
from ..redact import redact, redact_argv





@dataclass(frozen=True)
class SuiteOptions:
    """What the user asked for (pytest options or any other front end), validated on construction."""

    reports_dir: Path
    profiles: tuple[str, ...] = ()
    server_url: str | None = None
    server_args: tuple[str, ...] = ()
    model_path: str | None = None
    levels: tuple[int, ...] = ()  # empty: the profile's
    perf_configs: tuple[str, ...] = ()
    baseline_file: str | None = None
    update_baselines: bool = False
    ci_target: float | None = None
    level_max_seconds: float | None = None
    history_file: str | None = None
    launch_timeout: float | None = None
    gpu_lock_timeout: float = 7200.0
    allure_dir: Path | None = None
    tokenizer: str | None = None
    client_procs: str | None = None  # a count or "auto", overriding the profile's
    results_db: str | None = None  # the fleet's PostgreSQL (store/fleet.py); the JSONL history is kept as well

    def __post_init__(self) -> None:
        """Every option is checked before anything is launched or measured: a usage error names it and its range."""
        parse_client_procs(self.client_procs)
        if self.results_db:
            fleet.check_url(self.results_db)
        if self.server_url:
            engines.check_url(self.server_url)
        if self.ci_target is not None:
            MeasurementSection.check("ci_target", self.ci_target, "--ci-target")
        if self.level_max_seconds is not None:
            MeasurementSection.check("level_max_seconds", self.level_max_seconds, "--level-max-seconds")
        if self.launch_timeout is not None and not self.launch_timeout > 0:
            raise UsageError(f"--launch-timeout {self.launch_timeout:g}: must be a number of seconds > 0")
        if self.gpu_lock_timeout < 0:
            raise UsageError(f"--gpu-lock-timeout {self.gpu_lock_timeout:g}: must be >= 0 seconds")
        if self.baseline_file and not Path(self.baseline_file).is_file():
            raise UsageError(f"--baseline-file {self.baseline_file}: no such file")

    parse_levels = staticmethod(parse_levels)

    @classmethod
    def from_options(cls, opt, reports_dir: Path, allure_dir: Path | None) -> "SuiteOptions":
        """From a front end's option getter (pytest's config.getoption): the option names are the pytest ones."""
        return cls(
            reports_dir=reports_dir, profiles=tuple(opt("--profile") or ()), server_url=opt("--server-url"),
            server_args=tuple(opt("--server-arg") or ()), model_path=opt("--model-path"),
            levels=cls.parse_levels(opt("--levels")), perf_configs=tuple(opt("--perf-config") or ()),
            baseline_file=opt("--baseline-file"), update_baselines=opt("--update-baselines"),
            ci_target=opt("--ci-target"), level_max_seconds=opt("--level-max-seconds"),
            history_file=opt("--history-file"), launch_timeout=opt("--launch-timeout"),
            gpu_lock_timeout=opt("--gpu-lock-timeout"), allure_dir=allure_dir, tokenizer=opt("--tokenizer"),
            client_procs=opt("--client-procs"), results_db=fleet.from_env(opt("--results-db")))

    def recorded(self) -> dict:
        """The options a run file keeps (redacted)."""
        return redact({"--server-url": self.server_url, "--server-arg": redact_argv(list(self.server_args)),
                       "--model-path": self.model_path, "--levels": list(self.levels) or None,
                       "--perf-config": list(self.perf_configs) or None, "--baseline-file": self.baseline_file,
                       "--ci-target": self.ci_target, "--level-max-seconds": self.level_max_seconds,
                       "--client-procs": self.client_procs,
                       "--results-db": fleet.check_url(self.results_db).shown() if self.results_db else None})


def _described(key: str) -> str:
    return f"{MeasurementSection.model_fields[key].description} (default: the profile's)"


# The suite's options as pytest declares them (fixtures/plugin.py adds them as they are): (flag, argparse keywords).
OPTIONS = [
    ("--profile", dict(action="append", default=None, help="profile name or TOML path (repeatable); default: "
                       "glm5-nvfp4-tp8 for -m gpu8, sim-ci for -m sim")),
    ("--server-url", dict(default=None, help="use a running server; launch nothing (runs one config)")),
    ("--server-arg", dict(action="append", default=[], help="extra server flag, appended to every launch "
                          "(repeatable; use --server-arg=--flag=value)")),
    ("--model-path", dict(default=None, help="override the profile's model path (also SGLPERF_MODEL_PATH)")),
    ("--levels", dict(default=None, help="comma-separated concurrencies, overriding the profile's")),
    ("--perf-config", dict(action="append", default=None, help="run only these configs (repeatable)")),
    ("--baseline-file", dict(default=None, help="baseline JSON to judge floors against")),
    ("--update-baselines", dict(action="store_true", help="write a candidate baseline from this run (never "
                                "overwrites the reviewed file)")),
    ("--ci-target", dict(type=MeasurementSection.argtype("ci_target", "--ci-target"), default=None,
                         help=_described("ci_target"))),
    ("--level-max-seconds", dict(type=MeasurementSection.argtype("level_max_seconds", "--level-max-seconds"),
                                 default=None, help=_described("level_max_seconds"))),
    ("--reports-dir", dict(default="reports", help="where runs, server logs and history go (reports/)")),
    ("--history-file", dict(default=None, help="run history JSONL to append to (default: $SGLPERF_HISTORY or "
                            "<reports-dir>/history.jsonl)")),
    ("--launch-timeout", dict(type=positive("--launch-timeout", example="600"), default=None,
                              help="seconds a server may take to become ready (default: the profile's)")),
    ("--gpu-lock-timeout", dict(type=non_negative("--gpu-lock-timeout", example="7200"), default=7200.0,
                                help="seconds to wait for another run to release the GPU set")),
    ("--client-procs", dict(default=None, help="client processes a level's streams are sharded over: a count, or "
                            "auto (from the previous level's rate and the free cores); default 1")),
    ("--results-db", dict(default=None, help="the fleet's PostgreSQL URL (postgresql://USER:PASSWORD@HOST/DB; also "
                          "$SGLPERF_RESULTS_DB): each run is also written there; the JSONL history stays")),
    ("--tokenizer", dict(default=None, help="the model's tokenizer for text and chat prompts (a tokenizer.json, a "
                         "directory with one, or a model in the local HF cache), overriding the profile's")),
]
