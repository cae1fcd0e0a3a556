#!/usr/bin/env python3
"""Write tests/slow.txt from the `--durations=0` output of a whole `pytest tests` run: every test whose setup, call
and teardown took 2 s or more together (it starts servers, suites or builds), one node id (no parameters) a line.

    pytest tests -q --durations=0 > durations.log; python3 ci/list-slow-tests.py durations.log
"""

import re
import sys
from collections import defaultdict
from pathlib import Path

LIMIT_S = 2.0
ROW = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")


def main(log: str) -> None:
    took: dict[str, float] = defaultdict(float)
    for line in Path(log).read_text(errors="replace").splitlines():
        m = ROW.match(line)
        if m:
            took[m.group(3).split("[")[0]] += float(m.group(1))
    slow = sorted(t for t, s in took.items() if s >= LIMIT_S)
    out = Path(__file__).resolve().parents[1] / "tests" / "slow.txt"
    out.write_text(f"# tests that took {LIMIT_S:g} s or more (ci/list-slow-tests.py): pytest tests -m 'not slow' "
                   f"leaves them out\n" + "".join(t + "\n" for t in slow))
    print(f"{len(slow)} slow tests of {len(took)} timed, {sum(took[t] for t in slow):.0f} s of "
          f"{sum(took.values()):.0f} s -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
