"""Simulated systems: KV pool sizing, SGLang's resolved defaults and a fitted step-time model per system.

Why presets: the suite must exercise the plateau and A/B logic on realistic dynamics both at the seed's scale (slow,
for calibration and demos) and at a scale that runs in CI in minutes (`ci`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .engine import StepTimeModel


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model_path: str
    gpu_name: str
    gpu_mem_gib: float
    tp_size: int
    weights_gib_per_gpu: float  # weights + activations outside the KV pool, per GPU
    default_mem_fraction_static: float  # SGLang's auto value for this GPU (facts sheet 1.4)
    kv_tokens_at_default: int  # KV pool at the default memory fraction (the capacity log line)
    page_size: int
    context_len: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    step_time: StepTimeModel
    startup_s: float  # wall seconds for "weight loading" and "graph capture" before the port opens
    vocab_size: int
    kv_cache_dtype: str
    architectures: tuple[str, ...]

    def kv_pool_tokens(self, mem_fraction_static: float | None, max_total_tokens: int | None) -> int:
        """KV tokens for a memory fraction (linear in the memory left after weights), capped by --max-total-tokens,
        rounded down to whole pages."""
        mfs = mem_fraction_static or self.default_mem_fraction_static
        free_default = self.default_mem_fraction_static * self.gpu_mem_gib - self.weights_gib_per_gpu
        free = mfs * self.gpu_mem_gib - self.weights_gib_per_gpu
        if free <= 0:
            raise ValueError(
                f"Not enough memory. Please try to increase --mem-fraction-static (got {mfs}; weights need "
                f"{self.weights_gib_per_gpu / self.gpu_mem_gib:.3f} of the GPU)."
            )
        tokens = int(self.kv_tokens_at_default * free / free_default)
        if max_total_tokens is not None:
            tokens = min(tokens, max_total_tokens)
        return tokens // self.page_size * self.page_size


# The seed's system: GLM-5-NVFP4 on 8 x RTX PRO 6000 Blackwell (96 GB, PCIe, no NVLink), SGLang 0.5.23.
# Step-time constants were fitted to the seed's table (128/128 random tokens, closed loop): a large fixed decode
# cost (all-reduce latency over PCIe for 78 layers, kernel launches), MoE weight passes that stay flat until an
# expert sees a full 128-token tile, and a per-sequence cost. `sglperf sim-calibrate` checks the fit.
GLM5_RTXPRO6000_TP8 = Preset(
    name="glm5-nvfp4-rtxpro6000-tp8",
    description="GLM-5-NVFP4, TP8 on 8 x NVIDIA RTX PRO 6000 Blackwell (the seed's system)",
    model_path="nvidia/GLM-5-NVFP4",
    gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    gpu_mem_gib=96.0,
    tp_size=8,
    weights_gib_per_gpu=53.0,
    default_mem_fraction_static=0.833,
    kv_tokens_at_default=495_488,
    page_size=64,
    context_len=202_752,
    chunked_prefill_size=8192,
    max_prefill_tokens=16384,
    step_time=StepTimeModel(
        decode_fixed_s=0.2406,
        decode_per_seq_s=3.054e-4,
        prefill_fixed_s=0.004,
        prefill_per_token_s=2.0e-5,
        moe_expert_s=0.04 / 256,
        moe_tile_tokens=128,
        round_fixed_s=0.002,
        round_per_seq_s=1.5e-5,
    ),
    startup_s=2.0,
    vocab_size=154_880,
    kv_cache_dtype="fp8_e4m3",
    architectures=("GlmMoeDsaForCausalLM",),
)

# CI scale: the same shape of model, a KV pool of 3,072 tokens (48 requests of 32+32 tokens in 16-token pages) and
# steps of 10-20 ms, so a sweep across the KV ceiling runs in seconds per level on 2 cores with the client beside it.
CI = Preset(
    name="ci",
    description="CI-scale stand-in: 3,072-token KV pool, steps of 10-20 ms",
    model_path="sglperf/sim-ci",
    gpu_name="Simulated GPU",
    gpu_mem_gib=16.0,
    tp_size=1,
    weights_gib_per_gpu=8.0,
    default_mem_fraction_static=0.8,
    kv_tokens_at_default=3072,
    page_size=16,
    context_len=4096,
    chunked_prefill_size=2048,
    max_prefill_tokens=4096,
    step_time=StepTimeModel(
        decode_fixed_s=0.006,
        decode_per_seq_s=1.5e-4,
        prefill_fixed_s=0.001,
        prefill_per_token_s=4.0e-6,
        moe_expert_s=0.004 / 256,
        moe_tile_tokens=128,
        round_fixed_s=0.0005,
        round_per_seq_s=5e-6,
    ),
    startup_s=0.2,
    vocab_size=32_000,
    kv_cache_dtype="auto",
    architectures=("LlamaForCausalLM",),
)

# Long contexts at CI scale: CI's model with a KV pool of 73,728 tokens (8 requests of 8,192 + 1,024) and a decode
# step that reads every running sequence's context (a full pool adds 7 ms to CI's 6 ms), so an 8K prompt costs its
# prefill and its decode steps what a short one does not, and the KV pool is the ceiling it is on a GPU.
CI_LONG = replace(
    CI,
    name="ci-long",
    description="CI-scale stand-in for long contexts: 73,728-token KV pool, decode reading the context",
    model_path="sglperf/sim-ci-long",
    kv_tokens_at_default=73_728,
    context_len=16_384,
    chunked_prefill_size=8192,
    max_prefill_tokens=16_384,
    step_time=replace(CI.step_time, decode_per_kv_token_s=1.0e-7),
)

PRESETS: dict[str, Preset] = {p.name: p for p in (GLM5_RTXPRO6000_TP8, CI, CI_LONG)}
DEFAULT_PRESET = GLM5_RTXPRO6000_TP8.name


def auto_max_running_requests(token_capacity: int, context_len: int) -> int:
    """SGLang 0.5.23's automatic --max-running-requests (kv_cache_configurator.resolve_max_num_reqs)."""
    return min(max(min(int(token_capacity / context_len * 512), 4096), 2048), token_capacity // 2)
