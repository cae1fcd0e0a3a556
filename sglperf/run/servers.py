"""One config's server for the session (`ConfigRun`), and its life: launched or reached, learnt (flags, vocabulary,
fingerprint, ceiling), its output canary taken, restarted, torn down with its GPU-set lock released on every
path (`Servers`, the part of the session that owns servers)."""

from __future__ import annotations

from typing import Any


import os
import time
from dataclasses import dataclass, replace

from filelock import FileLock, Timeout

from .. import engines
from . import profiles
from ..environment import fingerprint, gpu, host_speed
from . import launch as launcher
from ..decide.health import canary_words, start_failure
from ..categories import InfraError, UsageError
from ..measure.canary import CanaryStalled, run_canary
from ..measure.client import Target, Workload
from ..measure.level import LevelMeasurement
from ..measure.negotiate import connect, vocabulary_problem
from ..redact import api_key_from_env, check_api_key, secrets
from ..store.recorder import ServerDoc
from ..store.rundoc import CanaryDoc
from ..records import Ceiling, LevelResult
from ..decide import evidence
from ..decide.health import CanaryVerdict, judge_canary





@dataclass
class ConfigRun:
    """One config's server for the session, and what the suite learned of it."""

    suite: Any  # the session that opened it (run/session.Suite): levels are measured and restarted through it
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
    hung: str | None = None  # why this server is known hung: nothing more is asked of it
    vocab_size: int | None = None  # the model's vocabulary, where the server says it: an id past it is garbage

    @property
    def where(self) -> str:
        return f"{self.profile.name}/{self.name}"

    @property
    def log_path(self) -> str | None:
        """The server log the suite wrote; for a server it did not start (--server-url), where to look instead."""
        return str(self.server.log_path) if self.server.log_path else "none written by the suite (--server-url: " \
                                                                      "the server's own log has the details)"

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
                    "not say how fast the machine is (two VMs of one CPU class can read the same levels 10-30% "
                    "apart): a floor from it could blame the server for the host. "
                    "Re-calibrate it on this host (`sglperf baseline calibrate RUN_FILES...`)")
        scores = self.suite.host_speeds or [now]
        mean, _ = host_speed.summarize(scores)
        return host_speed.outside(mean, bf.host_speed.score, bf.host_speed.cv, bf.host_speed.runs,
                                  probes=len(scores))

    def host_slower(self, bf) -> host_speed.SlowerHost | None:
        """How much slower than on the baseline's runs this host's CPU probed before this run's server starts (their
        geometric mean: one host, one speed), where that lies below the baseline's band; None where it does not, or
        where nothing says. A server on a GPU still schedules, tokenizes and serves HTTP on the CPU: a host probed a
        fifth slower reads GPU levels a few % low with nothing else named. Only probes taken as the baseline's were
        (no server running) weigh: one taken beside a live server measures that server too (an idle scheduler that
        spins makes it bimodal, and a server slowed into more CPU work would excuse its own drop); the level probes
        stay as evidence (docs/measurement.md, "A GPU server's share of the host's CPU")."""
        scores = self.suite.host_speeds
        if bf is None or bf.host_speed is None or not scores or fingerprint.cpu_class(self.hardware_class):
            return None
        now, _ = host_speed.summarize(scores)
        return host_speed.slower(now, bf.host_speed.score, bf.host_speed.cv, bf.host_speed.runs,
                                 follows=self.profile.measurement.host_cpu_share)

    def replicate_note(self, level: int) -> str:
        """What an undecided verdict adds: how often the level was re-measured, or why it was not."""
        key = (self.profile.name, self.name, level)
        done, refused = len(self.suite.replicates.get(key, [])), self.suite.replicate_refused.get(key)
        m = self.profile.measurement
        if refused:
            return f"not re-measured further: {refused}"
        if m.max_starts == 1:
            return ("re-run, or let the profile re-measure undecided levels after a server restart ([measurement] "
                    "max_starts)")
        return f"measured over {done + 1} server starts (the profile allows {m.max_starts})"

    def replicate(self, level: int, why: str) -> list[LevelMeasurement] | None:
        """The level's starts so far after one more (a server restart, then the level again), or None where the
        profile's max_starts or its start_budget_s allow no more."""
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
        return evidence.levels_over_starts(bf, self.name, self.suite.starts(self.profile.name, self.name), levels)

    def record_plateau(self, doc) -> None:
        """The plateau's verdict into the run file."""
        self.suite.recorder(self.profile).set_plateau(self.name, doc)

    def record_faster(self, level: int, text: str) -> None:
        """A level faster than its baseline, into the run file (and so the summary and the history)."""
        self.suite.recorder(self.profile).set_faster(self.name, level, text)

    def level_failure(self, m: LevelMeasurement) -> str | None:
        """Why this level cannot be judged (infrastructure or invalid), or None when it can."""
        return start_failure(self.where, m.result, self.log_path, self.canary_failure(f"{m.result.name}"))

    def canary_failure(self, what: str) -> str | None:
        v = self.canary_verdict
        return None if v is None or v.passed else canary_words(self.where, what, v.category)

    def server_count(self, r):
        return evidence.server_count(self, r)

    def noise(self, config: str, levels) -> dict:
        return evidence.baseline_noise(self.baseline()[0], config, levels)

    def ladder(self) -> list[int]:
        return self.suite.levels(self.profile)

    def measured(self) -> dict[int, LevelResult]:
        return self.suite.results(self.profile.name, self.name)

    def starts_of(self, level: int) -> list[LevelResult]:
        return self.suite.starts(self.profile.name, self.name).get(level, [])

    def sibling(self, config: str) -> "ConfigRun | None":
        return self.suite.config_run(self.profile.name, config)

    def record_ab(self, doc) -> None:
        self.suite.record_ab(self.profile, doc)


class Servers:
    """The session's servers: what `Suite` does to start, learn, restart and stop them."""

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
            a.split("=", 1)[1] for a in template
            if prof.server.api_key_flag and a.startswith(prof.server.api_key_flag + "=")]
        api_key = api_key_from_env() or check_api_key(given[0] if given else None, prof.server.api_key_flag or "")
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
                registry=o.reports_dir / ".servers", ready_line=engine.ready_line)
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
                                 server_env=dict(prof.server.env), host_speed=speed, workload=w.describe())
        isl, osl, tail = w.kv_basis()
        ceiling = engine.ceiling(conn.server_info, isl, osl)
        if ceiling is not None and tail:  # a length mix: the plateau's message says what the prediction assumed
            ceiling = replace(ceiling, basis=(
                f"the length mix's mean request, {isl} + {osl} tokens; at its 90th percentile, {tail} tokens, "
                f"{ceiling.kv * ceiling.tokens_per_request // tail} would fit"))
        run = ConfigRun(self, prof, cname, engine, server, conn.target, conn.workload, conn.server_info, ceiling, fp,
                        lock)
        run.vocab_size = conn.vocab_size
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
        m = run.profile.measurement
        try:  # a few greedy tokens: a server silent for the stall timeout is hung, not slow
            run.canary = run_canary(run.target, w, ids, texts, c.output_len,
                                    timeout=min(m.request_timeout_s, m.stall_timeout_s))
        except InfraError as e:
            run.canary_error = str(e)
            if isinstance(e, CanaryStalled):
                run.hung = (f"server stalled: no answer to the output canary's {c.output_len} greedy tokens within "
                            f"the stall timeout ({m.stall_timeout_s:g} s); nothing more is asked of it"
                            + (f". Server log: {run.log_path}" if run.log_path else " (a server the suite did not "
                               "start: its log is where it was started)"))
                run.canary_error = run.hung
            return False
        bf, _ = self.baseline(run)
        expected = bf.canary.get(run.name) if bf else None
        then = bf.canary_fingerprint.get(run.name) if bf else None
        run.canary_verdict = judge_canary(run.canary, c, vocab=vocab, expected=expected,
                                          env_diff=fingerprint.describe_diff(then, run.fingerprint)
                                          if then and expected else "")
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
        for name in ("server", "target", "workload", "server_info", "ceiling", "fingerprint", "lock", "hung"):
            setattr(run, name, getattr(fresh, name))
        run.starts += 1
        self.runs[(run.profile.name, run.name)] = run
