"""Profiles load with validation; the real target's launch command is valid for SGLang 0.5.23."""

import json
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


def test_launch_cmd_prints_both_configs_of_the_real_target():
    out = subprocess.run([sys.executable, "-m", "sglperf.cli", "launch-cmd", "--profile", "glm5-nvfp4-tp8"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    cmds = json.loads(out.stdout)
    assert set(cmds) == {"rr1024-cds4", "rr2048-cds8"}
    for name, argv in cmds.items():
        assert argv[:2] == ["sglang", "serve"]
        assert argv[argv.index("--model-path") + 1] == "nvidia/GLM-5-NVFP4"
        for flag, value in [("--tp-size", "8"), ("--quantization", "modelopt_fp4")]:
            assert argv[argv.index(flag) + 1] == value
        assert "--trust-remote-code" in argv and "--enable-metrics" in argv
    assert cmds["rr1024-cds4"][-4:] == ["--max-running-requests", "1024", "--num-continuous-decode-steps", "4"]
    assert cmds["rr2048-cds8"][-4:] == ["--max-running-requests", "2048", "--num-continuous-decode-steps", "8"]


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
