"""`sglperf export --format llm-d`: real GPU run files as llm-d Benchmark Reports, validated against the pinned
schema (tests/data/llm-d/README.md); what the suite does not trust is left out, said so; nothing a user keeps is
overwritten; secrets never reach a report."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from sglperf.cli import main
from sglperf.report import llmd
from sglperf.store.rundoc import load_run

DATA = Path(__file__).parent / "data"
SCHEMA = json.loads((DATA / "llm-d" / "br_v0_2_1_subset.schema.json").read_text())
SLOWED = DATA / "gpu" / "h100-sglang-0.5.17-2026-12-06" / "slowed-cg8.json"
GLM_RECORDED_INVALID = DATA / "gpu" / "h100-sglang-0.5.17-shapes" / "20261207-010140-a1b972.json"


def validate(doc: dict) -> None:
    jsonschema.validate(doc, SCHEMA, format_checker=jsonschema.FormatChecker())


def test_a_recorded_gpu_run_exports_one_valid_report_per_level(tmp_path, capsys):
    assert main(["export", "--format", "llm-d", str(SLOWED), "--out", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.json"))
    assert [f.name for f in files] == ["20261206-225144-e2e054-rr16-c32.json", "20261206-225144-e2e054-rr16-c64.json"]
    for f in files:
        validate(json.loads(f.read_text()))
    doc = json.loads(files[0].read_text())
    engine = doc["scenario"]["stack"][0]
    assert engine["standardized"]["tool"] == "sglang" and engine["standardized"]["tool_version"] == "0.5.17"
    assert engine["standardized"]["accelerator"]["model"] == "NVIDIA H100 80GB HBM3"
    assert engine["native"]["args"]["--cuda-graph-max-bs-decode"] == "8"
    rate = doc["results"]["request_performance"]["aggregate"]["throughput"]["output_token_rate"]
    assert rate["ci95_low"] < rate["mean"] < rate["ci95_high"]
    assert doc["scenario"]["load"]["standardized"]["concurrency"] == 32
    assert doc["run"]["eid"] == "20261206-225144-e2e054"
    assert len(doc["results"]["profiling"]["sglperf"]["starts"]) == 3  # c32 was measured over three server starts


def test_invalid_levels_get_no_report_and_are_named(tmp_path, capsys):
    assert main(["export", "--format", "llm-d", str(GLM_RECORDED_INVALID), "--out", str(tmp_path)]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["reports"] == [] and len(said["left_out"]) == 3
    assert said["left_out"][0].startswith("rr16 c32: invalid: output degenerate under load")
    assert not list(tmp_path.glob("*.json"))


def test_reports_already_there_are_not_overwritten_unless_asked(tmp_path, capsys):
    argv = ["export", "--format", "llm-d", str(SLOWED), "--out", str(tmp_path)]
    assert main(argv) == 0
    kept = tmp_path / "20261206-225144-e2e054-rr16-c32.json"
    kept.write_text("{}")
    assert main(argv) == 2
    assert "already there" in capsys.readouterr().err and kept.read_text() == "{}"
    assert main([*argv, "--overwrite"]) == 0
    validate(json.loads(kept.read_text()))


def test_a_secret_flag_in_the_server_args_never_reaches_a_report():
    run = load_run(SLOWED)
    fp = dict(run.config_fingerprint("rr16"))
    fp["server_args"] = fp["server_args"] + " --api-key sk-live-123456 --ssl-keyfile-password=hunter22"
    doc = llmd.component("rr16", fp)
    text = json.dumps(doc)
    assert "sk-live-123456" not in text and "hunter22" not in text


@pytest.mark.parametrize("path, where", [("run.uid", ("run", "uid")), ("results", ("results",))])
def test_the_pinned_schema_refuses_a_report_missing_what_it_requires(path, where):
    doc = llmd.reports(load_run(SLOWED))[0][0].doc
    node = doc
    for key in where[:-1]:
        node = node[key]
    del node[where[-1]]
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_a_glm_shaped_moe_run_on_an_h100_exports_valid_reports(tmp_path, capsys):
    glm = DATA / "gpu" / "h100-sglang-0.5.17-glm-slowdowns" / "healthy-20261207-045647-5a46d5.json"
    assert main(["export", "--format", "llm-d", str(glm), "--out", str(tmp_path)]) == 0
    docs = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("*.json"))]
    assert len(docs) == 2
    for doc in docs:
        validate(doc)
        assert doc["scenario"]["stack"][0]["native"]["args"]["--model-path"] == "{sglang_gpu_glm_moe_wide_model}"


def test_a_trace_runs_reports_say_their_requests_were_sampled_from_a_trace_of_no_fixed_length(tmp_path, capsys):
    run = sorted((DATA / "sim-trace").glob("*.json"))[0]
    assert main(["export", "--format", "llm-d", str(run), "--out", str(tmp_path)]) == 0
    for f in sorted(tmp_path.glob("*.json")):
        doc = json.loads(f.read_text())
        validate(doc)
        load = doc["scenario"]["load"]
        assert load["standardized"]["source"] == "sampled" and load["standardized"]["rate_qps"] in (20.0, 40.0)
        assert load["standardized"]["input_seq_len"]["distribution"] == "other"
        assert load["metadata"]["description"].startswith("trace agent-sessions.jsonl (")
