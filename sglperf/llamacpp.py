"""llama.cpp's `llama-server` as a real CPU engine: built from the llama.cpp source vendored in the pinned PyPI
sdist of llama-cpp-python (only that target, web UI download off), cached per version; and a tiny llama model made
locally and deterministically with the `gguf` package, whose vocabulary makes a prompt of K words K tokens.

Why: the simulator is ours; a real third-party engine with continuous batching and a capacity ceiling (slots)
keeps the suite honest (profiles/cpu-llamacpp.toml).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .categories import InfraError

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp (tools/server included)
MODEL_SHAPE = (512, 4, 1536)  # n_embd, n_layer, n_ff: 14 M params, 56 MB F32 -- bigger than L3, so batching pays
N_WORDS = 1021
FIRST_WORD_ID = 272  # <unk> <s> </s>, 256 byte tokens, "▁", "w", "0".."9", "▁w", then "▁w0" ... "▁w1020"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF"]


class BuildError(InfraError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("SGLPERF_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "sglperf")
    return Path(base)


def server_path(version: str = LLAMA_CPP_PYTHON) -> Path:
    return cache_dir() / f"llama.cpp-{version}" / "bin" / "llama-server"


def model_path(shape: tuple[int, int, int] = MODEL_SHAPE) -> Path:
    e, l, f = shape
    return cache_dir() / "models" / f"tiny-llama-e{e}-l{l}-f{f}.gguf"


def _log(msg: str) -> None:
    print(f"[sglperf llamacpp] {msg}", file=sys.stderr, flush=True)


def build(version: str = LLAMA_CPP_PYTHON, jobs: int | None = None) -> Path:
    """Build llama-server once per version; later calls return the cached binary."""
    out = server_path(version)
    if out.exists() and os.access(out, os.X_OK):
        return out
    missing = [t for t in ("cmake", "c++", "cc") if not shutil.which(t)]
    if missing:
        raise BuildError(f"building llama-server needs cmake and a C/C++ compiler; missing: {', '.join(missing)} "
                         f"(Debian/Ubuntu: apt-get install -y cmake g++)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglperf-llamacpp-") as tmp:
        tmp = Path(tmp)
        _log(f"downloading the llama-cpp-python=={version} sdist (vendored llama.cpp source)")
        dl = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                             "--disable-pip-version-check", "-q", "-d", str(tmp), f"llama-cpp-python=={version}"],
                            capture_output=True, text=True)
        sdists = list(tmp.glob("llama_cpp_python-*.tar.gz"))
        if dl.returncode != 0 or not sdists:
            raise BuildError(f"pip download llama-cpp-python=={version} failed:\n{dl.stderr[-2000:]}")
        with tarfile.open(sdists[0]) as tf:
            tf.extractall(tmp / "src", filter="data")
        src = next((tmp / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        bld = tmp / "build"
        _log("configuring (cmake)")
        _run(["cmake", "-S", str(src), "-B", str(bld), *CMAKE_FLAGS])
        _log(f"building the llama-server target with {jobs or os.cpu_count()} jobs (about 5 minutes on 2 cores)")
        _run(["cmake", "--build", str(bld), "-j", str(jobs or os.cpu_count() or 2), "--target", "llama-server"])
        binary = bld / "bin" / "llama-server"
        if not binary.exists():
            raise BuildError(f"the build finished but {binary} is missing")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(".tmp")
        shutil.copy2(binary, tmp_out)
        os.replace(tmp_out, out)  # the cache never holds half a binary
    _log(f"built {out} in {time.monotonic() - t0:.0f} s")
    return out


def _run(argv: list[str]) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])} ... failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")


def make_model(path: Path | None = None, shape: tuple[int, int, int] = MODEL_SHAPE) -> Path:
    """A deterministic random-weights llama GGUF with a SentencePiece-style vocabulary: every 'wNNN' is one token."""
    import numpy as np
    from gguf import GGUFWriter, TokenType

    path = Path(path or model_path(shape))
    if path.exists():
        return path
    n_embd, n_layer, n_ff = shape
    n_head = max(1, n_embd // 64) if n_embd >= 256 else 4
    n_head_kv = max(1, n_head // 2)
    head_dim = n_embd // n_head
    tokens, scores, types = [], [], []

    def add(piece: str, score: float, kind) -> None:
        tokens.append(piece.encode())
        scores.append(float(score))
        types.append(int(kind))

    add("<unk>", 0, TokenType.UNKNOWN)
    add("<s>", 0, TokenType.CONTROL)
    add("</s>", 0, TokenType.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0, TokenType.BYTE)
    for ch in ["▁", "w"] + [str(d) for d in range(10)]:
        add(ch, -1000, TokenType.NORMAL)
    add("▁w", -900, TokenType.NORMAL)
    for i in range(N_WORDS):
        word = f"▁w{i}"
        add(word, -900 + 100 * (len(word) - 2), TokenType.NORMAL)  # longer pieces win: one word, one token
    assert len(tokens) == FIRST_WORD_ID + N_WORDS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), "llama")
    w.add_name("sglperf-tiny-llama")
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(len(tokens))
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    rng = np.random.default_rng(0)

    def rnd(*shape_):
        return (rng.standard_normal(shape_) * 0.02).astype(np.float32)

    n_vocab = len(tokens)
    w.add_tensor("token_embd.weight", rnd(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", rnd(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rnd(n_head * head_dim, n_embd))
        w.add_tensor(p + "attn_k.weight", rnd(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", rnd(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", rnd(n_embd, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", rnd(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", rnd(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="sglperf llamacpp", description="build llama-server / make the tiny model")
    ap.add_argument("what", choices=["build", "model", "paths"])
    a = ap.parse_args(argv)
    try:
        if a.what == "build":
            print(build())
        elif a.what == "model":
            t0 = time.monotonic()
            print(make_model())
            _log(f"model ready in {time.monotonic() - t0:.1f} s")
        else:
            print(f"llama-server: {server_path()}\nmodel: {model_path()}")
    except BuildError as e:
        print(f"sglperf llamacpp: {e}", file=sys.stderr)
        return 2
    return 0
