"""The tiny deterministic Llama that real SGLang serves in the suite's own runs: 2 layers, hidden 256, a word-level
tokenizer of 32,000 words (one word, one token), made from a seed. On the CPU it carries random weights; on a GPU
host SGLang makes its own (`--load-format dummy`), so only the config and the tokenizer are written.

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
FIRST_WORD_ID = 3  # <unk> <s> </s>, then w0 ... w31996: one word, one token
MAKE_MODEL = '''
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast
out, seed, vocab, shape, weights = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), eval(sys.argv[4]), sys.argv[5]
words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(vocab - 3)}}
tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(out)
config = LlamaConfig(vocab_size=vocab, bos_token_id=1, eos_token_id=2, **shape)
if weights == "weights":
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
else:
    config.torch_dtype = "bfloat16"
    config.architectures = ["LlamaForCausalLM"]  # a model's save writes it; a bare config's does not
    config.save_pretrained(out)
'''


def make_model(python: Path | str, out: Path, seed: int = 0, *, weights: bool, shape: dict | None = None) -> Path:
    """Write the model into `out` (atomically: a half-written model is never found there) with `python`, an
    interpreter that has transformers (and torch, for `weights`)."""
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    p = subprocess.run([str(python), "-c", MAKE_MODEL, str(tmp), str(seed), str(VOCAB), repr(shape or MODEL),
                        "weights" if weights else "config"], capture_output=True, text=True)
    if p.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InfraError(f"making the tiny model with {python} failed ({p.returncode}):\n"
                         f"{(p.stdout + p.stderr)[-3000:]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
