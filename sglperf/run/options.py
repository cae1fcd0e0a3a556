"""What the user asked for, validated before anything is launched: the options of a run (pytest options or any
other front end), each checked on construction with a usage error that names it."""

from __future__ import annotations


from dataclasses import dataclass
from pathlib import Path


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

    def recorded(self) -> dict:
        """The options a run file keeps (redacted)."""
        return redact({"--server-url": self.server_url, "--server-arg": redact_argv(list(self.server_args)),
                       "--model-path": self.model_path, "--levels": list(self.levels) or None,
                       "--perf-config": list(self.perf_configs) or None, "--baseline-file": self.baseline_file,
                       "--ci-target": self.ci_target, "--level-max-seconds": self.level_max_seconds,
                       "--client-procs": self.client_procs,
                       "--results-db": fleet.check_url(self.results_db).shown() if self.results_db else None})
