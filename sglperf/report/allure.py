"""Allure results: labels (epic = profile, feature = config, story = level), measured values as parameters left
out of the history id, per-level and per-config attachments, environment/executor/categories files and the
numeric perf metrics (`*-perf.json`) whose history Allure 3 shows as trends.

Only active with --alluredir; everything attached is redacted of secrets first.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import re
import uuid
from pathlib import Path

from ..categories import Category
from ..fileio import jsonl
from ..measure.workload_metrics import trace_line, turn_table
from ..records import METRICS, LevelResult, Rate, level_name
from ..redact import redact

# Failure categories: the suite's failure messages start with these words (categories.py).
CATEGORIES = [(c.title, c.prefix) for c in Category]


def results_dir(config) -> Path | None:
    d = getattr(config.option, "allure_report_dir", None)
    return Path(d) if d else None


def metric_key(kind: str, profile: str, config: str, level: int) -> str:
    clean = re.compile(r"[^A-Za-z0-9_-]+")
    return f"{kind}.{clean.sub('_', profile)}.{clean.sub('_', config)}.{level_name(level)}"


def label_level(profile: str, config: str, level: int, title: str) -> None:
    import allure

    allure.dynamic.epic(profile)
    allure.dynamic.feature(config)
    allure.dynamic.story(f"{level_name(level)}")
    allure.dynamic.title(title)


def label_config(profile: str, config: str, title: str) -> None:
    import allure

    allure.dynamic.epic(profile)
    allure.dynamic.feature(config)
    allure.dynamic.story("plateau")
    allure.dynamic.title(title)


def measured_parameters(r: LevelResult) -> None:
    """Shown in the report, left out of historyId so a test keeps its history from run to run."""
    import allure

    def fmt(x, spec=",.1f"):
        return "-" if x is None else format(x, spec)

    for name, value in (("sustained output tok/s", f"{fmt(r.sustained_output_tps)} ± "
                                                    f"{fmt(r.sustained_output_tps_ci95)}"),
                        ("whole-run output tok/s", fmt(r.whole_run_output_tps)),
                        ("peak output tok/s", fmt(r.peak_output_tps)),
                        ("TTFT p99 ms", fmt(r.ttft_ms.p99)),
                        ("TPOT p99 ms", fmt(r.tpot_ms.p99)),
                        ("goodput tok/s (SLO met)", "-" if r.goodput_tps is None else
                         f"{fmt(r.goodput_tps)} ({r.slo_met_share:.0%})"),
                        ("server/client ratio", fmt(r.server_ratio, ".4f")),
                        ("host CPU speed probe", fmt(r.host_cpu_speed, ".3g")),
                        ("valid", "yes" if r.valid else "no: " + "; ".join(r.invalid_reasons))):
        allure.dynamic.parameter(name, value, excluded=True)
    if line := trace_line(r):
        allure.dynamic.parameter("trace replay", line, excluded=True)


def attach_level(meas, plots: bool = True) -> None:
    import allure

    from . import plots as P

    r = meas.result
    allure.attach(json.dumps(redact(r.to_dict()), indent=2), "level result.json",
                  allure.attachment_type.JSON)
    if r.by_turn:  # a conversation workload: its level by turn depth
        allure.attach("\n".join(turn_table(r.by_turn, indent="")), "by turn.txt", allure.attachment_type.TEXT)
    rows = jsonl(meas.records).decode()
    if len(rows) > 1_000_000:
        allure.attach(gzip.compress(rows.encode(), mtime=0), "requests.jsonl.gz", extension="jsonl.gz")
    else:
        allure.attach(rows, "requests.jsonl", allure.attachment_type.TEXT, extension="jsonl")
    allure.attach(_csv(meas.server_samples), f"server samples ({meas.scrape_source or 'unavailable'}).csv",
                  allure.attachment_type.CSV)
    if plots and meas.records:
        allure.attach(P.level_timeline(meas.records, meas.server_samples, r), "throughput over time.png",
                      allure.attachment_type.PNG)
        allure.attach(P.level_disturbance(min(x.send_time for x in meas.records), meas.host_samples,
                                          meas.server_samples, meas.gpu_samples, r),
                      "disturbance over time.png", allure.attachment_type.PNG)
        allure.attach(P.latency_distributions(meas.records), "TTFT and ITL distributions.png",
                      allure.attachment_type.PNG)
    if meas.gpu_samples:
        allure.attach(_csv(meas.gpu_samples), "GPU telemetry.csv", allure.attachment_type.CSV)


def _csv(rows: list) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in dataclasses.fields(rows[0])] if rows else ["time"])
    w.writeheader()
    for x in rows:
        w.writerow(dataclasses.asdict(x))
    return buf.getvalue()


def attach_text(name: str, text: str) -> None:
    import allure

    allure.attach(redact(text), name, allure.attachment_type.TEXT)


def attach_png(name: str, data: bytes) -> None:
    import allure

    allure.attach(data, name, allure.attachment_type.PNG)


def attach_json(name: str, obj) -> None:
    import allure

    allure.attach(json.dumps(redact(obj), indent=2, default=str), name, allure.attachment_type.JSON)


def redact_results(d: Path) -> int:
    """Every file allure-pytest wrote under `d` with each known secret replaced (redact.py): its failure messages
    and traces come from the exception itself, which may quote a secret the suite never wrote (an HTTP client's
    error quoting a header). Returns how many files were rewritten."""
    from ..fileio import atomic_write_bytes
    from ..redact import redact, secrets

    words = secrets()
    if not words or not d.is_dir():
        return 0
    n = 0
    for path in d.rglob("*"):
        try:
            text = path.read_text() if path.is_file() else ""
        except (OSError, UnicodeDecodeError):
            continue
        if any(w in text for w in words):
            atomic_write_bytes(path, redact(text).encode())
            n += 1
    return n


def write_environment(d: Path, fingerprint: dict) -> None:
    lines = []
    for k, v in sorted(redact(fingerprint).items()):
        if v is None:
            continue
        value = str(v).replace("\\", "\\\\").replace("\n", " ")
        lines.append(f"{k}={value}")
    (d / "environment.properties").write_text("\n".join(lines) + "\n")


def write_executor(d: Path) -> None:
    env = os.environ
    if env.get("GITHUB_RUN_ID"):
        url = (f"{env.get('GITHUB_SERVER_URL', '')}/{env.get('GITHUB_REPOSITORY', '')}/actions/runs/"
               f"{env['GITHUB_RUN_ID']}")
        ex = {"name": "GitHub Actions", "type": "github", "buildName": f"{env.get('GITHUB_WORKFLOW', 'perf')} "
              f"#{env.get('GITHUB_RUN_NUMBER', '?')}", "buildOrder": int(env.get("GITHUB_RUN_NUMBER", "0") or 0),
              "buildUrl": url, "reportUrl": url}
    else:
        ex = {"name": "local", "type": "local", "buildName": f"sglperf run on {os.uname().nodename}"}
    (d / "executor.json").write_text(json.dumps(ex, indent=2))


def write_categories(d: Path) -> None:
    """For Allure 2 (Allure 3 takes categories from its config, see allure_html)."""
    cats = [{"name": name, "messageRegex": f"(?s).*{prefix}.*", "matchedStatuses": ["failed", "broken"]}
            for name, prefix in CATEGORIES]
    (d / "categories.json").write_text(json.dumps(cats, indent=2))


def write_run_files(d: Path, docs: list) -> None:
    """environment.properties (from the first fingerprint), executor.json, categories.json and the numeric perf
    metrics of every valid level of the run documents `docs`."""
    d.mkdir(parents=True, exist_ok=True)
    fps = [doc.fingerprint for doc in docs if doc.fingerprint]
    if fps:
        write_environment(d, fps[0])
    write_executor(d)
    write_categories(d)
    write_perf_metrics(d, perf_entries(docs))


def perf_entries(docs: list) -> list[dict]:
    """One Allure metric per (profile, config, level, metric with a trend); an invalid level is never a data point."""
    entries = []
    for doc in docs:
        for cname, c in doc.configs.items():
            for lv, r in c.levels.items():
                if not r.valid:
                    continue
                start, stop = r.epoch_ms or (0, 0)
                for metric in (m for m in METRICS.values() if m.trend):
                    value = metric.read(r)
                    if value is not None:
                        level = Rate(int(lv)) if doc.open_loop else int(lv)
                        key = metric_key(metric.trend, doc.profile, cname, level)
                        entries.append({"id": key, "key": key, "value": round(value, 3), "start": start,
                                        "stop": stop})
    return entries


def write_perf_metrics(d: Path, entries: list[dict]) -> Path | None:
    """Allure 3 numeric metrics: a JSON array of {id, key, value, start, stop} (epoch ms)."""
    if not entries:
        return None
    path = d / f"{uuid.uuid4()}-perf.json"
    path.write_text(json.dumps(entries, indent=1))
    return path


def label_ab(prof) -> None:
    """The A/B test's labels: the profile as its epic, the pair in its title."""
    import allure

    allure.dynamic.epic(prof.name)
    allure.dynamic.feature("A/B")
    allure.dynamic.title(f"A/B: {prof.ab.tuned if prof.ab else '?'} vs {prof.ab.base if prof.ab else '?'}")


def attach_curve(run, results: dict) -> None:
    """Throughput vs concurrency of one config (`results`: its measured levels) with floors, baseline, whole-run,
    peak and the ceilings."""
    from . import plots

    if not results:
        return
    floors, base = {}, {}
    bf, _ = run.baseline()
    if bf is not None:
        for lv in results:
            e = bf.entries(run.name, lv).get("sustained_output_tps")
            if e:
                floors[lv], base[lv] = e.floor, e.value
    c = run.ceiling
    attach_png("throughput vs concurrency.png", plots.config_curve(
        run.where, results, floors, base, c.kv if c else None, c.cap if c else None))
