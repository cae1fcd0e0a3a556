"""`sglperf report`: the Allure HTML report, offline, with the pinned npm `allure` (ci/allure/package.json and its
lockfile), one metric declaration per perf key (unit and direction), the failure categories, a history file kept
across runs, and the analytics tag removed from every page.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from filelock import FileLock

from ..records import METRICS
from .allure import CATEGORIES

ALLURE_DIR = Path(__file__).resolve().parents[2] / "ci" / "allure"
GTAG = re.compile(r"^.*googletagmanager\.com/gtag.*$\n?", re.M)


class ReportError(RuntimeError):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="reports/allure-results", help="allure results (pytest --alluredir)")
    p.add_argument("--output", default="reports/allure-report")
    p.add_argument("--history", default="reports/allure-history.jsonl",
                   help="Allure history kept across runs (one line appended per report)")
    p.add_argument("--single-file", action="store_true", help="one index.html that opens from file://")
    p.add_argument("--name", default=None, help="report/run name shown in the history (default: from CI or date)")


def metric_declarations(results: Path) -> dict:
    """Every key found in *-perf.json, declared with its unit and direction (undeclared keys show raw)."""
    keys = set()
    for f in results.glob("*-perf.json"):
        try:
            keys |= {e["key"] for e in json.loads(f.read_text())}
        except (ValueError, KeyError, TypeError) as e:
            raise ReportError(f"{f}: not an Allure perf metrics file ({e})") from None
    metrics = {}
    for k in sorted(keys):
        kind, _, rest = k.partition(".")
        if kind in KINDS:
            title, unit, better, group = KINDS[kind]
            metrics[k] = {"title": f"{rest.replace('.', ' ')}: {title}", "unit": unit, "better": better, "group": group}
    return metrics


# The report's chart groups, by metric: a metric not named here is throughput (or latency, or goodput)
GROUPS = {"throughput": "Sustained output throughput per config and level",
          "latency": "Latency per config and level: TTFT mean and p99, TPOT p99",
          "goodput": "Goodput under the profile's SLO per config and level",
          "speculative": "Speculative decoding: accepted tokens per verify step",
          "prefix_cache": "Shared prefixes: share of prompt tokens served from the prefix cache"}
GROUP_OF = {"acceptance_length": "speculative", "prefix_cache_share": "prefix_cache"}


def _group(m) -> str:
    return "latency" if m.is_latency else GROUP_OF.get(m.name, "goodput" if m.name.startswith("goodput") else
                                                       "throughput")


# Allure trend key (report.metric_key) -> title, unit, direction, group: from records.METRICS
KINDS = {m.trend: (m.title, m.unit, m.better, _group(m)) for m in METRICS.values() if m.trend}


def config(results: Path, output: Path, history: Path, name: str, single_file: bool) -> dict:
    return {
        "name": name,
        "output": str(output),
        "historyPath": str(history),
        "historyLimit": 100,
        # awesome: the report; dashboard: its charts, and with two report plugins Allure writes a root summary page
        # (OUT/index.html); csv: one row per test for machines. Single-file mode is the awesome report alone.
        "plugins": ({"awesome": {"options": {"reportName": name, "groupBy": ["epic", "feature", "story"],
                                             "singleFile": True}}} if single_file else {
            "awesome": {"options": {"reportName": name, "groupBy": ["epic", "feature", "story"]}},
            "dashboard": {"options": {"reportName": name}},
            "csv": {"options": {"fileName": "results.csv"}},
        }),
        # JavaScript regexes, searched in the message (no inline flags): the prefix is enough.
        "categories": [{"name": n, "matchedStatuses": ["failed", "broken"], "messageRegex": p}
                       for n, p in CATEGORIES],
        "performance": {"groups": {g: {"title": t} for g, t in GROUPS.items()},
                        "metrics": metric_declarations(results)},
    }


def ensure_allure() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise ReportError("the HTML report needs Node.js (>= 20) and npm, which are not on PATH. Install them "
                          "(Debian/Ubuntu: apt-get install -y nodejs npm), then run `sglperf report` again. "
                          "The Allure results themselves are complete without them.")
    binary = ALLURE_DIR / "node_modules" / ".bin" / "allure"
    lockfile = ALLURE_DIR / "package-lock.json"
    with FileLock(str(ALLURE_DIR / ".npm-ci.lock"), timeout=600):  # two reports at once must not both install
        if not binary.exists() or binary.stat().st_mtime < lockfile.stat().st_mtime:
            out = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=ALLURE_DIR, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                raise ReportError(f"npm ci in {ALLURE_DIR} failed:\n{out.stderr[-2000:]}")
    return binary


def strip_analytics(output: Path) -> int:
    n = 0
    for page in output.rglob("*.html"):
        text = page.read_text(errors="replace")
        new, k = GTAG.subn("", text)
        if k:
            page.write_text(new)
            n += k
    return n


def generate(results: Path, output: Path, history: Path, *, name: str, single_file: bool = False) -> Path:
    if not results.is_dir() or not any(results.glob("*-result.json")):
        raise ReportError(f"no Allure results in {results}: run `pytest perf_tests ... --alluredir {results}` first")
    binary = ensure_allure()
    output, history, results = output.resolve(), history.resolve(), results.resolve()
    history.parent.mkdir(parents=True, exist_ok=True)
    if output.exists():
        shutil.rmtree(output)  # Allure does not clean its output: stale data would mix in
    output.mkdir(parents=True)
    cfg_path = output.parent / f".{output.name}.allurerc.json"
    cfg_path.write_text(json.dumps(config(results, output, history, name, single_file), indent=2))
    try:
        out = subprocess.run([str(binary), "generate", str(results), "-o", str(output), "-c", str(cfg_path)],
                             cwd=ALLURE_DIR, capture_output=True, text=True)
    finally:
        cfg_path.unlink(missing_ok=True)
    index = index_page(output)
    if out.returncode != 0 or index is None:
        # Allure exits 0 even when a plugin fails; the missing page is the evidence.
        raise ReportError(f"allure generate failed (exit {out.returncode}, no index.html under {output}):\n"
                          f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    strip_analytics(output)
    if single_file and index != output / "index.html":
        shutil.move(str(index), output / "index.html")  # the one file, where a user looks for it
        index = output / "index.html"
    return index


def index_page(output: Path) -> Path | None:
    """The report's entry page: a root summary when several report plugins ran, else the awesome report."""
    for p in (output / "index.html", output / "awesome" / "index.html"):
        if p.exists():
            return p
    return None


def default_name() -> str:
    import datetime as dt
    import os

    if os.environ.get("GITHUB_RUN_NUMBER"):
        return f"{os.environ.get('GITHUB_WORKFLOW', 'perf')} #{os.environ['GITHUB_RUN_NUMBER']}"
    return "sglperf " + dt.datetime.now().strftime("%Y-%m-%d %H:%M")


def main(args: argparse.Namespace) -> int:
    try:
        index = generate(Path(args.results), Path(args.output), Path(args.history),
                         name=args.name or default_name(), single_file=args.single_file)
    except ReportError as e:
        print(f"sglperf report: {e}", file=sys.stderr)
        return 2
    out = Path(args.output)
    if args.single_file:
        print(f"report: {index} (single file: open it directly in a browser)")
    else:
        print(f"report: {index}\nopen it with: python3 -m http.server -d {out} --bind 127.0.0.1 8080 "
              f"(then http://127.0.0.1:8080/); the multi-file report does not load from file://")
    print(f"history: {Path(args.history).resolve()} (keep it between runs for trends)")
    return 0
