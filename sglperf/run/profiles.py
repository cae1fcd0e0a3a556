"""Profiles: what to launch (engine, command, configs), what load to send (workload, levels) and how to measure.

TOML, validated on load: a malformed file, an unknown key or a bad value is a ProfileError naming file and field.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal  # noqa: F401

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from .. import engines
from ..categories import UsageError
from ..records import Rate
from ..measure.prompts import MAX_TOKENS

if TYPE_CHECKING:
    from ..measure.trace import Trace

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parents[2] / "profiles"
DEFAULT_PROFILE_FOR_MARKER = {"gpu8": "glm5-nvfp4-tp8", "sim": "sim-ci", "sim_long": "sim-long",
                              "cpu_engine": "cpu-llamacpp", "gpu1": "gpu1-llamacpp", "cpu_sglang": "cpu-sglang"}


class ProfileError(UsageError):
    """The profile cannot be used as written."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ServerSection(Strict):
    command: list[str]  # argv prefix; "{python}" is this interpreter
    model_path: str | None = None
    model_path_flag: str = "--model-path"
    model_path_env: str = "SGLPERF_MODEL_PATH"
    args: list[str] = []
    env: dict[str, str] = {}
    host: str = "127.0.0.1"
    launch_timeout_s: float = Field(3600.0, gt=0)
    terminate_timeout_s: float = Field(60.0, gt=0)
    api_key_flag: str | None = "--api-key"
    notes: list[str] = []

    @field_validator("command")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must name a program")
        return v


class WorkloadSection(Strict):
    isl: int = Field(gt=0, le=MAX_TOKENS)
    osl: int = Field(gt=0, le=MAX_TOKENS)
    api: Literal["sglang", "openai"] | None = None  # default: what the engine speaks natively
    prompt_format: Literal["ids", "text", "chat"] = "ids"  # text and chat need the model's tokenizer
    tokenizer: str | None = None  # a tokenizer.json, a directory with one, or a model in the local HF cache
    vocab_low: int = Field(1000, ge=0)
    vocab_high: int = Field(30000, gt=0)
    seed: int = 0
    request_rate: Literal["inf"] = "inf"  # closed loop at each level, as the seed (--request-rate 999)
    # "random": every prompt its own, as the seed's random 128/128 (prefix caching cannot help); "shared_prefix":
    # each prompt is one of `prefix_groups` system prompts of `prefix_tokens` tokens, then a question of its own
    # (isl - prefix_tokens), as bench_serving's generated-shared-prefix
    # "length_mix": each request's input and output lengths drawn log-normal around isl and osl as medians (spread
    # `length_sigma`), clipped at isl_max and osl_max (prompts.LengthMix says why)
    # "multi_turn": conversations, an agent's sessions: each virtual user (a level's concurrency counts users) sends
    # `turns` requests, each the whole history (earlier prompts and replies) and `turn_tokens` new tokens, the first
    # ISL tokens, `think_time_s` after each reply (prompts.MultiTurn)
    # "trace": a trace file (`trace`, relative to the profile's directory: Mooncake's JSON lines with `block_tokens` a
    # hash_id, or Azure's .csv; measure/trace.py)
    # replayed on its timestamps and looped, sped up so that each of the ladder's `rates` is its mean offered rate
    # (measure/trace.Trace); isl and osl are the longest input and output the trace may send
    kind: Literal["random", "shared_prefix", "length_mix", "multi_turn", "trace"] = "random"
    trace: str | None = None
    block_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    turns: int | None = Field(None, ge=2, le=256)
    turn_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    think_time_s: float | None = Field(None, ge=0, le=3600)
    prefix_groups: int | None = Field(None, ge=1, le=4096)
    prefix_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    length_sigma: float | None = Field(None, gt=0, le=3)
    isl_max: int | None = Field(None, ge=1, le=MAX_TOKENS)
    osl_max: int | None = Field(None, ge=1, le=MAX_TOKENS)
    _trace: Trace | None = PrivateAttr(None)  # read when the profile is (kind "trace")

    @model_validator(mode="after")
    def _replayed(self, info: ValidationInfo):
        """A trace is read with the profile, relative to its directory (load() says which): a trace that cannot be
        replayed is a profile that cannot be used, named before any server starts."""
        if self.kind != "trace":
            if (self.trace, self.block_tokens) != (None, None):
                raise ValueError(f"trace and block_tokens are for kind = \"trace\" (kind is {self.kind!r})")
            return self
        if self.trace is None:
            raise ValueError("kind = \"trace\" needs trace: a trace file (Mooncake's JSON lines, or Azure's .csv)")
        if self.prompt_format != "ids":
            raise ValueError("kind = \"trace\" builds prompts of token blocks: prompt_format \"ids\"")
        from ..measure import trace as tr

        where = Path((info.context or {}).get("dir", ".")) / self.trace
        try:
            self._trace = tr.load(where, self.block_tokens or tr.BLOCK_TOKENS)
        except tr.TraceError as e:
            raise ValueError(str(e).replace("--trace ", "")) from None
        isl, osl = self._trace.longest
        if isl > self.isl or osl > self.osl:
            raise ValueError(f"the trace sends up to {isl} tokens in and {osl} out: isl ({self.isl}) and osl "
                             f"({self.osl}) must be at least those")
        return self

    @model_validator(mode="after")
    def _range(self):
        if self.vocab_low >= self.vocab_high:
            raise ValueError(f"vocab_low ({self.vocab_low}) must be below vocab_high ({self.vocab_high})")
        shared = (self.prefix_groups, self.prefix_tokens)
        if self.kind == "shared_prefix":
            if None in shared:
                raise ValueError("kind = \"shared_prefix\" needs prefix_groups and prefix_tokens")
            if self.prefix_tokens >= self.isl:
                raise ValueError(f"prefix_tokens ({self.prefix_tokens}) must be below isl ({self.isl}): each prompt "
                                 f"ends in a question of its own")
        elif shared != (None, None):
            raise ValueError(f"prefix_groups and prefix_tokens are for kind = \"shared_prefix\" (kind is "
                             f"{self.kind!r})")
        mix = (self.length_sigma, self.isl_max, self.osl_max)
        if self.kind == "length_mix":
            if None in mix:
                raise ValueError("kind = \"length_mix\" needs length_sigma, isl_max and osl_max")
            if self.isl_max < self.isl or self.osl_max < self.osl:
                raise ValueError(f"isl_max ({self.isl_max}) and osl_max ({self.osl_max}) must be at least the "
                                 f"medians isl ({self.isl}) and osl ({self.osl})")
        elif mix != (None, None, None):
            raise ValueError(f"length_sigma, isl_max and osl_max are for kind = \"length_mix\" (kind is "
                             f"{self.kind!r})")
        return self._conversation()

    def _conversation(self):
        talk = (self.turns, self.turn_tokens)
        if self.kind != "multi_turn":
            if talk != (None, None) or self.think_time_s is not None:
                raise ValueError(f"turns, turn_tokens and think_time_s are for kind = \"multi_turn\" (kind is "
                                 f"{self.kind!r})")
            return self
        if None in talk:
            raise ValueError("kind = \"multi_turn\" needs turns and turn_tokens")
        if self.prompt_format != "ids":
            raise ValueError("kind = \"multi_turn\" sends each reply back as the server's ids: prompt_format \"ids\"")
        longest = self.conversation().longest_prompt(self.isl, self.osl)
        if longest + self.osl > MAX_TOKENS:
            raise ValueError(f"a conversation's last turn would be {longest + self.osl} tokens, past any context "
                             f"window ({MAX_TOKENS})")
        return self

    def conversation(self):
        from ..measure.prompts import MultiTurn

        return MultiTurn(self.turns, self.turn_tokens, self.think_time_s or 0.0) if self.kind == "multi_turn" else None

    def kv_basis(self) -> tuple[int, int, int | None]:
        """The input and output lengths the KV ceiling is predicted from: a length mix's mean request (what the pool
        holds on average), with its 90th percentile's tokens (None: every request is ISL + OSL)."""
        if self.kind == "multi_turn":  # the mean turn's prompt; a conversation's last turn holds the most
            mt = self.conversation()
            return (self.isl + (mt.turns - 1) * (self.osl + mt.turn_tokens) // 2, self.osl,
                    mt.longest_prompt(self.isl, self.osl) + self.osl)
        if self._trace is not None:
            return self._trace.kv_basis()
        if self.kind != "length_mix":
            return self.isl, self.osl, None
        from ..measure.prompts import LengthMix

        mix = LengthMix(self.length_sigma, self.isl_max, self.osl_max)
        drawn = [mix.lengths(self.isl, self.osl, self.seed, 1 << 20, k) for k in range(4096)]
        isl = round(sum(i for i, _ in drawn) / len(drawn))
        osl = round(sum(o for _, o in drawn) / len(drawn))
        return isl, osl, sorted(i + o for i, o in drawn)[int(0.9 * len(drawn))]

    def describe(self) -> str:
        """The workload in a few words, in the fingerprint: a baseline of one workload never judges another."""
        if self.kind == "shared_prefix":
            return (f"shared_prefix {self.isl}/{self.osl}: {self.prefix_groups} groups x {self.prefix_tokens}-token "
                    f"prefix")
        if self.kind == "multi_turn":
            return (f"multi_turn {self.isl}/{self.osl}: {self.turns} turns of {self.turn_tokens} new tokens, think "
                    f"{self.think_time_s or 0:g} s")
        if self._trace is not None:
            return self._trace.describe()
        if self.kind == "length_mix":
            return (f"length_mix {self.isl}/{self.osl}: log-normal sigma {self.length_sigma:g}, clipped at "
                    f"{self.isl_max}/{self.osl_max}")
        return f"random {self.isl}/{self.osl}"

    def client_workload(self, tokenizer: str | None = None):
        """The client's Workload; `tokenizer` overrides the profile's (paths differ between machines)."""
        from ..measure.client import Workload
        from ..measure.prompts import LengthMix, SharedPrefix
        from ..measure.prompts import Tokenizer

        name = tokenizer or self.tokenizer
        prefix = SharedPrefix(self.prefix_groups, self.prefix_tokens) if self.kind == "shared_prefix" else None
        mix = LengthMix(self.length_sigma, self.isl_max, self.osl_max) if self.kind == "length_mix" else None
        return Workload(self.isl, self.osl, seed=self.seed, vocab_low=self.vocab_low, vocab_high=self.vocab_high,
                        prompt_format=self.prompt_format, tokenizer=Tokenizer(name) if name else None,
                        shared_prefix=prefix, length_mix=mix, multi_turn=self.conversation(),
                        trace=self._trace)


# Keys a profile may still use for one release, and what replaced them (the deprecation line names the new key).
RENAMED = {"replicates": "max_starts", "replicate_budget_s": "start_budget_s"}
# Keys that left the schema: never set by a profile (or set only to their default), or not a profile's property.
RETIRED = {
    "steady_state_ratio": "the steady-state window is where in-flight requests stay at 90% of the target; "
                          "`sglperf bench --ratio` still sets it for an ad-hoc sweep",
    "client_procs": "the client's processes are a property of the machine that runs it: --client-procs",
}
DOCS = "docs/measurement.md"


class MeasurementSection(Strict):
    """How a level is measured and how its claims are decided. Every key's history is in docs/measurement.md."""

    # a level's bounds
    ci_target: float = Field(0.01, gt=0, le=0.5, description="the 95% interval half-width a level runs for, as a "
                             "share of its throughput (it stops sooner once every claim it feeds is decided)")
    level_min_seconds: float = Field(0.0, ge=0, description="the shortest a level's steady-state window may be")
    level_max_seconds: float = Field(600.0, gt=0, description="the longest a level may run")
    stall_timeout_s: float = Field(60.0, gt=0, description="seconds without a token from any request before the "
                                   "server is called hung")
    request_timeout_s: float = Field(3600.0, gt=0, description="the longest one request may take")
    # the verdicts' margins
    plateau_band: float = Field(0.07, gt=0, lt=1, description="how far a level past the ceiling may read from the "
                                "plateau's reference level")
    ab_margin: float = Field(0.05, ge=0, lt=1, description="the loss the tuned config may show where no gain is "
                             "expected; it must exceed the A/B's noise, else equal levels stay undecided")
    server_agreement: float = Field(0.02, gt=0, lt=1, description="how far the client's sustained tok/s may differ "
                                    "from the server's own count (widened by what the counter's timing allows)")
    default_tolerance: float = Field(0.05, gt=0, lt=1, description="a floor's tolerance where the baseline "
                                     "calibrated no noise (a baseline taken from one run)")
    min_tolerance: float = Field(0.03, ge=0, lt=1, description="the narrowest tolerance calibration may set "
                                 "(sglperf baseline calibrate --min-tolerance)")
    max_steal_share: float = Field(0.05, gt=0, lt=1, description="stolen CPU above this share of what the work "
                                   "wanted disturbs a level (lower for a server whose step loop is one thread the "
                                   "GPU waits on)")
    host_cpu_share: float = Field(1.0, ge=0, le=1, description="the largest share of a slower host CPU's deficit "
                                  "this server's throughput follows (1: all of it, a server bound by its host's "
                                  "Python; less for a model whose decode step is GPU time, measured on slower "
                                  "hosts): a floor missed by no more than that is INVALID naming the host")
    # restarts
    max_starts: int = Field(1, ge=1, le=10, description="server starts a level may be measured on, in all: an "
                            "undecided level is measured again after a restart (1: never)")
    start_budget_s: float = Field(900.0, ge=0, description="seconds a run may spend on such restarts and the levels "
                                  "they re-measure")

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data):
        """Old keys still load, each with one deprecation line naming its replacement."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in RENAMED.items():
            if old in data:
                if new in data:
                    raise ValueError(f"{old} and {new} are one key ({old} is its old name): give only {new}")
                deprecated(f"[measurement] {old} is deprecated: use {new} (same meaning); the old name is read for "
                           f"one release")
                data[new] = data.pop(old)
        for old, why in RETIRED.items():
            if old in data:
                deprecated(f"[measurement] {old} is no longer a profile key and is ignored: {why}")
                data.pop(old)
        return data

    @classmethod
    def check(cls, key: str, value, option: str):
        """A command-line override of `key`, validated by the key's own field: one default, one range, one message."""
        from pydantic import TypeAdapter

        field = cls.model_fields[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = 0.0  # not a number at all: the field's own check says so
        if not math.isfinite(number):  # before the range: nan is not "above the maximum", it is no number
            raise UsageError(f"{option} {value}: input should be a finite number ({field.description})")
        try:
            return TypeAdapter(Annotated.__class_getitem__((field.annotation, *field.metadata))).validate_python(value)
        except ValidationError as e:
            raise UsageError(f"{option} {value}: {e.errors()[0]['msg'].lower()} ({field.description})") from None

    @staticmethod
    def argtype(key: str, option: str):
        return _argtype(key, option)


def _argtype(key: str, option: str):
    """An argparse type for a command-line override of `key`: parsed and checked by the key's own field."""
    import argparse

    def parse(text: str):
        try:
            return MeasurementSection.check(key, text, option)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def deprecated(line: str) -> None:
    """One line on stderr per old key and process: a run keeps working while its profile is updated."""
    if line not in _SAID:
        _SAID.add(line)
        print(f"sglperf: {line}", file=sys.stderr)


_SAID: set[str] = set()


def knob_table() -> str:
    """The [measurement] keys as a Markdown table (README.md holds it; tests/test_profiles.py keeps them equal)."""
    rows = ["| key | default | what it sets |", "| --- | --- | --- |"]
    for name, f in MeasurementSection.model_fields.items():
        rows.append(f"| `{name}` | {f.default:g} | {f.description} |")
    return "\n".join(rows)


class CanarySection(Strict):
    """A few fixed greedy requests at concurrency 1 before each config's ladder (judge/canary.py): their output
    must not be degenerate, must match the baseline's first `compare_tokens` ids where it holds them, and each
    `expect` regex (one per prompt, for real models with known answers) must match its text."""

    enabled: bool = True
    count: int = Field(3, ge=1, le=32)  # prompts drawn from the workload's id range with `seed`, unless given
    seed: int = 1234
    input_len: int = Field(16, ge=1)
    output_len: int = Field(16, ge=2)
    prompts: list[list[int]] | None = None  # token ids, one list per prompt
    texts: list[str] | None = None  # or text prompts (servers with a tokenizer)
    expect: list[str | None] | None = None
    max_top_share: float = Field(0.9, gt=0, le=1)
    min_distinct: int = Field(2, ge=1)
    compare_tokens: int = Field(8, ge=1)
    # A fresh server start between the canary and the ladder, where the canary's few requests leave the server in a
    # state a fresh start is not in (llama.cpp's c8 reads a third slower after any few requests: docs/gpu-proof.md).
    # Costs one server start per config.
    restart_after: bool = False

    def prompt_ids(self, low: int, high: int) -> list[list[int]]:
        import numpy as np

        if self.prompts is not None:
            return self.prompts
        rng = np.random.default_rng(self.seed)
        return [rng.integers(low, high, self.input_len).tolist() for _ in range(self.count)]


class SloSection(Strict):
    """The service-level objective goodput counts against: per request, TTFT and TPOT at or below these (ms). Named
    for the percentile the SLO is meant at (MLPerf's server scenario caps p99 TTFT and TPOT)."""

    ttft_ms_p99: float | None = Field(None, gt=0)
    tpot_ms_p99: float | None = Field(None, gt=0)


class HardwareSection(Strict):
    """What the profile needs: `gpus` GPUs whose name contains `gpu_kind` (none for CPU engines and the simulator).
    The preflight checks it; without such GPUs every item skips with the reason."""

    gpus: int = Field(0, ge=0)
    gpu_kind: str | None = None


class ConfigSection(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    args: list[str] = []
    description: str = ""


class ABSection(Strict):
    base: str
    tuned: str
    # "judged": the tuned config loses no more than ab_margin at any level, and gains past the base's ceiling.
    # "shown": below the base's ceiling the levels are measured and shown, not judged: for an engine where the tuned
    # config costs there by design (llama.cpp's 8 slots against 4: profiles/cpu-llamacpp.toml), only the gain is
    # the A/B's claim.
    below_cap: Literal["judged", "shown"] = "judged"


class Profile(Strict):
    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # it names files: logs, baselines, run files
    description: str = ""
    engine: str
    marker: Literal["gpu8", "gpu1", "sim", "sim_long", "cpu_engine", "cpu_sglang"]
    hardware: HardwareSection = HardwareSection()
    server: ServerSection
    workload: WorkloadSection
    measurement: MeasurementSection = MeasurementSection()
    slo: SloSection | None = None
    canary: CanarySection = CanarySection()
    levels: list[int] = Field([], description="the ladder's concurrencies (a closed loop)")
    rates: list[int] = Field([], description="the ladder's offered request rates, req/s with Poisson arrivals (an "
                                             "open loop), instead of levels")
    configs: list[ConfigSection]
    ab: ABSection | None = None
    notes: list[str] = []

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in engines.NAMES:
            raise ValueError(f"unknown engine {v!r} (known: {', '.join(engines.NAMES)})")
        return v

    @field_validator("levels", "rates")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError("must be positive: concurrencies (levels) or requests per second (rates)")
        return sorted(set(v))

    @model_validator(mode="after")
    def _ladder(self):
        """One ladder of one kind: `levels` (concurrencies) or `rates` (offered req/s). A rate profile's levels are
        its rates as records.Rate, so every level-keyed record and message works for both and names each right."""
        if bool(self.levels) == bool(self.rates):
            raise ValueError("give the ladder as either levels (concurrencies) or rates (requests per second), "
                             "exactly one of them, non-empty")
        if self.workload.kind == "trace" and not self.rates:
            raise ValueError("a trace is replayed at offered rates: give the ladder as rates (its mean req/s)")
        if self.rates:
            self.__dict__["levels"] = [Rate(x) for x in self.rates]
        return self

    def ladder(self, override=()) -> list[int]:
        """The levels a run measures: `override` (--levels) read as this profile's kind of level, else its own."""
        return [Rate(x) if self.rates else int(x) for x in override] if override else list(self.levels)

    @model_validator(mode="after")
    def _configs(self):
        names = [c.name for c in self.configs]
        if not names:
            raise ValueError("configs: at least one config is needed")
        if len(set(names)) != len(names):
            raise ValueError(f"configs: names must be unique, got {names}")
        if self.ab and not {self.ab.base, self.ab.tuned} <= set(names):
            raise ValueError(f"ab: base and tuned must name configs of this profile ({names})")
        return self

    def config(self, name: str) -> ConfigSection:
        for c in self.configs:
            if c.name == name:
                return c
        raise ProfileError(f"profile {self.name!r} has no config {name!r} (it has {[c.name for c in self.configs]})")

    def adapter(self) -> engines.Engine:
        return engines.get(self.engine)

    def model_path(self, override: str | None = None) -> str | None:
        return override or os.environ.get(self.server.model_path_env) or self.server.model_path

    def launch_argv(self, config: str, *, model_path: str | None = None, extra: list[str] = (),
                    api_key: str | None = None, resolve: bool = True) -> list[str]:
        """The argv of one config, without host and port (the launcher adds them). resolve=False keeps the
        placeholders ({python}, {llama_server}, …) as written: the same in every checkout (fingerprint hash)."""
        fix = self.adapter().resolve if resolve else (lambda part: part)
        argv = [fix(part) for part in self.server.command]
        mp = self.model_path(model_path)
        if mp:
            argv += [self.server.model_path_flag, fix(mp)]
        argv += [fix(part) for part in [*self.server.args, *self.config(config).args, *extra]]
        if api_key and self.server.api_key_flag:
            argv += [self.server.api_key_flag, api_key]
        return argv


def profile_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or "/" in name_or_path:
        return p
    return PROFILE_DIR / f"{name_or_path}.toml"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def load(name_or_path: str) -> Profile:
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ProfileError(f"profile {name_or_path!r} not found at {path} (available: {', '.join(available())})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML: {e}") from None
    try:
        return Profile.model_validate(data, context={"dir": path.parent})
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = "unknown key (not part of the profile schema)" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{path}: {where}: {msg}")
        raise ProfileError("\n".join(lines)) from None
