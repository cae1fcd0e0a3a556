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

from ..environment import gpu
from ..categories import InfraError
from ..fileio import cache_dir

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp (tools/server included)
MODEL_SHAPE = (512, 4, 1536)  # n_embd, n_layer, n_ff: 14 M params, 56 MB F32 -- bigger than L3, so batching pays
# For a GPU: 5.9 B params, 11.9 GB F16 (a Llama-7B-like width and depth): enough GPU work per decode step that
# batching changes the GPU's share of a step, at a rate one client process reaches (docs/measurement.md). The layers
# share one set of random matrices: made in seconds, same cost to serve.
GPU_MODEL_SHAPE = (4096, 32, 11008)
N_WORDS = 1021
FIRST_WORD_ID = 272  # <unk> <s> </s>, 256 byte tokens, "▁", "w", "0".."9", "▁w", then "▁w0" ... "▁w1020"
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF"]


class BuildError(InfraError):
    pass


def server_path(version: str = LLAMA_CPP_PYTHON, cuda: bool = False) -> Path:
    return cache_dir() / f"llama.cpp-{version}{'-cuda' if cuda else ''}" / "bin" / "llama-server"


def model_path(shape: tuple[int, int, int] = MODEL_SHAPE, f16: bool = False, seed: int = 0,
               idle_layers: int = 0) -> Path:
    e, n, f = shape
    return cache_dir() / "models" / (f"tiny-llama-e{e}-l{n}-f{f}{'-f16' if f16 else ''}{f'-s{seed}' if seed else ''}"
                                     f"{f'-idle{idle_layers}' if idle_layers else ''}.gguf")


def cuda_arch() -> str:
    """The visible GPUs' compute capability as CMake spells it ("9.0" -> "90"); one build serves them all."""
    if not shutil.which("nvidia-smi"):
        raise BuildError("--cuda needs an NVIDIA GPU: nvidia-smi not found")
    try:
        rows = gpu.query("gpu", "compute_cap")
    except OSError as e:
        raise BuildError(f"nvidia-smi did not report a compute capability: {e}") from None
    caps = sorted({r["compute_cap"].replace(".", "") for r in rows})
    if not caps or not all(c.isdigit() for c in caps):
        raise BuildError(f"nvidia-smi did not report a compute capability: {rows!r}")
    return ";".join(caps)


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)


def unpack_source(source: Path, into: Path) -> Path:
    """The llama.cpp tree inside a llama-cpp-python sdist, a trimmed tarball of it, or a directory."""
    if source.is_dir():
        root = source
    else:
        try:
            with tarfile.open(source) as tf:
                tf.extractall(into, filter="data")
        except (OSError, tarfile.TarError) as e:
            raise BuildError(f"--source {source}: not a readable tarball ({e})") from None
        root = into
    for cand in [root, *sorted(root.glob("*")), *sorted(root.glob("*/vendor/llama.cpp"))]:
        if (cand / "CMakeLists.txt").exists() and (cand / "tools" / "server").is_dir():
            return cand
    raise BuildError(f"--source {source}: no llama.cpp tree (CMakeLists.txt and tools/server) in it")


def _log(msg: str) -> None:
    print(f"[sglperf llamacpp] {msg}", file=sys.stderr, flush=True)


def build(version: str = LLAMA_CPP_PYTHON, jobs: int | None = None, cuda: bool = False,
          source: Path | None = None) -> Path:
    """Build llama-server once per version (and per backend: CPU, or CUDA for the visible GPUs' architecture);
    later calls return the cached binary. `source`: the pinned sdist or a trimmed tarball of its llama.cpp tree,
    for hosts without network; otherwise pip downloads the sdist."""
    out = server_path(version, cuda)
    if out.exists() and os.access(out, os.X_OK):
        return out
    missing = [t for t in ("cmake", "c++", "cc") if not shutil.which(t)]
    if missing:
        raise BuildError(f"building llama-server needs cmake and a C/C++ compiler; missing: {', '.join(missing)} "
                         f"(Debian/Ubuntu: apt-get install -y cmake g++)")
    flags = list(CMAKE_FLAGS)
    if cuda:
        nvcc = _nvcc()
        if not nvcc:
            raise BuildError("--cuda needs the CUDA compiler: nvcc is not on PATH nor in /usr/local/cuda/bin "
                             "(install the CUDA toolkit matching the driver)")
        flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch()}", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglperf-llamacpp-") as tmp:
        tmp = Path(tmp)
        if source is None:
            _log(f"downloading the llama-cpp-python=={version} sdist (vendored llama.cpp source)")
            dl = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                 "--disable-pip-version-check", "-q", "-d", str(tmp), f"llama-cpp-python=={version}"],
                                capture_output=True, text=True)
            sdists = list(tmp.glob("llama_cpp_python-*.tar.gz"))
            if dl.returncode != 0 or not sdists:
                raise BuildError(f"pip download llama-cpp-python=={version} failed:\n{dl.stderr[-2000:]}")
            source = sdists[0]
        src = unpack_source(Path(source), tmp / "src")
        bld = tmp / "build"
        _log(f"configuring (cmake{', CUDA' if cuda else ''})")
        _run(["cmake", "-S", str(src), "-B", str(bld), *flags])
        _log(f"building the llama-server target with {jobs or os.cpu_count()} jobs")
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


def make_model(path: Path | None = None, shape: tuple[int, int, int] = MODEL_SHAPE, f16: bool = False,
               seed: int = 0, idle_layers: int = 0) -> Path:
    """A deterministic random-weights llama GGUF with a SentencePiece-style vocabulary: every 'wNNN' is one token.
    `f16`: matrices in F16 (norms stay F32), as a GPU model is served. `seed`: another seed is another model with
    the same shape and vocabulary (what a broken kernel or a wrong checkpoint looks like to the output canary).
    `idle_layers`: that many more layers whose output projections are zero, so each adds exactly nothing to the
    residual stream and costs a full layer's work: the same outputs, slower by a known amount of work (a planted
    slowdown the output canary must not see)."""
    path = Path(path or model_path(shape, f16, seed, idle_layers))
    if path.exists():
        return path
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), "llama")
    n_vocab = _write_metadata(w, (shape[0], shape[1] + idle_layers, shape[2]), f16)
    _write_tensors(w, shape, n_vocab, f16, seed, idle_layers)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path


def _heads(n_embd: int) -> tuple[int, int, int]:
    n_head = max(1, n_embd // 64) if n_embd >= 256 else 4
    return n_head, max(1, n_head // 2), n_embd // n_head


def _vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    from gguf import TokenType

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
    return tokens, scores, types


def _write_metadata(w, shape: tuple[int, int, int], f16: bool) -> int:
    n_embd, n_layer, n_ff = shape
    n_head, n_head_kv, head_dim = _heads(n_embd)
    tokens, scores, types = _vocabulary()
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
    w.add_file_type(1 if f16 else 0)
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
    return len(tokens)


def _write_tensors(w, shape: tuple[int, int, int], n_vocab: int, f16: bool, seed: int, idle_layers: int = 0) -> None:
    import numpy as np

    n_embd, n_layer, n_ff = shape
    n_head, n_head_kv, head_dim = _heads(n_embd)
    rng = np.random.default_rng(seed)

    def rnd(*shape_):
        if f16:  # float32 draws: twice as fast for 1.7 B weights (the F32 model's bytes stay as they always were)
            return (rng.standard_normal(shape_, dtype=np.float32) * np.float32(0.02)).astype(np.float16)
        return (rng.standard_normal(shape_) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", rnd(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", rnd(n_vocab, n_embd))
    shared = None
    for i in range(n_layer):
        p = f"blk.{i}."
        if shared is None or not f16:  # the F32 model's layers stay distinct (its bytes never change)
            shared = dict(attn_q=rnd(n_head * head_dim, n_embd), attn_k=rnd(n_head_kv * head_dim, n_embd),
                          attn_v=rnd(n_head_kv * head_dim, n_embd), attn_output=rnd(n_embd, n_head * head_dim),
                          ffn_gate=rnd(n_ff, n_embd), ffn_up=rnd(n_ff, n_embd), ffn_down=rnd(n_embd, n_ff))
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", shared[name])
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            w.add_tensor(p + name + ".weight", shared[name])
    for i in range(n_layer, n_layer + idle_layers):  # the last layer's weights, its two output projections zero
        p = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(p + name + ".weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            w.add_tensor(p + name + ".weight", shared[name])
        for name in ("attn_output", "ffn_down"):
            w.add_tensor(p + name + ".weight", np.zeros_like(shared[name]))


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="sglperf llamacpp", description="build llama-server / make the tiny model")
    ap.add_argument("what", choices=["build", "model", "paths"])
    ap.add_argument("--cuda", action="store_true", help="build: the CUDA backend for the visible GPUs' architecture")
    ap.add_argument("--source", type=Path, default=None,
                    help="build: the llama-cpp-python sdist (or a trimmed tarball of its llama.cpp tree) instead of "
                         "downloading it")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0, help="model: the weights' seed (another seed, another model of "
                    "the same shape and vocabulary)")
    ap.add_argument("--size", choices=["tiny", "gpu"], default="tiny",
                    help=f"model: tiny {MODEL_SHAPE} F32 for the CPU, gpu {GPU_MODEL_SHAPE} F16 (n_embd, n_layer, "
                         f"n_ff)")
    ap.add_argument("--idle-layers", type=int, default=0,
                    help="model: add N layers that do a layer's work and change nothing (zero output projections): "
                         "the same outputs, a known slowdown")
    a = ap.parse_args(argv)
    try:
        if a.what == "build":
            print(build(jobs=a.jobs, cuda=a.cuda, source=a.source))
        elif a.what == "model":
            t0 = time.monotonic()
            print(make_model(shape=GPU_MODEL_SHAPE, f16=True, seed=a.seed, idle_layers=a.idle_layers)
                  if a.size == "gpu" else make_model(seed=a.seed, idle_layers=a.idle_layers))
            _log(f"model ready in {time.monotonic() - t0:.1f} s")
        else:
            print(f"llama-server: {server_path()}\nllama-server (CUDA): {server_path(cuda=True)}\n"
                  f"model: {model_path()}\nmodel (gpu): {model_path(GPU_MODEL_SHAPE, True)}")
    except BuildError as e:
        print(f"sglperf llamacpp: {e}", file=sys.stderr)
        return 2
    return 0
