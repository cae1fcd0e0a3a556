"""Engine adapters: what each engine's server says is read the same way everywhere; detection picks the adapter."""

import pytest

from sglperf import engines
from sglperf.environment import gpu
from sglperf.categories import InfraError
from sglperf.measure.client import Target

TWO_DP_RANKS = """\
# TYPE sglang:token_usage gauge
sglang:token_usage{dp_rank="0",model_name="m"} 0.5
sglang:token_usage{dp_rank="1",model_name="m"} 0.7
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m"} 100.0
sglang:num_running_reqs{dp_rank="1",model_name="m"} 120.0
# TYPE sglang:realtime_tokens counter
sglang:realtime_tokens_total{mode="decode",dp_rank="0",model_name="m"} 1000.0
sglang:realtime_tokens_total{mode="decode",dp_rank="1",model_name="m"} 500.0
sglang:realtime_tokens_total{mode="prefill_compute",dp_rank="0",model_name="m"} 9999.0
"""

LLAMACPP = """\
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 4096
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 8
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""

H200 = "0, NVIDIA H200, 143771, 580.159.04, 1980, 700.00, Enabled, Disabled\n"


def test_sglang_counts_are_summed_over_dp_ranks_and_token_usage_is_averaged():
    s = engines.get("sglang").parse_metrics(TWO_DP_RANKS, 1.0)
    assert s.token_usage == pytest.approx(0.6), "a ratio per rank: averaged, never 1.2"
    assert s.running == 220 and s.decode_tokens_total == 1500, "counts: summed, decode mode only"


def test_llamacpp_series_are_read_through_its_adapter():
    s = engines.get("llamacpp").parse_metrics(LLAMACPP, 2.0)
    assert (s.output_tokens_total, s.running, s.queued) == (4096, 8, 3)
    assert engines.get("sglang").parse_metrics(LLAMACPP, 2.0) is None, "no SGLang series there"


def test_llamacpp_busy_slots_per_decode_step_become_a_counter():
    text = LLAMACPP + "llamacpp:n_decode_total 1000\nllamacpp:n_busy_slots_per_decode 31.5\n"
    s = engines.get("llamacpp").parse_metrics(text, 2.0)
    assert (s.decode_steps_total, s.busy_slot_steps_total) == (1000, 31_500)
    assert engines.get("llamacpp").parse_metrics(LLAMACPP, 2.0).busy_slot_steps_total is None, "older servers"


def test_the_sglang_ceiling_comes_from_server_info():
    info = {"max_total_num_tokens": 495488, "page_size": 64,
            "internal_states": [{"effective_max_running_requests_per_dp": 2048}]}
    c = engines.get("sglang").ceiling(info, 128, 128)
    assert (c.kv, c.effective, c.binding) == (1935, 1935, "kv")
    info["internal_states"][0]["effective_max_running_requests_per_dp"] = 1024
    assert engines.get("sglang").ceiling(info, 128, 128).binding == "cap"
    assert engines.get("openai").ceiling(info, 128, 128) is None, "a plain OpenAI server says nothing of its KV"


def test_the_llamacpp_ceiling_is_its_slot_count():
    c = engines.get("llamacpp").ceiling({"total_slots": 8, "default_generation_settings": {"n_ctx": 256}}, 32, 32)
    assert (c.effective, c.binding) == (8, "cap")


def test_connection_policy_and_wire_come_from_the_engine():
    llama = Target.for_engine("http://127.0.0.1:1", engines.get("llamacpp"))
    assert llama.new_connection_per_request and llama.wire.path == "/v1/completions"
    sgl = Target.for_engine("http://127.0.0.1:1", engines.get("sglang"))
    assert not sgl.new_connection_per_request and sgl.wire.path == "/generate"
    assert Target.for_engine("http://127.0.0.1:1", engines.get("sglang"), api="openai").wire.path == "/v1/completions"


def test_recorded_nvidia_smi_rows_parse_and_cuda_visible_devices_picks_the_servers_gpus():
    rows = gpu.parse_inventory(H200 + H200.replace("0, ", "1, ", 1))
    assert rows[0]["name"] == "NVIDIA H200" and rows[0]["driver"] == "580.159.04"
    assert rows[0]["power_limit_w"] == "700.00" and rows[0]["max_sm_clock_mhz"] == "1980"
    assert [r["index"] for r in gpu.visible(rows, {"CUDA_VISIBLE_DEVICES": "1"})] == ["1"]
    assert len(gpu.visible(rows, {})) == 2


def test_hardware_class_follows_where_the_server_runs():
    rows = gpu.parse_inventory(H200)
    llama = engines.get("llamacpp")
    assert llama.hardware_class({}, ["llama-server", "-ngl", "99"], rows) == "1 x NVIDIA H200"
    assert llama.hardware_class({}, ["llama-server", "--n-gpu-layers=0"], rows).startswith("cpu:")
    assert llama.hardware_class({}, ["llama-server"], []).startswith("cpu:")
    assert engines.get("sglang").hardware_class({}, ["sglang", "serve"], rows * 8) == "8 x NVIDIA H200"
    assert engines.get("sim").hardware_class({"sglperf_simulator": {"preset": "ci"}}, [], rows) == "sim:ci"


def test_detection_names_the_simulator_and_says_when_nothing_is_there(start_sim):
    srv = start_sim()
    assert engines.detect(srv.url).name == "sim"
    with pytest.raises(InfraError, match="connection refused at 127.0.0.1:9: nothing listens there"):
        engines.detect("http://127.0.0.1:9", timeout=1)


def test_an_unknown_engine_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        engines.get("tgi")
