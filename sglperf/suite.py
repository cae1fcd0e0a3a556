"""The run's orchestration without pytest: profiles, levels and configs to run, one server per config (launched,
probed, fingerprinted, torn down), the measurement cache shared by a level's tests, recording, history, candidate
baselines and the Allure side files. Raises sglperf errors (categories.py); the pytest layer only translates them.

Why here: everything a run does must be testable and reusable without pytest, and every started server and every
lock must be released on every path, which is easiest to see in one place.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock, Timeout

from .store import baselines, fleet, history
from . import engines, profiles
from .environment import fingerprint, gpu, host_speed
from .environment.host import open_files_problem
from .report import allure as report
from . import launch as launcher
from .fileio import check_writable
from .categories import INFRA, INVALID, InfraError, UsageError
from .measure.canary import run_canary
from .measure.client import Target, Workload
from .measure.shards import parse_client_procs, resolve_client_procs
from .measure.level import LevelMeasurement, LevelSpec, ServerWatch, parse_levels, run_level
from .measure.metrics import MeasurementPolicy
from .measure.negotiate import connect, vocabulary_problem
from .redact import api_key_from_env, argv_secrets, env_secrets, redact, redact_argv, register, secrets
from .store.recorder import RunRecorder, ServerDoc, mark_abandoned
from .store.rundoc import CanaryDoc
from .records import Ceiling, LevelResult
from .judge import count, plateau
from .judge.starts import over_starts as over_all_starts
from .judge.noise import Noise
from .judge.noise import of as noise_of
from .judge.canary import CanaryVerdict, check_canary
from .judge.floor import decides_floor



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
        if self.ci_target is not None and not 0 < self.ci_target <= 0.5:
            raise UsageError(f"--ci-target {self.ci_target:g}: must be a fraction in (0, 0.5], e.g. 0.01 for +/-1%")
        for name, value in (("--level-max-seconds", self.level_max_seconds), ("--launch-timeout",
                                                                             self.launch_timeout)):
            if value is not None and not value > 0:
                raise UsageError(f"{name} {value:g}: must be a number of seconds > 0")
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


@dataclass
class ConfigRun:
    """One config's server for the session, and what the suite learned of it."""

    suite: "Suite"
    profile: profiles.Profile
    name: str
    engine: engines.Engine
    server: launcher.Server
    target: Target
    workload: Workload
    server_info: dict
    ceiling: Ceiling | None
    fingerprint: dict
    lock: FileLock | None = None
    starts: int = 1  # server starts of this config in this run (replicates restart it)
    canary: list | None = None  # CanaryOutputs, taken before the ladder (None: the profile turns it off)
    canary_error: str | None = None  # why the canary could not be taken
    canary_verdict: "CanaryVerdict | None" = None
    canary_skip: str | None = None  # why this config has no canary

    @property
    def where(self) -> str:
        return f"{self.profile.name}/{self.name}"

    @property
    def log_path(self) -> str | None:
        return str(self.server.log_path) if self.server.log_path else None

    @property
    def hardware_class(self) -> str:
        return self.fingerprint["hardware_class"]

    def measure(self, level: int) -> LevelMeasurement:
        """The level's measurement, taken once and shared by every test of that level."""
        return self.suite.measure(self, level)

    def baseline(self):
        return self.suite.baseline(self)

    def host_outside(self, bf) -> str | None:
        """Why this host is not one the baseline measured (its CPU speed outside the baseline's band, or a CPU
        baseline that never probed it), or None. GPU and simulator classes: the class says the hardware (a GPU
        server's share of CPU work is weighed over the run's probes: host_slower)."""
        now = (self.fingerprint.get("host_speed") or {}).get("score")
        if bf is None or not now or not fingerprint.cpu_class(self.hardware_class):
            return None
        if bf.host_speed is None:
            return ("the baseline was taken before sglperf probed the host's CPU speed, and a CPU's model name does "
                    "not say how fast the machine is (two VMs named Intel(R) Xeon(R) Processor x 2 read SGLang's "
                    "levels 10-30% apart on 2026-12-01): a floor from it could blame the server for the host. "
                    "Re-calibrate it on this host (`sglperf baseline calibrate RUN_FILES...`)")
        scores = self.suite.host_speeds or [now]
        mean, _ = host_speed.summarize(scores)
        return host_speed.outside(mean, bf.host_speed.score, bf.host_speed.cv, bf.host_speed.runs,
                                  probes=len(scores))

    def host_slower(self, bf) -> host_speed.SlowerHost | None:
        """How much slower than on the baseline's runs this host's CPU probed before the levels measured so far
        (their geometric mean: one host, one speed), where that lies below the baseline's band; None where it does
        not, or where nothing says. A server on a GPU still schedules, tokenizes and serves HTTP on the CPU: an H200
        host probed 20% slower than at the session's start read p16 c128 5.6% under its baseline, nothing else named
        (2026-12-04). One level's probe alone moved 69-91 within a healthy run on another (2026-12-05)."""
        scores = self.suite.level_cpu_speeds
        if bf is None or bf.host_speed is None or not scores or fingerprint.cpu_class(self.hardware_class):
            return None
        now, _ = host_speed.summarize(scores)
        return host_speed.slower(now, bf.host_speed.score, bf.host_speed.cv, bf.host_speed.runs)

    def replicate_note(self, level: int) -> str:
        """What an undecided verdict adds: how often the level was re-measured, or why it was not."""
        key = (self.profile.name, self.name, level)
        done, refused = len(self.suite.replicates.get(key, [])), self.suite.replicate_refused.get(key)
        m = self.profile.measurement
        if refused:
            return f"not re-measured further: {refused}"
        if m.replicates == 1:
            return ("re-run, or let the profile re-measure undecided levels after a server restart ([measurement] "
                    "replicates)")
        return f"measured over {done + 1} server starts (the profile allows {m.replicates})"

    def replicate(self, level: int, why: str) -> list[LevelMeasurement] | None:
        """The level's starts so far after one more (a server restart, then the level again), or None where the
        profile's replicates or the run's budget allow no more."""
        return self.suite.replicate(self, level, why)

    def level_starts(self, level: int) -> list[LevelMeasurement]:
        """The level's measurements so far: its first start, then the replicates other tests asked for."""
        return self.suite.level_starts(self, level)

    def replicate_levels(self, levels: list[int], why: str) -> dict[int, LevelMeasurement] | None:
        """All of `levels` measured on one more server start, or None where no more is allowed."""
        return self.suite.replicate_levels(self, levels, why)

    def over_starts(self, levels: list[int]) -> dict[int, LevelResult] | None:
        """`levels` over all their server starts with the baseline's between-start noise (starts.over_starts),
        or None where the baseline calibrated none or this host is not one it measured."""
        bf, _ = self.baseline()
        if bf is None or self.host_outside(bf):
            return None
        starts = self.suite.starts(self.profile.name, self.name)
        return over_all_starts({lv: starts[lv] for lv in levels if lv in starts}, self.noise(self.name, levels))

    def level_failure(self, m: LevelMeasurement) -> str | None:
        """Why this level cannot be judged (infrastructure or invalid), or None when it can."""
        r = m.result
        if r.incomplete:
            return f"{INFRA}: {self.where} c{r.concurrency}: {r.note}. Server log: {self.log_path}"
        if not r.valid:
            return (f"{INVALID}: {self.where} c{r.concurrency} cannot be trusted: " + "; ".join(r.invalid_reasons)
                    + f". Server log: {self.log_path}")
        return self.canary_failure(f"c{r.concurrency}")

    def canary_failure(self, what: str) -> str | None:
        """Fast but wrong: where the output canary failed, nothing measured from this server is judged."""
        v = self.canary_verdict
        if v is None or v.passed:
            return None
        return (f"{INVALID}: {self.where} {what}: measured (shown in the summary), not judged: the output canary "
                f"failed ({v.category.prefix}; test_output_canary quotes the tokens): a server that returns "
                f"garbage may be fast")

    def server_count(self, r) -> "count.CountVerdict":
        """The client's sustained tok/s against the server's own count over the same window."""
        return count.check_server_count(r, where=self.where, tolerance=self.profile.measurement.server_agreement,
                                          counts_at_completion=self.engine.counts_at_completion,
                                          cap=self.ceiling.effective if self.ceiling else None)

    def noise(self, config: str, levels) -> dict[int, "Noise"]:
        """The between-start noise the baseline calibrated for `config`'s levels (judge/noise.py), where it did."""
        bf, _ = self.baseline()
        out = {}
        for lv in levels:
            e = bf.entries(config, lv).get("sustained_output_tps") if bf else None
            if e is not None and noise_of(e) is not None:
                out[lv] = noise_of(e)
        return out

class Suite:
    def __init__(self, opts: SuiteOptions):
        self.opts = opts
        self._profiles: dict[str, profiles.Profile] = {}
        self.measurements: dict[tuple[str, str, int], LevelMeasurement] = {}
        self.replicates: dict[tuple[str, str, int], list[LevelMeasurement]] = {}  # starts after the first
        self.replicate_spent: dict[str, float] = {}  # per profile: seconds of restarts and re-measured levels
        self.replicate_refused: dict[tuple[str, str, int], str] = {}
        # per (profile, config, server start): the levels measured on that start, which a later level's stop may
        # compare itself with (Suite.decides)
        self.on_start: dict[tuple[str, str, int], dict[int, LevelResult]] = {}
        # Every CPU speed probe of this host in the session: one host, one speed, judged by their mean. One probe
        # moves ±5% on a host with noisy neighbours (2026-12-02: 39.5 and 42.7 minutes apart against a baseline's
        # 48.2), and a config whose lone probe fell just inside the band was judged while the one before was not.
        self.host_speeds: list[float] = []
        self.level_cpu_speeds: list[float] = []  # the probe before each level measured (ConfigRun.host_slower)
        self.launch_s: dict[tuple[str, str], float] = {}  # how long each config's last server start took
        self.recorders: dict[str, RunRecorder] = {}
        self.runs: dict[tuple[str, str], ConfigRun] = {}
        self.candidates: list[str] = []
        self.history_path: Path | None = None
        self.pushed: list[str] = []  # what the results database took
        self.withheld: list[str] = []  # why a run was kept out of the history and the candidates
        self.interrupted = False
        self.late_problems: list[str] = []
        self.cleaned: list[str] = []
        register(*argv_secrets(list(opts.server_args)))  # secret from here on, in everything written

    # ------------------------------------------------------------------ what to run
    def profile_names(self) -> list[str]:
        if self.opts.profiles:
            return list(self.opts.profiles)
        return [n for n in profiles.DEFAULT_PROFILE_FOR_MARKER.values() if n in profiles.available()]

    def profile(self, name: str) -> profiles.Profile:
        if name not in self._profiles:
            prof = self._profiles[name] = profiles.load(name)
            register(*argv_secrets(prof.server.args + [a for c in prof.configs for a in c.args]),
                            *env_secrets(prof.server.env))
        return self._profiles[name]

    def levels(self, profile: profiles.Profile) -> list[int]:
        return list(self.opts.levels) or profile.levels

    def configs(self, profile: profiles.Profile) -> list[str]:
        names = [c.name for c in profile.configs]
        if self.opts.perf_configs:  # a name no profile has is a usage error once items are known (selected_nothing)
            names = [n for n in names if n in self.opts.perf_configs]
        if self.opts.server_url:
            names = names[:1]  # a running server is one config
        return names

    def policy(self, profile: profiles.Profile) -> MeasurementPolicy:
        m = profile.measurement
        slo = profile.slo
        return MeasurementPolicy(ci_target=self.opts.ci_target or m.ci_target, steady_state_ratio=m.steady_state_ratio,
                                 max_steal_share=m.max_steal_share,
                                 slo_ttft_ms=slo.ttft_ms_p99 if slo else None,
                                 slo_tpot_ms=slo.tpot_ms_p99 if slo else None)

    def recorder(self, profile: profiles.Profile) -> RunRecorder:
        if profile.name not in self.recorders:
            self.recorders[profile.name] = RunRecorder(self.opts.reports_dir, profile.name, profile.engine,
                                                       self.opts.recorded(),
                                                       notes=list(profile.notes) + list(profile.server.notes)
                                                       + [f"before this run: {c}" for c in self.cleaned])
        return self.recorders[profile.name]

    def check_outputs(self) -> None:
        """Every place this run will write is writable now, not after an hour of measuring."""
        o = self.opts
        check_writable(o.reports_dir / "runs", f"the reports directory {o.reports_dir}", "--reports-dir")
        check_writable(Path(o.history_file or history.default_path(o.reports_dir)).parent,
                       "the history file's directory", "--history-file")
        if o.allure_dir is not None:
            check_writable(o.allure_dir, "the Allure results directory", "--alluredir")
        if o.update_baselines:
            for pname in self.profile_names():
                d = Path(o.baseline_file).parent if o.baseline_file else baselines.BASELINE_DIR / self.profile(pname).name
                check_writable(d, "the baselines directory (for --update-baselines)", "--baseline-file")

    def check_open_files(self, pnames: set[str]) -> None:
        """The largest level of each profile fits the open-file limit, before any server starts."""
        setting = parse_client_procs(self.opts.client_procs)
        for pname in sorted(pnames):
            prof = self.profile(pname)
            levels = self.levels(prof)
            procs = setting if isinstance(setting, int) else prof.measurement.client_procs
            procs = procs if isinstance(procs, int) else 1
            where = "--levels" if self.opts.levels else f"profile {prof.name}'s level"
            why = open_files_problem(max(levels), procs, f"{where} {max(levels)}") if levels else None
            if why:
                raise UsageError(why)

    def selected_nothing(self, items: list[tuple[str, str]]) -> str | None:
        """A --profile or --perf-config that selects no item to run (after -m/-k): a usage error, never a green run."""
        o = self.opts
        if o.perf_configs:
            missing = [c for c in o.perf_configs if c not in {cname for _, cname in items}]
            if missing:
                known = {p: [c.name for c in self.profile(p).configs] for p in self.profile_names()}
                return (f"--perf-config {', '.join(missing)} selects nothing to run (selected profiles and their "
                        f"configs: {known}; check -m too)")
        if o.profiles:
            missing = [p for p in o.profiles if p not in {pname for pname, _ in items}]
            if missing:
                return (f"--profile {', '.join(missing)} selects nothing to run (its marker is "
                        f"{', '.join(self.profile(p).marker for p in missing)}; check -m and --perf-config)")
        return None

    def sweep_leftovers(self) -> None:
        """Before anything starts: servers a dead run left (ended, named) and run files it left "running"."""
        self.cleaned = launcher.reap_leftovers(self.opts.reports_dir / ".servers") + mark_abandoned(
            self.opts.reports_dir)

    # ------------------------------------------------------------------ servers
    def _gpu_lock(self) -> FileLock:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") or "none"
        lock_dir = self.opts.reports_dir / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock_dir / f"gpu-set-{devices}.lock"))

    def open_config(self, pname: str, cname: str) -> ConfigRun:
        """Launch (or reach) the config's server and learn what the suite needs of it. Whatever fails after the
        launch, the server is stopped and the GPU lock released before the error goes up."""
        prof = self.profile(pname)
        engine = prof.adapter()
        o = self.opts
        template = prof.launch_argv(cname, model_path=o.model_path, extra=list(o.server_args), resolve=False)
        if not o.server_url:
            if prof.hardware.gpus:
                gpu.preflight(prof.hardware.gpus, prof.hardware.gpu_kind)
            engine.prepare(template)
        # the client's key: SGLPERF_API_KEY, else the one the server is given on its command line (--server-arg)
        given = [v for f, v in zip(template, template[1:]) if f == prof.server.api_key_flag] + [
            a.split("=", 1)[1] for a in template if prof.server.api_key_flag and a.startswith(prof.server.api_key_flag + "=")]
        api_key = api_key_from_env() or (given[0] if given else None)
        rec = self.recorder(prof)
        # the CPU's speed, before a server whose speed rides on it starts (a remote server's host is not ours to probe)
        speed = host_speed.probe().as_dict() if not o.server_url and engine.host_cpu_matters else None
        if speed:
            self.host_speeds.append(speed["score"])
        if o.server_url:
            server = launcher.external(engines.check_url(o.server_url), name=cname)
            engine.reach(server.url, api_key)  # within seconds, in words: refused, silent, an error status
            found = engines.detect(server.url, api_key)
            if found.name != engine.name and engine.name != "openai":
                raise UsageError(f"--server-url {server.url} serves {found.name} (detected from what it answers), but "
                                 f"profile {prof.name} is for engine {engine.name}: its baselines, ceilings and "
                                 f"hardware class would not be this server's; use a profile of engine {found.name}")
            lock, template, flags = None, [], None
        else:
            flags = engine.check_flags(template)
            self._close_others((pname, cname))
            lock = self._gpu_lock()
            try:
                lock.acquire(timeout=o.gpu_lock_timeout)
            except Timeout:
                raise InfraError(f"another run holds the GPU set ({lock.lock_file}) and did not release it within "
                                 f"{o.gpu_lock_timeout:g} s") from None
            spec = launcher.LaunchSpec(
                name=f"{prof.name}-{cname}", log_dir=o.reports_dir / "servers", host=prof.server.host,
                argv=prof.launch_argv(cname, model_path=o.model_path, extra=list(o.server_args),
                                      api_key=None if given else api_key),
                env=dict(prof.server.env), launch_timeout_s=o.launch_timeout or prof.server.launch_timeout_s,
                terminate_timeout_s=prof.server.terminate_timeout_s, secrets=tuple(secrets()),
                registry=o.reports_dir / ".servers")
            try:
                t0 = time.monotonic()
                server = launcher.launch(spec)
                self.launch_s[(pname, cname)] = time.monotonic() - t0
            except BaseException as e:
                lock.release()
                if isinstance(e, launcher.LaunchError):
                    rec.add_problem(cname, e.report())
                raise
        try:
            return self._learn(prof, cname, engine, server, template, flags, lock, api_key, speed)
        except BaseException:
            server.stop()
            if lock is not None:
                lock.release()
            raise

    def _learn(self, prof, cname, engine, server, template, flags, lock, api_key, speed) -> ConfigRun:
        w = prof.workload
        conn = connect(server.url, engine, w.client_workload(self.opts.tokenizer), api=w.api,
                       prompt_format=w.prompt_format, api_key=api_key)
        problem = vocabulary_problem(conn.workload, conn.vocab_size)
        if problem:
            raise UsageError(f"profile {prof.name}: [workload] vocab_low/vocab_high: {problem}; set vocab_high to "
                             f"at most {conn.vocab_size}")
        fp = fingerprint.collect(engine, conn.server_info, template, prof.model_path(self.opts.model_path),
                                 server_env=dict(prof.server.env), host_speed=speed)
        run = ConfigRun(self, prof, cname, engine, server, conn.target, conn.workload, conn.server_info,
                        engine.ceiling(conn.server_info, w.isl, w.osl), fp, lock)
        rec = self.recorder(prof)
        rec.set_fingerprint(fp, cname)
        rec.set_server(cname, ServerDoc(
            url=server.url, argv=server.display_argv, log=run.log_path, server_info=conn.server_info,
            ceiling=run.ceiling.__dict__ if run.ceiling else None, engine=conn.describe(engine),
            flag_check={"source": flags.source, "problems": list(flags.problems)} if flags else None))
        self.runs[(prof.name, cname)] = run
        if not self.take_canary(run, conn.vocab_size) or not prof.canary.restart_after or self.opts.server_url:
            return run
        self.restart(run)  # the ladder runs on a server the canary has not touched
        run.starts = 1
        return run

    def take_canary(self, run: ConfigRun, vocab: int | None) -> bool:
        """The config's greedy canary, before any level (it costs seconds), judged at once: whether the run may
        become history or a baseline must not depend on which tests were selected. True where it was taken now."""
        c = run.profile.canary
        taken = self.recorder(run.profile).doc.configs.get(run.name)
        if not c.enabled or run.canary is not None or (taken is not None and taken.canary is not None):
            return False  # one canary per config and run: a replicate's restart does not take another
        w = run.workload
        ids, texts = (None, c.texts) if c.texts else (c.prompt_ids(w.vocab_low, w.vocab_high), None)
        if texts is None and w.prompt_format != "ids":  # a server that takes text gets the ids' text
            if w.tokenizer is None:
                run.canary_skip = "the profile sends text and names no tokenizer: give [canary] texts"
                return False
            ids, texts = None, [w.tokenizer.decode(p) for p in ids]
        try:
            run.canary = run_canary(run.target, w, ids, texts, c.output_len,
                                    timeout=run.profile.measurement.request_timeout_s)
        except InfraError as e:
            run.canary_error = str(e)
            return False
        bf, _ = self.baseline(run)
        expected = bf.canary.get(run.name) if bf else None
        then = bf.canary_fingerprint.get(run.name) if bf else None
        run.canary_verdict = check_canary(
            run.canary, c.rules(), vocab=vocab, expected=expected, expect=c.expect,
            env_diff=fingerprint.describe_diff(then, run.fingerprint) if then and expected else "")
        self.recorder(run.profile).set_canary(run.name, CanaryDoc(
            outputs=[dict(o.__dict__) for o in run.canary], seconds=round(sum(o.seconds for o in run.canary), 3),
            outcome=run.canary_verdict.outcome, problems=list(run.canary_verdict.problems)))
        return True

    def _close_others(self, keep: tuple[str, str]) -> None:
        """Configs never run side by side (they share the GPUs, or the CPU, and the GPU-set lock): another config's
        server still up is stopped before one starts. Where the A/B re-measures a config whose tests are done, the
        config whose tests ran last is still up, and its lock made the restart wait (cpu-sglang: 11 min, stopped by
        hand; --gpu-lock-timeout is 2 h)."""
        for key, other in list(self.runs.items()):
            if key != keep and other.server.teardown is None:
                self.close_config(other)

    def close_config(self, run: ConfigRun) -> None:
        try:
            rep = run.server.stop()
        finally:
            if run.lock is not None:
                run.lock.release()
        self.recorder(run.profile).set_teardown(run.name, rep.__dict__)
        if rep.survivors:
            raise InfraError(f"processes of the server survived teardown: {list(rep.survivors)}")

    def restart(self, run: ConfigRun) -> None:
        """A fresh start of the config's server: the old one stopped (its teardown recorded), the new one learnt
        into `run`, which the session's tests hold."""
        self.close_config(run)
        fresh = self.open_config(run.profile.name, run.name)
        for name in ("server", "target", "workload", "server_info", "ceiling", "fingerprint", "lock"):
            setattr(run, name, getattr(fresh, name))
        run.starts += 1
        self.runs[(run.profile.name, run.name)] = run

    def replicate(self, run: ConfigRun, level: int, why: str) -> list[LevelMeasurement] | None:
        if self.replicate_levels(run, [level], why) is None:
            return None
        return self.level_starts(run, level)

    def level_starts(self, run: ConfigRun, level: int) -> list[LevelMeasurement]:
        return [self.measure(run, level), *self.replicates.get((run.profile.name, run.name, level), [])]

    def replicate_levels(self, run: ConfigRun, levels: list[int], why: str) -> dict[int, LevelMeasurement] | None:
        """One more server start that measures all of `levels` (recorded as their replicates): what a comparison
        between levels re-measures, so that it compares levels of one start, where what differs between starts
        cancels. None where the profile's replicates or the run's budget allow no more."""
        m = run.profile.measurement
        keys = [(run.profile.name, run.name, lv) for lv in levels]
        if self.opts.server_url or any(1 + len(self.replicates.get(k, [])) >= m.replicates for k in keys):
            return None
        firsts = [self.measure(run, lv) for lv in levels]
        spent = self.replicate_spent.get(run.profile.name, 0.0)
        cost = sum(f.result.duration_s for f in firsts) + self.launch_s.get(keys[0][:2], 0.0)
        if spent + cost > m.replicate_budget_s:
            left = m.replicate_budget_s - spent
            for k in keys:
                self.replicate_refused[k] = (f"a replicate of c{', c'.join(map(str, levels))} would take "
                                             f"~{cost:.0f} s and the run has {left:.0f} s of its replicate budget "
                                             f"({m.replicate_budget_s:g} s) left")
            return None
        t0 = time.monotonic()
        self.restart(run)
        out = {}
        for k, lv in zip(keys, levels):
            meas = self._measure(run, lv)
            self.replicates.setdefault(k, []).append(meas)
            self.recorder(run.profile).add_replicate(run.name, lv, meas.result, meas.records, meas.server_samples,
                                                     meas.stop_reason, meas.scrape_source, meas.extra["epoch_ms"],
                                                     why)
            out[lv] = meas
        self.replicate_spent[run.profile.name] = spent + time.monotonic() - t0
        return out

    # ------------------------------------------------------------------ levels
    def measure(self, run: ConfigRun, level: int) -> LevelMeasurement:
        key = (run.profile.name, run.name, level)
        if key in self.measurements:
            return self.measurements[key]
        meas = self._measure(run, level)
        self.measurements[key] = meas
        self.recorder(run.profile).add_level(run.name, level, meas.result, meas.records, meas.server_samples,
                                             meas.stop_reason, meas.scrape_source, meas.extra["epoch_ms"])
        if meas.stop_reason == "interrupted":
            self.interrupted = True
            raise KeyboardInterrupt(f"interrupted during {run.where} c{level}; its partial result is saved, "
                                    f"marked incomplete")
        return meas

    def _measure(self, run: ConfigRun, level: int) -> LevelMeasurement:
        key = (run.profile.name, run.name, level)
        dead = run.server.crash_reason()
        if dead:
            raise InfraError(dead)
        m = run.profile.measurement
        spec = LevelSpec(concurrency=level, max_seconds=self.opts.level_max_seconds or m.level_max_seconds,
                         min_seconds=m.level_min_seconds, stall_timeout_s=m.stall_timeout_s,
                         request_timeout_s=m.request_timeout_s)
        bf, _ = self.baseline(run)
        start = self.on_start.setdefault((run.profile.name, run.name, run.starts), {})
        done = sorted(lv for (p, c, lv) in self.measurements if (p, c) == key[:2] and lv < level)
        procs = resolve_client_procs(parse_client_procs(self.opts.client_procs) or m.client_procs, level,
                                     self.measurements[key[:2] + (done[-1],)].result if done else None)
        # the CPU's speed just before a GPU server's level: it moves within a session (an H200 host probed 42.9, then
        # 28.1 after a run its hypervisor stole from, then 41.0); a CPU server's host is judged by its starts' probes
        cpu = (host_speed.probe().score if run.engine.host_cpu_matters and not self.opts.server_url
               and not fingerprint.cpu_class(run.hardware_class) else None)
        try:
            meas = run_level(run.target, run.workload, spec, self.policy(run.profile), engine=run.engine,
                             watch=ServerWatch(run.server.crash_reason, run.server.tree_pids,
                                               run.fingerprint.get("gpu_indices") or None),
                             decided=self.decides(run, level, bf, start), client_procs=procs)
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        if cpu is not None:
            meas.result = replace(meas.result, host_cpu_speed=round(cpu, 4))
            self.level_cpu_speeds.append(cpu)
        start[level] = meas.result
        return meas

    def decides(self, run: ConfigRun, level: int, bf, start: dict[int, LevelResult]):
        """When a level may stop before its interval reaches the profile's ci_target: once its floor is decided, and
        at a level the plateau compares also once its interval is narrow enough for that (cpu-sglang rr32 c48
        stopped after 7 s at ±9.8% on its floor alone, and the plateau could not tell -5% from -15%), or once its
        ratios to the plateau's levels already measured (undisturbed) on this server `start` are decided; how narrow
        is the share of the band the ratios the baseline `bf` measured among those levels allow. No baseline entry: the
        level runs to its precision."""
        entry = bf.entries(run.name, level).get("sustained_output_tps") if bf else None
        if entry is None:
            return None
        levels = self.levels(run.profile)
        compared = [lv for lv in levels if plateau.plateau_compares(lv, run.ceiling, levels)]
        if level not in compared:
            return decides_floor(entry.floor)
        earlier = [r for lv, r in sorted(start.items())
                   if r.valid and not r.disturbances and lv < level and lv in compared]
        band = run.profile.measurement.plateau_band
        means = [e.value for lv in compared if (e := bf.entries(run.name, lv).get("sustained_output_tps"))]
        return plateau.decides_plateau_level(entry.floor, band, earlier, share=plateau.plateau_share(band, means))

    def measured(self, profile: str, config: str, level: int) -> LevelMeasurement | None:
        return self.measurements.get((profile, config, level))

    def results(self, profile: str, config: str) -> dict[int, LevelResult]:
        """The config's measured levels so far, by level (each level's first start)."""
        return {lv: m.result for (p, c, lv), m in sorted(self.measurements.items()) if (p, c) == (profile, config)}

    def starts(self, profile: str, config: str) -> dict[int, list[LevelResult]]:
        """The config's measured levels so far, by level: every server start of each (the first, then replicates)."""
        return {lv: [m.result, *(x.result for x in self.replicates.get((p, c, lv), []))]
                for (p, c, lv), m in sorted(self.measurements.items()) if (p, c) == (profile, config)}

    def config_run(self, profile: str, config: str) -> ConfigRun | None:
        """The config's server, where this session opened it."""
        return self.runs.get((profile, config))

    def baseline(self, run: ConfigRun):
        """(BaselineFile, path), or (None, path) when there is none for this hardware class."""
        explicit = self.opts.baseline_file
        path = Path(explicit) if explicit else baselines.default_path(run.profile.name, run.hardware_class)
        if not path.exists():
            if explicit:
                raise UsageError(f"--baseline-file {path} does not exist")
            return None, path
        bf = baselines.load(path)
        baselines.check_hardware(bf, path, run.hardware_class)
        return bf, path

    # ------------------------------------------------------------------ the end of a run
    def finish(self, interrupted: bool) -> None:
        """Close every run file, append history, write the Allure side files and candidates. Each writer runs even
        when another failed; failures are collected in `late_problems`."""
        interrupted = interrupted or self.interrupted
        for run in self.runs.values():  # a server restarted after its config's tests ended (an A/B re-measure)
            if run.server.teardown is None:
                try:
                    self.close_config(run)
                except (OSError, InfraError) as e:
                    self.late_problems.append(f"{type(e).__name__}: {e}")
        for rec in self.recorders.values():
            self._try(lambda rec=rec: rec.finish("interrupted" if interrupted else "finished", not interrupted))
            if rec.canary_failed():  # fast but wrong: shown in the run file, never history or a baseline
                self.withheld.append(f"{rec.doc.profile}: output canary failed ({'; '.join(rec.canary_failed())}): "
                                     f"this run's numbers are not appended to the history and make no candidate "
                                     f"baseline")
                continue
            if any(c.levels for c in rec.doc.configs.values()):
                path = Path(self.opts.history_file or history.default_path(self.opts.reports_dir))
                self._try(lambda rec=rec, path=path: history.append(path, history.record_from_run(rec.doc)))
                self.history_path = path
        if self.opts.results_db:
            for rec in self.recorders.values():
                if any(c.levels for c in rec.doc.configs.values()):
                    self.push_results(rec)
        if self.opts.allure_dir is not None and self.recorders:
            self._try(self.write_allure_files)
        if self.opts.update_baselines and not interrupted:
            for name, rec in self.recorders.items():
                if rec.canary_failed():
                    continue
                self._try(lambda name=name, rec=rec: self.candidates.append(self.write_candidate(name, rec)))

    def push_results(self, rec: RunRecorder) -> None:
        """The run into the fleet's database, after its files are written: a database that is down or refuses us
        costs the run nothing (named in the summary; `sglperf history push RUN_FILE` uploads it later)."""
        try:
            conn = fleet.connect(self.opts.results_db)
            try:
                fresh = fleet.push_run(conn, rec.doc, source="suite")
            finally:
                conn.close()
            self.pushed.append(f"results database: run {rec.doc.run_id} "
                               f"{'written' if fresh else 'was there already'} "
                               f"({fleet.check_url(self.opts.results_db).shown()})")
        except Exception as e:  # psycopg's errors, ours (FleetError), a broken connection mid-write: all named
            words = redact(str(e)).strip() or type(e).__name__
            self.late_problems.append(f"results database: run {rec.doc.run_id} not written ({words}); its files "
                                      f"are complete: `sglperf history push {rec.path}` uploads it later")

    def _try(self, step) -> None:
        try:
            step()
        except (OSError, UsageError) as e:
            self.late_problems.append(f"{type(e).__name__}: {e}")

    def write_allure_files(self) -> None:
        report.write_run_files(self.opts.allure_dir, [rec.doc for rec in self.recorders.values()])

    def write_candidate(self, profile_name: str, rec: RunRecorder) -> str:
        prof = self.profile(profile_name)
        explicit = Path(self.opts.baseline_file) if self.opts.baseline_file else None
        return baselines.write_candidate(rec.doc, tolerance=prof.measurement.default_tolerance, isl=prof.workload.isl,
                                         osl=prof.workload.osl, reviewed=explicit)

    def summary_lines(self) -> list[str]:
        lines = [f"OUTPUT CANARY FAILED: {w}" for w in self.withheld]
        lines += [f"GPU FAULT: {rec.doc.profile}/{cname} c{lv}: {f} (the level is INVALID)"
                  for rec in self.recorders.values() for cname, c in rec.doc.configs.items()
                  for lv, r in sorted(c.levels.items(), key=lambda kv: int(kv[0])) for f in r.gpu_faults]
        for rec in self.recorders.values():
            lines.append(f"run file: {rec.path}" + ("" if rec.doc.complete else "  (INCOMPLETE)"))
            for cname, c in rec.doc.configs.items():
                for lv, r in sorted(c.levels.items(), key=lambda kv: int(kv[0])):
                    lines.append(f"  {rec.doc.profile}/{cname} c{lv}: sustained {_fmt(r.sustained_output_tps)} ± "
                                 f"{_fmt(r.sustained_output_tps_ci95)} tok/s, whole-run "
                                 f"{_fmt(r.whole_run_output_tps)}"
                                 + (f", host CPU probe {r.host_cpu_speed:.3g}" if r.host_cpu_speed else "")
                                 + ("" if r.valid else "  INVALID: " + "; ".join(r.invalid_reasons)))
        if self.history_path:
            lines.append(f"history: {self.history_path} (sglperf drift {self.history_path})")
        lines += self.candidates + self.pushed
        lines += [f"cleaned up before this run: {c}" for c in self.cleaned]
        lines += [f"INFRASTRUCTURE: could not write: {p}" for p in self.late_problems]
        return lines


def _fmt(x) -> str:
    return "-" if x is None else format(x, ",.1f")
