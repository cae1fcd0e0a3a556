#!/usr/bin/env bash
# Proof jobs on a lent GPU host that outlive one device call. A device call is cut at 600 s, and a whole judged
# gpu1-sglang run with its restarts takes longer; so the first call starts a driver in a session of its own, which
# runs ci/gpu-proof-sglang.sh once per job, in order, and every call (the first too) waits up to WAIT s for it, then
# packs what has finished into $OUT. A later call on the same warm host finds the driver by its pid file and waits on.
#
#   JOBS='healthy|all|32,64,96|;cg|rr16|32,64,96|--server-arg=--cuda-graph-bs-decode --server-arg=1 ...' \
#     KIT=.kit/sglang-0.5.17-gpu-site.tar.xz [JIT_CACHE=...] WAIT=560 OUT=... bash ci/gpu-jobs.sh
#
# A job is name|perf-config (all: every config)|levels|extra pytest arguments, jobs separated by ';'. Each finished
# job comes back as $OUT/NAME.tar (its run file, raw records, server log and pytest's log); $OUT/jobs.log says what
# ran. The JIT caches are kept under $BASE/jit for every job and come back as $OUT/jit-cache.tar.xz once all are done.
set -uo pipefail
cd "$(dirname "$0")/.."
BASE=${GPU_JOBS_DIR:-/tmp/sglperf-gpu-jobs}
WAIT=${WAIT:-560}
OUT=${OUT:?OUT names the folder that comes back}
mkdir -p "$BASE" "$OUT"
log() { echo "[gpu-jobs $(date +%T)] $*" | tee -a "$BASE/jobs.log"; }

drive() {  # the driver: every job in order, each once
  local i=0 job name cfg levels extra args
  IFS=';' read -r -a jobs <<< "$JOBS"
  for job in "${jobs[@]}"; do
    i=$((i + 1))
    IFS='|' read -r name cfg levels extra <<< "$job"
    [ -e "$BASE/$name.done" ] && continue
    args=$extra
    [ "$cfg" != all ] && args="--perf-config $cfg $args"
    log "job $i $name: config $cfg, levels $levels, extra: ${extra:-none}"
    PROOF_DIR="$BASE/$name" JIT_DIR="$BASE/jit" RUNS=1 LEVELS="$levels" EXTRA_PYTEST_ARGS="$args" \
      bash "${PROOF_SCRIPT:-ci/gpu-proof-sglang.sh}" > "$BASE/$name.out" 2>&1
    echo $? > "$BASE/$name.done"
    log "job $i $name: exit $(cat "$BASE/$name.done")"
  done
  log "all jobs done"
}

if [ "${1:-}" = drive ]; then
  drive
  exit 0
fi
if ! { [ -f "$BASE/driver.pid" ] && kill -0 "$(cat "$BASE/driver.pid")" 2>/dev/null; }; then
  [ -f "$BASE/driver.pid" ] || log "starting the driver"
  setsid bash "$0" drive > "$BASE/driver.out" 2>&1 < /dev/null &
  echo $! > "$BASE/driver.pid"
fi
t0=$(date +%s)
while kill -0 "$(cat "$BASE/driver.pid")" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$WAIT" ]; do sleep 5; done
kill -0 "$(cat "$BASE/driver.pid")" 2>/dev/null && log "still running after this call's $WAIT s"

for d in "$BASE"/*/; do  # each finished job, once: its run file, raw records, logs
  name=$(basename "$d")
  [ -e "$BASE/$name.done" ] && [ ! -e "$BASE/$name.sent" ] || continue
  tar -cf "$OUT/$name.tar" -C "$BASE" "$name.out" $(cd "$BASE" && ls -d "$name"/run-1/runs/*.json "$name"/run-1-raw.tar \
    "$name"/run-1/pytest.log "$name"/nvidia-smi.txt "$name"/sglang-flags.txt 2>/dev/null) && touch "$BASE/$name.sent"
done
if grep -q "all jobs done" "$BASE/jobs.log" && [ ! -e "$BASE/jit.sent" ]; then
  tar -cJf "$OUT/jit-cache.tar.xz" -C "$BASE/jit" --transform 's,^\.,jit,' . 2>/dev/null && touch "$BASE/jit.sent"
fi
cp "$BASE/jobs.log" "$OUT/jobs.log"
