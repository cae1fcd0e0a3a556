#!/usr/bin/env bash
# The recorded answers of SGLang drafting on a GPU (tests/data): one NGRAM server of gpu1-sglang-spec started from
# the kit, its /server_info, its /metrics before and after one streamed /generate and 48 requests of 128 tokens,
# written to $OUT as they come (a device call cut at its limit still returns them).
#
#   KIT=.kit/sglang-0.5.17-gpu-site.tar.xz JIT_CACHE=.kit/jit-cache-h100.tar.xz bash ci/capture-sglang-spec-answers.sh
set -u
OUT=${OUT:-reports/sglang-spec-answers}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# the kit and JIT caches ci/gpu-proof-sglang.sh left on this host are reused (a call right after it skips the unpack)
. "$(dirname "$0")/sglang-kit-env.sh"
sglang_kit_env "${SGLPERF_KIT_DIR:-/tmp/sglperf-sglang-kit}" "${JIT_DIR:-/tmp/sglang-jit}" el || exit 3
export CUDA_VISIBLE_DEVICES=0
el unpacked
ARGV=$(mktemp)
python3 - > "$ARGV" <<'PY'
import json, sys
from sglperf.engines.sglang import gpu_model_dir
from sglperf.engines.sglang_model import make_model
from sglperf.run import profiles
d = gpu_model_dir("llama")
if not d.exists():
    make_model(sys.executable, d, weights=False, kind="llama")
p = profiles.load("gpu1-sglang-spec")
argv = p.launch_argv("ngram", resolve=True)
print("\n".join(argv[1:]))
PY
el "argv: $(tr '\n' ' ' < "$ARGV" | cut -c1-120)"
mapfile -t ARGS < "$ARGV"
if curl -s -o /dev/null -m 5 http://127.0.0.1:31000/health; then
  el "port 31000 already answers: that server's answers would be recorded as this one's; end it first"; exit 5
fi
setsid python3 "${ARGS[@]}" --host 127.0.0.1 --port 31000 > $OUT/server.log 2>&1 &
PG=$!
# the server's process group ends with this script, however it ends (a device call's time limit included)
trap 'kill -TERM -- -$PG 2>/dev/null; sleep 3; kill -KILL -- -$PG 2>/dev/null' EXIT
trap 'exit 143' TERM INT
for i in $(seq 1 150); do
  kill -0 $PG 2>/dev/null || { el "the server exited while starting: $OUT/server.log"; exit 6; }
  curl -sf http://127.0.0.1:31000/health >/dev/null && break; sleep 0.5
done
el "ready? $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:31000/health)"
curl -s http://127.0.0.1:31000/metrics > $OUT/metrics-ngram-before.txt
curl -s http://127.0.0.1:31000/server_info > $OUT/server-info-ngram.json
B='{"input_ids":[5,6,7,8,9,10,11,12],"sampling_params":{"max_new_tokens":32,"temperature":0,"ignore_eos":true},"stream":true}'
curl -sN -H 'Content-Type: application/json' -d "$B" http://127.0.0.1:31000/generate > $OUT/generate-stream-ngram.txt
L='{"input_ids":[5,6,7,8,9,10,11,12],"sampling_params":{"max_new_tokens":128,"temperature":0,"ignore_eos":true}}'
# a wave's own curls are waited for, never the server (a bare `wait` waits for every job of the script)
REQ=$(mktemp -d)  # the requests' answers, this run's only
for j in $(seq 1 3); do
  PIDS=(); for k in $(seq 1 16); do
    curl -s -m 120 -H 'Content-Type: application/json' -d "$L" http://127.0.0.1:31000/generate > $REQ/g$j-$k.json &
    PIDS+=($!)
  done; wait "${PIDS[@]}"
done
python3 - "$REQ" > $OUT/load-sums.txt <<'PY'
import json, pathlib, sys
x = [json.loads(f.read_text())["meta_info"] for f in pathlib.Path(sys.argv[1]).glob("g*.json")]
print(len(x), sum(m["completion_tokens"] for m in x), sum(m.get("spec_verify_ct", 0) for m in x))
PY
sleep 1; curl -s http://127.0.0.1:31000/metrics > $OUT/metrics-ngram-after.txt
el "done: $(cat $OUT/load-sums.txt)"
