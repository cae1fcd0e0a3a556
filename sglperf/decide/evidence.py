"""What a claim is decided on, as the session hands it in: one config's server over the run (its levels' starts so
far, one more start on request, the baseline, the host's state, and the profile's other configs for the A/B).
run/servers.ConfigRun is the live one; decide/replay.py reads the same from a stored run file, so a recorded run is
judged by the very loop that judged it live. Typed as a Protocol: decide/ imports nothing of run/."""

from __future__ import annotations

from typing import Any, Protocol

from ..judge.count import CountVerdict, check_server_count
from ..judge.noise import Noise
from ..judge.noise import of as noise_of
from ..judge.starts import over_starts
from ..records import LevelResult


class Evidence(Protocol):
    name: str  # the config
    hardware_class: str
    profile: Any  # run/profiles.Profile: its measurement section's margins and starts
    fingerprint: dict
    ceiling: Any  # records.Ceiling | None
    starts: int  # server starts of this config so far

    @property
    def where(self) -> str: ...  # "profile/config", for messages

    @property
    def log_path(self) -> str | None: ...

    def measure(self, level: int) -> Any: ...  # the level's first start (measure/level.LevelMeasurement)

    def level_starts(self, level: int) -> list: ...  # its starts so far, in order

    def replicate(self, level: int, why: str) -> list | None: ...  # its starts after one more, or None: no more

    def replicate_levels(self, levels: list[int], why: str) -> dict | None: ...  # all of them on one more start

    def replicate_note(self, level: int) -> str: ...  # how often it was re-measured, or why not

    def baseline(self) -> tuple[Any, Any]: ...  # (store/baselines.BaselineFile | None, its path)

    def host_outside(self, bf) -> str | None: ...  # why the baseline never measured this host's CPU

    def host_slower(self, bf) -> Any: ...  # environment/host_speed.SlowerHost | None

    def level_failure(self, m) -> str | None: ...  # why a start cannot be judged (infrastructure, invalid, canary)

    def canary_failure(self, what: str) -> str | None: ...

    def over_starts(self, levels: list[int]) -> dict | None: ...  # levels over all their starts, with the noise

    def noise(self, config: str, levels) -> dict: ...

    def server_count(self, r) -> Any: ...  # judge/count.CountVerdict

    def record_plateau(self, doc) -> None: ...  # the plateau's verdict into the run file

    def record_faster(self, level: int, text: str) -> None: ...  # a level faster than its baseline: news

    # the profile-wide claims (the A/B) read the other configs of the run through the one they are handed
    def ladder(self) -> list[int]: ...  # the levels this run measures of the profile

    def measured(self) -> dict[int, LevelResult]: ...  # each level measured so far: its first start (nothing measured)

    def starts_of(self, level: int) -> list[LevelResult]: ...  # every start of a measured level the run holds

    def sibling(self, config: str) -> "Evidence | None": ...  # another config of the profile in this run, or None

    def record_ab(self, doc) -> None: ...  # the A/B's verdict into the run file


# What every Evidence answers the same way, live or replayed: computed here once, so run/servers.ConfigRun and
# decide/replay.RecordedConfig cannot drift apart (they held two copies of each).

def baseline_noise(bf, config: str, levels) -> dict[int, Noise]:
    """The between-start noise the baseline `bf` calibrated for `config`'s levels (judge/noise.py), where it did."""
    out = {}
    for lv in levels:
        e = bf.entries(config, lv).get("sustained_output_tps") if bf else None
        if e is not None and (n := noise_of(e)) is not None:
            out[lv] = n
    return out


def levels_over_starts(bf, config: str, starts: dict[int, list[LevelResult]], levels: list[int]
                       ) -> dict[int, LevelResult] | None:
    """`levels` over all their server starts with the baseline's between-start noise (judge/starts.over_starts), or
    None where the baseline calibrated none."""
    if bf is None:
        return None
    return over_starts({lv: starts[lv] for lv in levels if lv in starts}, baseline_noise(bf, config, levels))


def server_count(ev, r: LevelResult) -> CountVerdict:
    """The client's sustained tok/s against the server's own count over the same window (judge/count.py)."""
    return check_server_count(r, where=ev.where, tolerance=ev.profile.measurement.server_agreement,
                              cap=ev.ceiling.effective if ev.ceiling else None)
