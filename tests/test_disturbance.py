"""A busy neighbour is never a regression: under a CPU hog on every core, each level passes or is INVALID naming
the disturbance; the run file keeps the host numbers of every level."""

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import user_env

ROOT = Path(__file__).resolve().parent.parent
HOG = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"  # stops by itself


def test_a_cpu_hog_on_every_core_gives_no_throughput_regression(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG.format(s=240)]) for _ in range(os.cpu_count() or 2)]
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "perf_tests", "-q", "-p", "no:randomly", "-m", "sim",
                            "--perf-config", "rr64-cds8", "--levels", "8,16", "--reports-dir",
                            str(tmp_path / "reports")], cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env=user_env())
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    out = p.stdout
    assert "THROUGHPUT REGRESSION" not in out, out[-3000:]
    doc = json.loads(next((tmp_path / "reports" / "runs").glob("*.json")).read_text())
    for lv, r in doc["configs"]["rr64-cds8"]["levels"].items():
        assert r["host"]["other_cores"] > 0.5, f"c{lv}: the hog shows in the level's host numbers: {r['host']}"
        assert any("disturbed: other processes used" in x for x in r["disturbances"]), r
    # every floor below (or straddling) its floor is INVALID naming the disturbance; one above it passed
    assert "disturbed: other processes used" in out or " failed" not in out
