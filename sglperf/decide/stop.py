"""When a level may stop before its interval reaches the profile's ci_target: a claim of its own, decided here
with the rules it stands on (judge/floor.py, judge/plateau.py), so run/ measures and asks, and decides nothing."""

from __future__ import annotations

from ..judge import plateau
from ..judge.floor import decides_floor
from ..records import Ceiling, LevelResult


def level_stop(bf, config: str, level: int, levels: list[int], ceiling: Ceiling | None, band: float,
               start: dict[int, LevelResult]):
    """Once the level's floor is decided, and at a level the plateau compares also once its interval is narrow
    enough for that (cpu-sglang rr32 c48 stopped after 7 s at ±9.8% on its floor alone, and the plateau could not
    tell -5% from -15%), or once its ratios to the plateau's levels already measured (undisturbed) on this server
    `start` are decided; how narrow is the share of the band the ratios the baseline `bf` measured among those
    levels allow. No baseline entry: None, the level runs to its precision."""
    entry = bf.entries(config, level).get("sustained_output_tps") if bf else None
    if entry is None:
        return None
    compared = [lv for lv in levels if plateau.plateau_compares(lv, ceiling, levels)]
    if level not in compared:
        return decides_floor(entry.floor)
    earlier = [r for lv, r in sorted(start.items()) if r.valid and not r.disturbances and lv < level and lv in compared]
    means = [e.value for lv in compared if (e := bf.entries(config, lv).get("sustained_output_tps"))]
    return plateau.decides_plateau_level(entry.floor, band, earlier, share=plateau.plateau_share(band, means))
