#!/usr/bin/env bash
# The perf job on the self-hosted Blackwell runner (called by .github/workflows/perf-blackwell.yml; runnable by
# hand too). Exits with pytest's exit code, so the job is red exactly when the suite is.
#
#   PROFILE=glm5-nvfp4-tp8 LEVELS=1024,2048 SGLANG_VERSION=0.5.23 bash ci/run-perf.sh
#
# Persistent state lives in $SGLPERF_PERSIST_DIR (default /var/lib/sglperf): the runner's venv, the run history
# (reports/history.jsonl equivalent) and the Allure history, so trends survive workspace cleanups.
# MARKER (default gpu8) selects the perf tests; SGLANG_VERSION= (empty) installs no SGLang (other engines);
# SGLPERF_SKIP_INSTALL=1 uses the Python environment as the caller prepared it (an offline host: ci/gpu-proof.sh);
# EXTRA_PYTEST_ARGS are appended to pytest's arguments (e.g. --server-arg=... for a run slowed on purpose);
# REPORTS_DIR (default reports) receives the run file, server logs, Allure results and report, drift.json.
set -uo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-glm5-nvfp4-tp8}
MARKER=${MARKER:-gpu8}
LEVELS=${LEVELS:-}
SGLANG_VERSION=${SGLANG_VERSION-0.5.23}
PERSIST=${SGLPERF_PERSIST_DIR:-/var/lib/sglperf}
REPORTS=${REPORTS_DIR:-reports}
mkdir -p "$PERSIST" "$REPORTS"

if [ "${SGLPERF_SKIP_INSTALL:-0}" != 1 ]; then
  if [ ! -x "$PERSIST/venv/bin/python" ]; then
    python3 -m venv "$PERSIST/venv"
  fi
  . "$PERSIST/venv/bin/activate"
  pip install --quiet --disable-pip-version-check -e '.[dev]' ${SGLANG_VERSION:+"sglang==${SGLANG_VERSION}"} || exit 3
fi
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || PY=python

rm -rf "$REPORTS/allure-results" "$REPORTS/allure-report"
args=(perf_tests -m "$MARKER" --profile "$PROFILE" -rs --reports-dir "$REPORTS"
      --alluredir "$REPORTS/allure-results" --benchmark-json "$REPORTS/benchmark.json"
      --history-file "$PERSIST/history.jsonl")
[ -n "$LEVELS" ] && args+=(--levels "$LEVELS")
# shellcheck disable=SC2206
[ -n "${EXTRA_PYTEST_ARGS:-}" ] && args+=(${EXTRA_PYTEST_ARGS})
"$PY" -m pytest "${args[@]}"
rc=$?

# Report and drift never decide the job's status; they are evidence.
"$PY" -m sglperf report --results "$REPORTS/allure-results" --output "$REPORTS/allure-report" \
  --history "$PERSIST/allure-history.jsonl" --name "${GITHUB_WORKFLOW:-perf} #${GITHUB_RUN_NUMBER:-local}" || true
"$PY" -m sglperf drift "$PERSIST/history.jsonl" --json "$REPORTS/drift.json" || true
exit "$rc"
