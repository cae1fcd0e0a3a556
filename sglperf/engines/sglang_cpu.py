"""Real SGLang 0.5.23 on the CPU, for the suite's own tests and CI (`sglperf sglang prepare --cpu`): a venv in the
cache with exactly the pinned packages (data/sglang-0.5.23-cpu.txt), the stand-in for the CPU kernel package SGLang
names at import, and a deterministic tiny model (a 2-layer Llama with random weights and a word-level tokenizer,
from a seed).

Why a stand-in: with SGLANG_USE_CPU_ENGINE=1, SGLang imports a few CPU kernel names at module level
(kernels/ops/kvcache/cache_move.py, srt/mem_cache/allocation.py, kernels/ops/speculative/*); their package is not
on PyPI. The stand-in makes every `*_cpu` name a function that raises NotImplementedError and every other name an
AttributeError. Plain serving calls none of them (only speculative decoding and KV moves do): if one is ever called,
the server fails in words instead of serving wrong results. No SGLang file is patched.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from ..categories import InfraError
from ..fileio import atomic_write_bytes, cache_dir
from .sglang_model import MODEL, make_model

VERSION = "0.5.23"
REQUIREMENTS = Path(__file__).resolve().parent.parent / "data" / f"sglang-{VERSION}-cpu.txt"
STAND_IN = '''"""sglperf's stand-in for SGLang's CPU kernel package (sglang-kernel's CPU build is not on PyPI): every
name
ending in _cpu is a function that raises NotImplementedError; any other name is an AttributeError. Plain serving
calls none of them; a call means a feature that needs the real kernels (speculative decoding, KV moves)."""


def __getattr__(name):
    if name.endswith("_cpu"):
        def missing(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel.{name}: sglperf's import-only stand-in has no CPU kernels "
                                      f"(install SGLang's CPU kernel package to use this feature)")
        missing.__name__ = name
        return missing
    raise AttributeError(name)
'''
class PrepareError(InfraError):
    pass


def home() -> Path:
    return cache_dir() / f"sglang-{VERSION}-cpu"


def python() -> Path:
    return home() / "venv" / "bin" / "python"


def model_dir(seed: int = 0) -> Path:
    return home() / f"model-llama-{MODEL['hidden_size']}x{MODEL['num_hidden_layers']}-s{seed}"


def _pinned_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def _log(msg: str) -> None:
    print(f"[sglperf sglang] {msg}", file=sys.stderr, flush=True)


def _run(step: str, argv: list[str], **kw) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise PrepareError(f"{step} failed ({p.returncode}): {' '.join(argv[:6])} ...\n{(p.stdout + p.stderr)[-3000:]}")


def _site_packages() -> Path:
    out = subprocess.run([str(python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def prepare(seed: int = 0) -> tuple[Path, Path]:
    """(python, model): the venv with the pinned packages and the stand-in, and the tiny model. Idempotent: a step
    already done (its marker names the pinned file's hash) is skipped; each step's time is printed."""
    t_all = time.monotonic()
    venv_ok = home() / f".venv-{_pinned_hash()}"
    if not venv_ok.exists():
        t = time.monotonic()
        if not python().exists():
            _run("creating the venv", [sys.executable, "-m", "venv", str(home() / "venv")])
        _run("installing the pinned packages", [str(python()), "-m", "pip", "install", "--quiet",
                                                "--disable-pip-version-check", "--no-deps", "-r", str(REQUIREMENTS)])
        atomic_write_bytes(_site_packages() / "sgl_kernel" / "__init__.py", STAND_IN.encode())
        _run("importing SGLang on the CPU", [str(python()), "-c", "import sglang.srt.entrypoints.http_server, "
                                             "sglang.srt.managers.scheduler, sglang.srt.models.llama"],
             env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
        venv_ok.write_text(f"{VERSION} {_pinned_hash()}\n")
        _log(f"venv ready in {time.monotonic() - t:.0f} s: {python()}")
    model = model_dir(seed)
    if not (model / "model.safetensors").exists():
        t = time.monotonic()
        make_model(python(), model, seed, weights=True)
        _log(f"model ready in {time.monotonic() - t:.1f} s: {model}")
    _log(f"prepared in {time.monotonic() - t_all:.0f} s")
    return python(), model


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="sglperf sglang", description="real SGLang on the CPU for the suite's tests")
    ap.add_argument("what", choices=["prepare", "paths"])
    ap.add_argument("--cpu", action="store_true", help="prepare: SGLang's CPU engine (the only kind prepared here)")
    ap.add_argument("--seed", type=int, default=0, help="the tiny model's seed (another seed, another model)")
    a = ap.parse_args(argv)
    if a.what == "paths":
        print(f"python: {python()}\nmodel: {model_dir(a.seed)}\npinned: {REQUIREMENTS}")
        return 0
    if not a.cpu:
        print("sglperf sglang prepare: only --cpu is prepared here (a GPU runner installs sglperf[sglang])",
              file=sys.stderr)
        return 2
    try:
        py, model = prepare(a.seed)
    except PrepareError as e:
        print(f"sglperf sglang: {e}", file=sys.stderr)
        return 1
    print(f"{py}\n{model}")
    return 0
