"""The simulator's contract with SGLang 0.5.23: what of the real server's surface it answers, and what it leaves out
on purpose, in one place. tests/test_sglang_contract.py reads the real server (SGLang on the CPU) and the simulator
side by side and fails on anything the simulator answers that SGLang does not, and on anything SGLang answers that
is neither here nor answered by the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# /server_info: the keys the suite reads, which the simulator must answer as SGLang does. Every other key is a
# resolved ServerArgs field (SGLang 0.5.23 has over 550); the simulator answers those of its own flags (sim/args.py).
SERVER_INFO_READ = ("max_total_num_tokens", "page_size", "max_running_requests", "model_path", "served_model_name",
                    "version", "status", "launch_command", "max_req_input_len", "internal_states")
INTERNAL_STATE_READ = ("effective_max_running_requests_per_dp", "last_gen_throughput", "memory_usage", "world_size")
SIM_ONLY_INFO = ("sglperf_simulator",)  # the simulator's own block: its preset, lateness and noise

# /metrics: families SGLang exposes that the simulator does not (it models no SWA, Mamba, DP attention,
# speculative decoding, disaggregation, routing keys, HTTP counters, memory gauges or per-stage timings).
METRICS_LEFT_OUT = frozenset({
    "sglang:context_len", "sglang:decode_sum_seq_lens", "sglang:dp_attention_pairs_total",
    "sglang:dp_attention_steps_total", "sglang:dp_attention_sync_wait_seconds",
    "sglang:dp_attention_token_imbalance_ratio", "sglang:dp_attention_tokens_total", "sglang:evicted_tokens_total",
    "sglang:eviction_duration_seconds", "sglang:full_token_usage", "sglang:fwd_occupancy",
    "sglang:generation_tokens_histogram", "sglang:graph_memory_usage_gb", "sglang:http_requests_active",
    "sglang:http_requests_total", "sglang:http_responses_total", "sglang:inter_token_latency_seconds",
    "sglang:is_cuda_graph", "sglang:kv_available_tokens", "sglang:kv_cache_memory_usage_gb",
    "sglang:kv_evictable_tokens", "sglang:kv_used_tokens", "sglang:mamba_available_tokens",
    "sglang:mamba_evictable_tokens", "sglang:mamba_usage", "sglang:mamba_used_tokens", "sglang:new_token_ratio",
    "sglang:num_decode_deferred_kv_release_reqs", "sglang:num_decode_host_receive_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_grammar_queue_reqs", "sglang:num_pages", "sglang:num_paused_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_unique_running_routing_keys", "sglang:page_size", "sglang:pending_prealloc_token_usage",
    "sglang:per_stage_req_latency_seconds", "sglang:prealloc_full_token_usage", "sglang:prealloc_swa_token_usage",
    "sglang:prefill_effective_tokens_total", "sglang:process_cpu_seconds_total", "sglang:prompt_tokens_histogram",
    "sglang:queue_time_seconds", "sglang:request_time_per_output_token_seconds",
    "sglang:routing_key_all_req_count", "sglang:routing_key_running_req_count", "sglang:routing_keys_active",
    "sglang:scheduler_idle_seconds_total", "sglang:scheduler_process_cpu_seconds_total",
    "sglang:scheduler_stage_seconds_total", "sglang:spec_accept_rate",
    "sglang:spec_block_accept_length", "sglang:spec_cap_length", "sglang:spec_num_draft_tokens",
    "sglang:spec_num_steps", "sglang:startup_available_gpu_memory_gb", "sglang:startup_cuda_graph_time_seconds",
    "sglang:startup_time_seconds", "sglang:swa_available_tokens", "sglang:swa_evictable_tokens",
    "sglang:swa_token_usage", "sglang:swa_used_tokens", "sglang:uncached_prompt_tokens_histogram",
    "sglang:utilization", "sglang:weight_memory_usage_gb",
})
# Counters SGLang exposes only once they have counted something (a labelled counter without a child prints no
# family in multiprocess mode); the simulator creates them at start. Checked against SGLang's source instead.
METRICS_LAZY = frozenset({"sglang:num_aborted_requests_total", "sglang:num_retracted_requests_total"})
SIM_ONLY_METRICS_PREFIX = "sglperf_sim:"  # the simulator's own health: engine time and lateness

# /generate with "stream": true: each event's keys, and meta_info's keys the simulator leaves out.
CHUNK_KEYS = ("text", "output_ids", "meta_info")
# SGLang's stage timestamps, storage and DP fields, and its own throughput figure (read off SGLang 0.5.23 on the CPU
# by the contract test): the suite times requests itself and reads only counts, finish reason and latencies.
META_LEFT_OUT = frozenset({
    "api_server_dispatch_finish_ts", "cached_tokens_details", "decode_throughput", "dp_rank", "forward_entry_time",
    "prefill_finished_time", "queue_time", "request_finished_ts", "response_sent_to_client_ts",
    "storage_prefetch_wait", "storage_staging_wait", "weight_versions",
})


@dataclass(frozen=True)
class Surface:
    """What one server answered: /server_info, the family names of /metrics (its `# TYPE` lines) after it served a
    request, and the events of one streamed /generate."""

    server_info: dict
    families: frozenset[str]
    chunks: list[dict] = field(default_factory=list)
    metrics_text: str = ""


def families(metrics_text: str) -> frozenset[str]:
    return frozenset(line.split()[2] for line in metrics_text.splitlines() if line.startswith("# TYPE "))


def differences(real: Surface, sim: Surface) -> list[str]:
    """Everything on which the simulator and SGLang disagree beyond what is listed here as left out: one line each,
    naming the key or family."""
    out = []
    for where, r, s, keys in (("/server_info", real.server_info, sim.server_info, SERVER_INFO_READ),
                              ("/server_info internal_states[0]", _state(real.server_info),
                               _state(sim.server_info), INTERNAL_STATE_READ)):
        for k in keys:
            if k not in r:
                out.append(f"{where}: SGLang has no {k!r}, which the suite reads")
            elif k not in s:
                out.append(f"{where}: the simulator has no {k!r} (SGLang: {r[k]!r})")
            elif _kind(r[k]) != _kind(s[k]):
                out.append(f"{where}: {k!r} is {_kind(r[k])} in SGLang ({r[k]!r}), {_kind(s[k])} in the simulator "
                           f"({s[k]!r})")
    ours = {f for f in sim.families if not f.startswith(SIM_ONLY_METRICS_PREFIX)}
    for f in sorted(ours - real.families - METRICS_LAZY):
        out.append(f"/metrics: the simulator exposes {f}, SGLang does not")
    for f in sorted(real.families - ours - METRICS_LEFT_OUT):
        out.append(f"/metrics: SGLang exposes {f}, which the simulator neither answers nor lists as left out")
    for f in sorted(METRICS_LEFT_OUT & ours):
        out.append(f"/metrics: {f} is listed as left out but the simulator answers it")
    out += _chunk_differences(real.chunks, sim.chunks)
    return out


def _chunk_differences(real: list[dict], sim: list[dict]) -> list[str]:
    out = []
    for who, chunks in (("SGLang", real), ("the simulator", sim)):
        if not chunks:
            out.append(f"/generate: {who} streamed no event")
            continue
        for i, c in enumerate(chunks):
            if tuple(sorted(c)) != tuple(sorted(CHUNK_KEYS)):
                out.append(f"/generate: {who}'s event {i} has keys {sorted(c)}, not {sorted(CHUNK_KEYS)}")
                break
    if not real or not sim or out:
        return out
    r_meta, s_meta = set(real[-1]["meta_info"]), set(sim[-1]["meta_info"])
    for k in sorted(s_meta - r_meta):
        out.append(f"/generate meta_info: the simulator sends {k!r}, SGLang does not")
    for k in sorted(r_meta - s_meta - META_LEFT_OUT):
        out.append(f"/generate meta_info: SGLang sends {k!r}, which the simulator neither sends nor lists as left out")
    for who, chunks in (("SGLang", real), ("the simulator", sim)):
        ids = [len(c["output_ids"]) for c in chunks]
        if ids != sorted(ids) or len(chunks) > 1 and ids[0] == ids[-1]:
            out.append(f"/generate: {who}'s output_ids are not cumulative ({ids[:6]} ...)")
        fin = chunks[-1]["meta_info"].get("finish_reason")
        if not (isinstance(fin, dict) and fin.get("type") == "length"):
            out.append(f"/generate: {who}'s last event ends with finish_reason {fin!r}, not {{'type': 'length', ...}}")
    return out


def _state(info: dict) -> dict:
    states = info.get("internal_states")
    return states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}


def _kind(v) -> str:
    return "a number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
