"""What a claim is decided on, as the session hands it in: one config's server over the run (its levels' starts so
far, one more start on request, the baseline, the host's state). run/servers.ConfigRun is the live one;
decide/replay.py reads the same from a stored run file, so a recorded run is judged by the very loop that judged it
live. Typed as a Protocol: decide/ imports nothing of run/."""

from __future__ import annotations

from typing import Any, Protocol


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
