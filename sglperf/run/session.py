"""A run without pytest: profiles, levels and configs to run, one server per config (launched,
probed, fingerprinted, torn down), the measurement cache shared by a level's tests, recording, history, candidate
baselines and the Allure side files. Raises sglperf errors (categories.py); the pytest layer only translates them.

Why here: everything a run does must be testable and reusable without pytest, and every started server and every
lock must be released on every path, which is easiest to see in one place.
"""

from __future__ import annotations


import time
from dataclasses import replace
from pathlib import Path


from ..store import baselines, fleet, history
from ..interrupts import defer, resume
from . import profiles
from ..environment import fingerprint, host_speed
from ..environment.host import open_files_problem
from ..report import allure as report
from . import launch as launcher
from ..fileio import check_writable
from ..categories import InfraError, UsageError
from ..measure.shards import parse_client_procs, resolve_client_procs
from ..measure.level import LevelMeasurement, LevelSpec, ServerWatch, run_level
from ..measure.metrics import MeasurementPolicy
from ..measure.workload_metrics import trace_line, turn_table
from ..redact import api_key_from_env, argv_secrets, env_secrets, redact, register, url_secrets
from ..store.recorder import RunRecorder, mark_abandoned
from ..records import LevelResult, Rate, level_name, start_allowed
from ..decide.stop import level_stop



from ..decide.health import count_checked, degenerate_levels, outputs_checked, pin_checked
from .options import SuiteOptions
from .servers import ConfigRun, Servers

THE_RUN = "the interrupted run (its servers torn down, its run file written)"


class Suite(Servers):
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
        # moves ±5% on a host with noisy neighbours, and a config whose lone probe fell just inside the band would be
        # judged while the one before was not.
        self.host_speeds: list[float] = []
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
        register(*url_secrets(opts.server_url or ""))  # http://user:PASSWORD@host: a password in the server's URL
        api_key_from_env()  # a key no HTTP header can carry is refused before anything starts

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
            fingerprint.accept_pin(prof.server.env)  # a pin the server refuses or clamps: a usage error, here
        return self._profiles[name]

    def levels(self, profile: profiles.Profile) -> list[int]:
        return profile.ladder(self.opts.levels)

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
        return MeasurementPolicy(ci_target=self.opts.ci_target or m.ci_target, max_steal_share=m.max_steal_share,
                                 server_agreement=m.server_agreement,
                                 slo_ttft_ms=slo.ttft_ms_p99 if slo else None,
                                 slo_tpot_ms=slo.tpot_ms_p99 if slo else None)

    def recorder(self, profile: profiles.Profile) -> RunRecorder:
        if profile.name not in self.recorders:
            self.recorders[profile.name] = RunRecorder(self.opts.reports_dir, profile.name, profile.engine,
                                                       self.opts.recorded(),
                                                       notes=list(profile.notes) + list(profile.server.notes)
                                                       + [f"before this run: {c}" for c in self.cleaned])
        return self.recorders[profile.name]

    def order(self, pname: str, cname: str | None, level: int | None, measures: bool) -> tuple:
        """Where a perf item runs: configs never flip-flop (each config's levels in order, the measuring test first,
        then its plateau), and a profile's A/B after its configs."""
        inf = float("inf")
        rank = {n: i for i, n in enumerate(self.profile_names())}.get(pname, 99)
        if cname is None:
            return (rank, inf, inf, 0)
        cidx = [c.name for c in self.profile(pname).configs].index(cname)
        return (rank, cidx, inf if level is None else level, 0 if measures else 1)

    def record_ab(self, profile: profiles.Profile, doc) -> None:
        """The A/B's verdict into the profile's run file."""
        self.recorder(profile).set_ab(doc)

    def check_outputs(self) -> None:
        """Every place this run will write is writable now, not after an hour of measuring."""
        o = self.opts
        check_writable(o.reports_dir / "runs", f"the reports directory {o.reports_dir}", "--reports-dir")
        hist = Path(o.history_file or history.default_path(o.reports_dir))
        if hist.is_dir():
            raise UsageError(f"--history-file {hist} is a directory; give the JSONL file to append to (e.g. "
                             f"{hist / 'history.jsonl'})")
        check_writable(hist.parent, "the history file's directory", "--history-file")
        if o.allure_dir is not None:
            check_writable(o.allure_dir, "the Allure results directory", "--alluredir")
        if o.update_baselines:
            for pname in self.profile_names():
                d = (Path(o.baseline_file).parent if o.baseline_file
                     else baselines.BASELINE_DIR / self.profile(pname).name)
                check_writable(d, "the baselines directory (for --update-baselines)", "--baseline-file")

    def check_open_files(self, pnames: set[str]) -> None:
        """The largest level of each profile fits the open-file limit, before any server starts."""
        setting = parse_client_procs(self.opts.client_procs)
        for pname in sorted(pnames):
            prof = self.profile(pname)
            levels = self.levels(prof)
            procs = setting if isinstance(setting, int) else 1
            procs = procs if isinstance(procs, int) else 1
            where = "--levels" if self.opts.levels else f"profile {prof.name}'s level"
            top = max(levels) if levels else None
            why = open_files_problem(top, procs, f"{where} {top}", rate=isinstance(top, Rate)) if top else None
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

    def replicate(self, run: ConfigRun, level: int, why: str) -> list[LevelMeasurement] | None:
        if self.replicate_levels(run, [level], why) is None:
            return None
        return self.level_starts(run, level)

    def level_starts(self, run: ConfigRun, level: int) -> list[LevelMeasurement]:
        return [self.measure(run, level), *self.replicates.get((run.profile.name, run.name, level), [])]

    def replicate_levels(self, run: ConfigRun, levels: list[int], why: str) -> dict[int, LevelMeasurement] | None:
        """One more server start that measures all of `levels` (recorded as their replicates): what a comparison
        between levels re-measures, so that it compares levels of one start, where what differs between starts
        cancels. None where the profile's max_starts or its start_budget_s allow no more."""
        m = run.profile.measurement
        keys = [(run.profile.name, run.name, lv) for lv in levels]
        if self.opts.server_url or not all(start_allowed(1 + len(self.replicates.get(k, [])), m.max_starts)
                                               for k in keys):
            return None
        firsts = [self.measure(run, lv) for lv in levels]
        spent = self.replicate_spent.get(run.profile.name, 0.0)
        cost = sum(f.result.duration_s for f in firsts) + self.launch_s.get(keys[0][:2], 0.0)
        if spent + cost > m.start_budget_s:
            left = m.start_budget_s - spent
            for k in keys:
                self.replicate_refused[k] = (f"another start of {', '.join(map(level_name, levels))} would take "
                                             f"~{cost:.0f} s and the run has {left:.0f} s of its start_budget_s "
                                             f"({m.start_budget_s:g} s) left")
            return None
        t0 = time.monotonic()
        self.restart(run)
        out = {}
        for k, lv in zip(keys, levels):
            meas = self._measure(run, lv)
            self.replicates.setdefault(k, []).append(meas)
            self.recorder(run.profile).add_replicate(run.name, lv, meas.result, meas.records, meas.server_samples,
                                                     meas.stop_reason, meas.scrape_source, meas.extra["epoch_ms"],
                                                     why, server_start=run.starts)
            if meas.stop_reason == "interrupted":  # saved; no further level of this replicate is measured
                self.interrupted = True
                defer(THE_RUN)  # until finish() has torn the servers down and written the run file
                raise KeyboardInterrupt(f"interrupted during {run.where} {level_name(lv)} (server start "
                                        f"{run.starts}); its partial result is saved, marked incomplete")
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
                                             meas.stop_reason, meas.scrape_source, meas.extra["epoch_ms"],
                                             server_start=run.starts)
        if meas.stop_reason == "interrupted":
            self.interrupted = True
            defer(THE_RUN)  # until finish() has torn the servers down and written the run file
            raise KeyboardInterrupt(f"interrupted during {run.where} {level_name(level)}; its partial result is saved, "
                                    f"marked incomplete")
        return meas

    def _measure(self, run: ConfigRun, level: int) -> LevelMeasurement:
        key = (run.profile.name, run.name, level)
        dead = run.server.crash_reason() or run.hung
        if dead:
            raise InfraError(dead)
        m = run.profile.measurement
        load = dict(rate=float(level)) if isinstance(level, Rate) else dict(concurrency=level)
        spec = LevelSpec(**load, max_seconds=self.opts.level_max_seconds or m.level_max_seconds,
                         min_seconds=m.level_min_seconds, stall_timeout_s=m.stall_timeout_s,
                         request_timeout_s=m.request_timeout_s)
        bf, _ = self.baseline(run)
        start = self.on_start.setdefault((run.profile.name, run.name, run.starts), {})
        done = sorted(lv for (p, c, lv) in self.measurements if (p, c) == key[:2] and lv < level)
        procs = resolve_client_procs(parse_client_procs(self.opts.client_procs) or 1, level,
                                     self.measurements[key[:2] + (done[-1],)].result if done else None)
        # the CPU's speed just before a GPU server's level, beside the live server: evidence in the level's record
        # and summary (both kinds of server are judged by the probes before their starts: ConfigRun.host_slower)
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
        meas.result = pin_checked(run, outputs_checked(run, meas, count_checked(run, meas.result)))
        start[level] = meas.result
        if meas.stop_reason == "stall":  # hung: the next level would only wait out its own stall timeout
            run.hung = (f"{run.where}: server stalled during {level_name(level)} "
                        f"({(meas.result.note or '').removeprefix('server stalled: ')}); nothing more is asked of this "
                        f"server start")
        return meas

    def decides(self, run: ConfigRun, level: int, bf, start: dict[int, LevelResult]):
        """When a level may stop before its interval reaches the profile's ci_target (decide/stop.py)."""
        return level_stop(bf, run.name, level, self.levels(run.profile), run.ceiling,
                          run.profile.measurement.plateau_band, start)

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

    def check_baselines(self) -> None:
        """Load every baseline that may judge this run before any server starts: --baseline-file, else each
        hardware class's file of the profiles named (candidates aside). A broken one is a usage error naming it,
        not a failure of every floor after launch."""
        if self.opts.baseline_file:
            baselines.load(self.opts.baseline_file)
            return
        for name in self.profile_names():
            for path in sorted((baselines.BASELINE_DIR / self.profile(name).name).glob("*.json")):
                if ".candidate" not in path.name:
                    baselines.load(path)

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
        when another failed; failures are collected in `late_problems`. Ctrl-C is noted, not raised, until they are
        written (an impatient user's second one left the run file saying `running` and a server up)."""
        interrupted = interrupted or self.interrupted
        if interrupted:
            defer(THE_RUN)
        try:
            self._finish(interrupted)
        finally:
            resume()

    def _finish(self, interrupted: bool) -> None:
        for run in self.runs.values():  # a server restarted after its config's tests ended (an A/B re-measure)
            if run.server.teardown is None:
                try:
                    self.close_config(run)
                except (OSError, InfraError) as e:
                    self.late_problems.append(f"{type(e).__name__}: {e}")
        for rec in self.recorders.values():
            self._try(lambda rec=rec: rec.finish("interrupted" if interrupted else "finished", not interrupted))
            self.late_problems += [f"{path}: {why}" for path, why in rec.unwritten.items()]
            wrong = rec.canary_failed() + degenerate_levels(rec)
            if wrong:  # fast but wrong: shown in the run file, never history or a baseline
                self.withheld.append(f"{rec.doc.profile}: output canary failed ({'; '.join(wrong)}): "
                                     f"this run's numbers are not appended to the history and make no candidate "
                                     f"baseline")
                continue
            if any(c.levels for c in rec.doc.configs.values()):
                path = Path(self.opts.history_file or history.default_path(self.opts.reports_dir))
                if self._try(lambda rec=rec, path=path: history.append(path, history.record_from_run(rec.doc))):
                    self.history_path = path  # the summary names the history only where this run's line is in it
        if self.opts.results_db:
            for rec in self.recorders.values():
                if any(c.levels for c in rec.doc.configs.values()):
                    self.push_results(rec)
        if self.opts.allure_dir is not None and self.recorders:
            self._try(self.write_allure_files)
        if self.opts.update_baselines and not interrupted:
            for name, rec in self.recorders.items():
                if rec.canary_failed() or degenerate_levels(rec):
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

    def _try(self, step) -> bool:
        """Run one writer of the run's end; False, its failure collected, where it failed."""
        try:
            step()
        except (OSError, UsageError) as e:
            self.late_problems.append(f"{type(e).__name__}: {e}")
            return False
        return True

    def write_allure_files(self) -> None:
        report.write_run_files(self.opts.allure_dir, [rec.doc for rec in self.recorders.values()])
        report.redact_results(self.opts.allure_dir)

    def write_candidate(self, profile_name: str, rec: RunRecorder) -> str:
        prof = self.profile(profile_name)
        explicit = Path(self.opts.baseline_file) if self.opts.baseline_file else None
        return baselines.write_candidate(rec.doc, tolerance=prof.measurement.default_tolerance, isl=prof.workload.isl,
                                         osl=prof.workload.osl, reviewed=explicit)

    def summary_lines(self) -> list[str]:
        lines = [f"OUTPUT CANARY FAILED: {w}" for w in self.withheld]
        lines += [f"GPU FAULT: {rec.doc.profile}/{cname} {r.name}: {f} (the level is INVALID)"
                  for rec in self.recorders.values() for cname, c in rec.doc.configs.items()
                  for lv, r in sorted(c.levels.items(), key=lambda kv: int(kv[0])) for f in r.gpu_faults]
        for rec in self.recorders.values():
            lines.append(f"run file: {rec.path}" + ("" if rec.doc.complete else "  (INCOMPLETE)"))
            for cname, c in rec.doc.configs.items():
                for lv, r in sorted(c.levels.items(), key=lambda kv: int(kv[0])):
                    lines.append(f"  {rec.doc.profile}/{cname} {r.name}: sustained "
                                 f"{_fmt(r.sustained_output_tps)} ± "
                                 f"{_fmt(r.sustained_output_tps_ci95)} tok/s, whole-run "
                                 f"{_fmt(r.whole_run_output_tps)}"
                                 + (f", host CPU probe {r.host_cpu_speed:.3g}" if r.host_cpu_speed else "")
                                 + ("" if r.valid else "  INVALID: " + "; ".join(r.invalid_reasons)))
                    if c.faster.get(str(lv)):
                        lines.append(f"    {c.faster[str(lv)]}")
                    if r.by_turn:
                        lines += turn_table(r.by_turn)
                    if line := trace_line(r):
                        lines.append(f"    {line}")
        if self.history_path:
            lines.append(f"history: {self.history_path} (sglperf drift {self.history_path})")
        lines += self.candidates + self.pushed
        lines += [f"cleaned up before this run: {c}" for c in self.cleaned]
        lines += [f"INFRASTRUCTURE: could not write: {p}" for p in self.late_problems]
        return lines


def _fmt(x) -> str:
    return "-" if x is None else format(x, ",.1f")
