"""The deterministic models that real SGLang serves in the suite's own runs, with a word-level tokenizer of 32,000
words (one word, one token), made from a seed. Tiny ones, whose speed is SGLang's host-side Python: a Llama (2
layers, hidden 256) and a GLM-shaped MoE in small (GLM-4.5's Glm4MoeForCausalLM) whose heads and experts divide by
eight, for tensor parallelism 8. GPU-sized ones, whose decode step is GPU time (docs/gpu-proof.md): a GLM MoE at
GLM's real width (GLM-4.5-Air's layer: hidden 4096, 128 routed experts, top 8, one shared expert) cut to 12 layers
so it fits one 80 GB GPU, and a dense 8B-Llama. On the CPU the tiny Llama carries random weights; on a GPU host
SGLang makes its own (`--load-format dummy`), so only the config and the tokenizer are written.

Why made, not downloaded: the machines that run it reach no model hub, and a model made from a seed by pinned
packages is the same everywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..categories import InfraError

VOCAB = 32000
MODEL = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=512, max_position_embeddings=512)
# GLM-4.5's layout in small: a dense first layer, then MoE layers of 64 routed experts (top 4 of one group, as
# GLM's router picks them) and one shared expert; 8 query and 8 KV heads (one of each per rank at TP8), half-rotary
# attention with biases, as GLM-4.5 has.
GLM_MOE = dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8, head_dim=32,
               intermediate_size=512, moe_intermediate_size=128, n_routed_experts=64, num_experts_per_tok=4,
               n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=True,
               routed_scaling_factor=1.0, use_qk_norm=False, attention_bias=True, partial_rotary_factor=0.5,
               max_position_embeddings=2048, tie_word_embeddings=False)
# GLM-4.5-Air's layer at its real width (its fused-MoE kernels are the ones a GLM deployment runs: E=128, N=1408,
# top 8), 12 layers (a dense first one, 11 MoE): about 53 GB of bf16 weights, so it fits an 80 GB GPU beside a
# 12,288-token pool. A decode step then streams nearly every expert: GPU time, not the scheduler's.
GLM_MOE_WIDE = dict(hidden_size=4096, num_hidden_layers=12, num_attention_heads=96, num_key_value_heads=8,
                    head_dim=128, intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=128,
                    num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                    norm_topk_prob=True, routed_scaling_factor=1.0, use_qk_norm=False, attention_bias=True,
                    partial_rotary_factor=0.5, rope_theta=1000000.0, max_position_embeddings=4096,
                    tie_word_embeddings=False)
# Llama-3-8B's shape (the well-known dense reference): 32 layers, 32 query / 8 KV heads, FFN 14,336.
LLAMA_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, max_position_embeddings=4096, rope_theta=500000.0)
# name -> (architecture kind, shape): what a profile's model placeholder names (engines/sglang.py GPU_MODELS)
SHAPES = {"llama-tiny": ("llama", MODEL), "glm-moe-tiny": ("glm4_moe", GLM_MOE),
          "glm-moe-wide": ("glm4_moe", GLM_MOE_WIDE), "llama-8b": ("llama", LLAMA_8B)}
ARCHITECTURES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM")}
FIRST_WORD_ID = 3  # <unk> <s> </s>, then w0 ... w31996: one word, one token
MAKE_MODEL = '''
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
import transformers
from transformers import PreTrainedTokenizerFast
out, seed, vocab, shape, weights = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), eval(sys.argv[4]), sys.argv[5]
config_class, architecture = sys.argv[6], sys.argv[7]
words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(vocab - 3)}}
tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(out)
config = getattr(transformers, config_class)(vocab_size=vocab, bos_token_id=1, eos_token_id=2, **shape)
if weights == "weights":
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
else:
    config.torch_dtype = "bfloat16"
    config.architectures = [architecture]  # a model's save writes it; a bare config's does not
    config.save_pretrained(out)
'''


def make_model(python: Path | str, out: Path, seed: int = 0, *, weights: bool, shape: dict | None = None,
               kind: str = "llama") -> Path:
    """Write the model of `kind` (ARCHITECTURES) into `out` (atomically: a half-written model is never found there)
    with `python`, an interpreter that has transformers (and torch, for `weights`: the Llama only)."""
    if weights and kind != "llama":
        raise ValueError(f"only the Llama is made with weights, not {kind!r}")
    config_class, architecture = ARCHITECTURES[kind]
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    default = GLM_MOE if kind == "glm4_moe" else MODEL
    p = subprocess.run([str(python), "-c", MAKE_MODEL, str(tmp), str(seed), str(VOCAB), repr(shape or default),
                        "weights" if weights else "config", config_class, architecture], capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InfraError(f"making the tiny model with {python} failed ({p.returncode}):\n"
                         f"{(p.stdout + p.stderr)[-3000:]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
