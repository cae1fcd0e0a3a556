#!/usr/bin/env bash
# The SGLang proof on a bare NVIDIA Hopper host with no network, in one go (docs/gpu-proof.md, "Real SGLang on a
# GPU"): unpack the kit (ci/pack-sglang-gpu-kit.sh) beside the host's own torch, keep SGLang's JIT caches, record the
# installed SGLang's flags, then run the nightly script itself (ci/run-perf.sh, profile gpu1-sglang) RUNS times.
#
#   KIT=.kit/sglang-0.5.17-gpu-site.tar.xz [JIT_CACHE=.kit/jit-cache.tar.xz] RUNS=2 bash ci/gpu-proof-sglang.sh
#
# Each run leaves its run file, raw records, server logs, Allure results and pytest's log under $PROOF_DIR/run-N; the
# history accumulates in $PROOF_DIR/persist; the JIT caches (Triton, TVM-FFI, flashinfer) in $PROOF_DIR/jit, packed
# as $PROOF_DIR/jit-cache.tar.xz at the end, so a later host's first start can skip the compiles (JIT_CACHE).
# EXTRA_PYTEST_ARGS pass through to pytest. Exits with the last run's pytest code.
set -uo pipefail
cd "$(dirname "$0")/.."
PROOF=${PROOF_DIR:-reports/gpu-proof-sglang}
RUNS=${RUNS:-1}
SITE=${SGLPERF_KIT_DIR:-/tmp/sglperf-sglang-kit}
JIT=${JIT_DIR:-$PROOF/jit}
mkdir -p "$PROOF" "$JIT"
log() { echo "[gpu-proof-sglang $(date +%T)] $*"; }

. ci/sglang-kit-env.sh
sglang_kit_env "$SITE" "$JIT" log || exit 3

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit,ecc.mode.current,mig.mode.current \
  --format=csv,noheader | tee "$PROOF/nvidia-smi.txt"
[ -s "$PROOF/sglang-flags.txt" ] || python3 - "$PROOF/sglang-flags.txt" <<'PY' || { log "SGLang does not import from the kit"; exit 4; }
import argparse, sys
from importlib import metadata
import torch
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
flags = sorted({o for a in p._actions for o in a.option_strings if o.startswith("--")})
with open(sys.argv[1], "w") as f:
    f.write(f"# SGLang {metadata.version('sglang')} server flags and aliases, read from its own parser "
            "(ci/gpu-proof-sglang.sh). One flag per line.\n" + "".join(x + "\n" for x in flags))
print(f"sglang {metadata.version('sglang')}, sglang-kernel {metadata.version('sglang-kernel')}, torch "
      f"{torch.__version__}, {torch.cuda.get_device_name(0)}: {len(flags)} server flags")
PY

. ci/proof-runs.sh
proof_runs gpu1-sglang
tar -cJf "$PROOF/jit-cache.tar.xz" -C "$JIT" --transform 's,^\.,jit,' . 2>/dev/null && log "JIT caches: $PROOF/jit-cache.tar.xz"
exit "$rc"
