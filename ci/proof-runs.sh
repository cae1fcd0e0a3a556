# Sourced by ci/gpu-proof.sh and ci/gpu-proof-sglang.sh: the nightly script itself (ci/run-perf.sh, MARKER gpu1 unless set)
# RUNS times with profile $1, each run under $PROOF/run-N, the history in $PROOF/persist. Each run's raw records and
# server samples are also packed as run-N-raw.tar (no compression: they are gzip already), beside its run file, so a
# device call can bring them back (a file there must stay under 16 MiB: a larger one is named, not truncated).
# Sets rc to the last run's pytest exit code.
proof_runs() {
  local profile=$1 first i dir t
  first=$(( $(find "$PROOF" -maxdepth 1 -name 'run-*' -type d | wc -l) + 1 ))
  rc=0
  for i in $(seq "$first" $(( first + RUNS - 1 ))); do
    dir="$PROOF/run-$i"
    mkdir -p "$dir"
    t=$(date +%s)
    REPORTS_DIR="$dir" SGLPERF_PERSIST_DIR="$PROOF/persist" SGLPERF_SKIP_INSTALL=1 SGLANG_VERSION= PYTHON=python3 \
      PROFILE="${PROFILE:-$profile}" MARKER="${MARKER:-gpu1}" bash ci/run-perf.sh 2>&1 | tee "$dir/pytest.log"
    rc=$?
    log "run $i: pytest exit $rc after $(( $(date +%s) - t )) s"
    if [ -d "$dir/runs" ]; then
      tar -cf "$PROOF/run-$i-raw.tar" -C "$dir" runs servers 2>/dev/null
      [ "$(stat -c %s "$PROOF/run-$i-raw.tar")" -lt 16000000 ] || log "run $i: raw records over 16 MB ($PROOF/run-$i-raw.tar)"
    fi
  done
}
