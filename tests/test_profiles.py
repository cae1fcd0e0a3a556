"""Profiles load with validation; the real target's launch command is valid for SGLang 0.5.23."""

import json
from pathlib import Path
import subprocess
import sys

import pytest

from sglperf.run import profiles
from sglperf.engines import sglang


def test_every_shipped_profile_loads():
    assert {"glm5-nvfp4-tp8", "sim-seed", "sim-ci"} <= set(profiles.available())
    for name in profiles.available():
        p = profiles.load(name)
        assert p.levels and p.configs


def test_launch_cmd_prints_the_configs_of_the_real_target_the_seeds_two_and_the_mtp_one():
    out = subprocess.run([sys.executable, "-m", "sglperf.cli", "launch-cmd", "--profile", "glm5-nvfp4-tp8"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    cmds = json.loads(out.stdout)
    assert set(cmds) == {"rr1024-cds4", "rr2048-cds8", "rr2048-cds8-mtp"}
    for name, argv in cmds.items():
        assert argv[:2] == ["sglang", "serve"]
        assert argv[argv.index("--model-path") + 1] == "nvidia/GLM-5-NVFP4"
        for flag, value in [("--tp-size", "8"), ("--quantization", "modelopt_fp4")]:
            assert argv[argv.index(flag) + 1] == value
        assert "--trust-remote-code" in argv and "--enable-metrics" in argv
    assert cmds["rr1024-cds4"][-4:] == ["--max-running-requests", "1024", "--num-continuous-decode-steps", "4"]
    assert cmds["rr2048-cds8"][-4:] == ["--max-running-requests", "2048", "--num-continuous-decode-steps", "8"]
    # GLM-5's own MTP head as an EAGLE draft, as SGLang's GLM recipe serves it; accepted by 0.5.23's flags
    assert cmds["rr2048-cds8-mtp"][-8:] == ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                                            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_real_target_flags_are_all_sglang_0_5_23_flags():
    prof = profiles.load("glm5-nvfp4-tp8")
    for c in prof.configs:
        assert sglang.check_flags(prof.launch_argv(c.name), sglang.vendored_flags()) == []


def test_flag_check_catches_what_sglang_0_5_23_refuses():
    problems = sglang.check_flags(["--cuda-graph-max-bs", "8", "--no-such-flag"], sglang.vendored_flags())
    assert "ambiguous option" in problems[0] and "--cuda-graph-max-bs-decode" in problems[0]
    assert "not a flag of this SGLang" in problems[1]


def test_the_adapter_says_which_parser_checked_the_flags():
    check = profiles.load("glm5-nvfp4-tp8").adapter().check_flags(["sglang", "serve", "--tp-size", "8"])
    assert check.problems == ()
    assert check.source in ("the vendored SGLang 0.5.23 flag list",) or check.source.startswith("the installed")


def test_the_simulator_profiles_flags_pass_the_simulators_own_parser():
    for name in ("sim-ci", "sim-seed"):
        prof = profiles.load(name)
        for c in prof.configs:
            check = prof.adapter().check_flags(prof.launch_argv(c.name, resolve=False))
            assert check.source == "the simulator's parser" and check.problems == (), check


def test_the_profile_says_num_continuous_decode_steps_is_a_no_op():
    prof = profiles.load("glm5-nvfp4-tp8")
    assert any("--num-continuous-decode-steps" in n and "read by nothing" in n for n in prof.notes)


def test_model_path_override(monkeypatch):
    prof = profiles.load("glm5-nvfp4-tp8")
    monkeypatch.setenv("SGLPERF_MODEL_PATH", "/models/glm5")
    argv = prof.launch_argv("rr1024-cds4")
    assert argv[argv.index("--model-path") + 1] == "/models/glm5"
    argv = prof.launch_argv("rr1024-cds4", model_path="/other")
    assert argv[argv.index("--model-path") + 1] == "/other"


def test_malformed_toml_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(profiles.ProfileError, match=r"bad\.toml: not valid TOML"):
        profiles.load(str(bad))


def test_unknown_key_names_the_field(tmp_path):
    src = profiles.PROFILE_DIR / "sim-ci.toml"
    bad = tmp_path / "typo.toml"
    bad.write_text(src.read_text().replace("[workload]", "[workload]\nosll = 3"))
    with pytest.raises(profiles.ProfileError, match=r"typo\.toml: workload\.osll: unknown key"):
        profiles.load(str(bad))


def test_bad_values_name_the_field(tmp_path):
    src = profiles.PROFILE_DIR / "sim-ci.toml"
    bad = tmp_path / "neg.toml"
    bad.write_text(src.read_text().replace("levels = [8, 16, 24, 32, 64, 96]", "levels = [8, -1]"))
    with pytest.raises(profiles.ProfileError, match=r"neg\.toml: levels: .*positive"):
        profiles.load(str(bad))


def test_an_unknown_engine_names_the_known_ones(tmp_path):
    bad = tmp_path / "eng.toml"
    bad.write_text((profiles.PROFILE_DIR / "sim-ci.toml").read_text().replace('engine = "sim"', 'engine = "vllm2"'))
    with pytest.raises(profiles.ProfileError, match=r"eng\.toml: engine: .*unknown engine 'vllm2' \(known: sglang"):
        profiles.load(str(bad))


def test_hardware_is_declared_by_the_profile_not_by_its_marker():
    assert profiles.load("glm5-nvfp4-tp8").hardware.gpus == 8
    assert profiles.load("glm5-nvfp4-tp8").hardware.gpu_kind == "Blackwell"
    assert profiles.load("sim-ci").hardware.gpus == 0 and profiles.load("cpu-llamacpp").hardware.gpus == 0


def test_unknown_profile_lists_the_available_ones():
    with pytest.raises(profiles.ProfileError, match="available: .*sim-ci"):
        profiles.load("nope")


def test_a_profile_written_for_the_old_keys_still_loads_with_one_deprecation_line_naming_the_new_key(tmp_path, capsys):
    old = (profiles.PROFILE_DIR / "sim-ci.toml").read_text().replace("max_starts = 3", "replicates = 3").replace(
        "start_budget_s = 120", "replicate_budget_s = 120\nsteady_state_ratio = 0.9")
    path = tmp_path / "old-keys.toml"
    path.write_text(old.replace('name = "sim-ci"', 'name = "old-keys"'))
    profiles._SAID.clear()
    prof = profiles.load(str(path))
    assert prof.measurement.max_starts == 3 and prof.measurement.start_budget_s == 120
    err = capsys.readouterr().err.splitlines()
    assert [ln for ln in err if "replicates" in ln] == [
        "sglperf: [measurement] replicates is deprecated: use max_starts (same meaning); the old name is read for one "
        "release"]
    assert any("replicate_budget_s is deprecated: use start_budget_s" in ln for ln in err)
    assert any("steady_state_ratio is no longer a profile key" in ln for ln in err)
    profiles.load(str(path))
    assert capsys.readouterr().err == "", "one line per old key and process"
    both = tmp_path / "both.toml"
    both.write_text(old.replace("replicates = 3", "replicates = 3\nmax_starts = 2").replace('name = "sim-ci"',
                                                                                            'name = "both"'))
    with pytest.raises(profiles.ProfileError, match="replicates and max_starts are one key"):
        profiles.load(str(both))


def test_every_measurement_key_has_one_description_and_the_readme_table_is_generated_from_them():
    fields = profiles.MeasurementSection.model_fields
    assert all(f.description for f in fields.values())
    assert len(fields) <= 14
    readme = (profiles.PROFILE_DIR.parent / "README.md").read_text()
    assert profiles.knob_table() in readme, "README.md's [measurement] table: paste `sglperf profile-keys`"


def test_a_command_line_override_is_checked_by_the_same_field_as_the_profile_key():
    from sglperf.categories import UsageError
    from sglperf.run.options import SuiteOptions

    assert profiles.MeasurementSection.check("ci_target", "0.02", "--ci-target") == 0.02
    for bad in ("0.7", "0", "-1"):
        with pytest.raises(UsageError, match=r"^--ci-target"):
            profiles.MeasurementSection.check("ci_target", bad, "--ci-target")
    with pytest.raises(UsageError, match=r"^--ci-target 0.7: input should be less than or equal to 0.5"):
        SuiteOptions(reports_dir=Path("reports"), ci_target=0.7)
    with pytest.raises(Exception, match="less than or equal to 0.5"):
        profiles.MeasurementSection(ci_target=0.7)
