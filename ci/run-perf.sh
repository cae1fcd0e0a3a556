#!/usr/bin/env bash
# The perf job on the self-hosted Blackwell runner (called by .github/workflows/perf-blackwell.yml; runnable by
# hand too). Exits with pytest's exit code, so the job is red exactly when the suite is.
#
#   PROFILE=glm5-nvfp4-tp8 LEVELS=1024,2048 SGLANG_VERSION=0.5.23 bash ci/run-perf.sh
#
# Persistent state lives in $SGLPERF_PERSIST_DIR (default /var/lib/sglperf): the runner's venv, the run history
# (reports/history.jsonl equivalent) and the Allure history, so trends survive workspace cleanups.
set -uo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-glm5-nvfp4-tp8}
LEVELS=${LEVELS:-}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
PERSIST=${SGLPERF_PERSIST_DIR:-/var/lib/sglperf}
mkdir -p "$PERSIST" reports

if [ ! -x "$PERSIST/venv/bin/python" ]; then
  python3 -m venv "$PERSIST/venv"
fi
. "$PERSIST/venv/bin/activate"
pip install --quiet --disable-pip-version-check -e '.[dev]' "sglang==${SGLANG_VERSION}" || exit 3

rm -rf reports/allure-results reports/allure-report
args=(perf_tests -m gpu8 --profile "$PROFILE" -rs
      --alluredir reports/allure-results --benchmark-json reports/benchmark.json
      --history-file "$PERSIST/history.jsonl")
[ -n "$LEVELS" ] && args+=(--levels "$LEVELS")
pytest "${args[@]}"
rc=$?

# Report and drift never decide the job's status; they are evidence.
sglperf report --results reports/allure-results --output reports/allure-report \
  --history "$PERSIST/allure-history.jsonl" --name "${GITHUB_WORKFLOW:-perf} #${GITHUB_RUN_NUMBER:-local}" || true
sglperf drift "$PERSIST/history.jsonl" --json reports/drift.json || true
exit "$rc"
