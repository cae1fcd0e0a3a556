#!/usr/bin/env bash
# The GPU proof on a bare NVIDIA host, in one go (docs/gpu-proof.md): install the carried wheels, build llama-server
# with CUDA, make the GPU-sized model, then run the nightly script itself (ci/run-perf.sh, profile gpu1-llamacpp)
# RUNS times. Each run leaves its run file, server logs, Allure results (and report, where npm's allure is there),
# drift output and pytest's log under $PROOF_DIR/run-N; the history accumulates in $PROOF_DIR/persist.
#
#   WHEELS=.whl LLAMACPP_SOURCE=.whl/llama.cpp-src.tar.xz RUNS=3 bash ci/gpu-proof.sh
#
# No network is needed: WHEELS holds what the host's Python lacks (pydantic, allure-pytest, gguf, nvidia-ml-py ...),
# installed into a private target directory, and LLAMACPP_SOURCE is the pinned llama.cpp tree
# (ci/pack-llamacpp-source.sh). EXTRA_PYTEST_ARGS pass through to pytest (e.g. a run slowed on purpose). Exits with
# the last run's pytest code.
set -uo pipefail
cd "$(dirname "$0")/.."
PROOF=${PROOF_DIR:-reports/gpu-proof}
RUNS=${RUNS:-1}
export SGLPERF_CACHE=${SGLPERF_CACHE:-$PWD/.cache/sglperf}
mkdir -p "$PROOF"
log() { echo "[gpu-proof $(date +%T)] $*"; }

if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/sglperf-site "$WHEELS"/*.whl \
    || { log "installing the wheels in $WHEELS failed"; exit 3; }
  export PYTHONPATH=/tmp/sglperf-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the checkout itself: nothing to install on an offline host

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit,ecc.mode.current,mig.mode.current \
  --format=csv,noheader | tee "$PROOF/nvidia-smi.txt"
t=$(date +%s)
python3 -m sglperf llamacpp build --cuda ${LLAMACPP_SOURCE:+--source "$LLAMACPP_SOURCE"} || exit 4
log "llama-server (CUDA) ready after $(( $(date +%s) - t )) s"
t=$(date +%s)
python3 -m sglperf llamacpp model --size gpu || exit 4
log "GPU model ready after $(( $(date +%s) - t )) s"

. ci/proof-runs.sh
proof_runs gpu1-llamacpp
exit "$rc"
