#!/usr/bin/env bash
# The test command: set up, bring the infrastructure up, run the whole suite, and stop again
# whatever this script started.
#
#   bash scripts/test.sh              the whole suite, as CI runs it (below)
#   bash scripts/test.sh ARGS...      pytest ARGS, one process, on the suite's infrastructure
#
# The whole suite, on two cores in about 13 minutes (805 tests, December 2026):
#   1. ruff (lint and format) and mypy --strict: a type or style error fails in a minute;
#   2. three pytest runs at once, each on infrastructure of its own:
#      - every tier but system, in parallel (pytest-xdist, CONCORD_TEST_WORKERS processes,
#        2 by default): each worker has its own database, index prefix, Redis database and
#        Celery workers (tests/conftest.py);
#      - the system tier (tests/system: outages, kills, clusters, the stack itself) in two
#        halves, one test at a time each, on a Postgres, Redis and Elasticsearch of their own
#        (ports +10000 and +20000), which they stop and start as they please;
#   3. the time of each tier, and the slowest tests.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1
# The suite starts Elasticsearch a dozen times (three servers, a cluster, outages) for
# minutes of light work each: with the C1 compiler alone a start costs half the CPU (5.4 s
# against 10.1 s a node, measured on this machine), on two cores the whole suite shares.
export CONCORD_ES_JVM_OPTIONS="${CONCORD_ES_JVM_OPTIONS--XX:TieredStopAtLevel=1}"
# Memory: the three runs at once peaked at 22.7 of this machine's 24 GiB (three servers of
# 1 GiB heap each, and per xdist worker about 1.9 GiB for itself and 1.5 for its Celery
# processes, the model loaded in each), and one run before was cut short by the kernel's
# OOM killer. The suite's indices are small: half a GiB of heap is plenty.
export CONCORD_ES_HEAP="${CONCORD_ES_HEAP-512m}"
py=.venv/bin/python
phase_started=$(date +%s)
phase() {  # name of the phase that just ended; prints its wall time
  local now; now=$(date +%s)
  printf '%-28s %4ds\n' "$1" $((now - phase_started)) | tee -a "${timings:-/dev/null}"
  phase_started=$now
}

# One ONNX export of the embedding model for the three runs (each has a state directory of
# its own), written once below while mypy runs rather than by the first workers of each run
# at once, on the tests' clock.
state_dir=${CONCORD_STATE_DIR:-.concord}
mkdir -p "$state_dir"
export CONCORD_ONNX_EXPORT_DIR="${CONCORD_ONNX_EXPORT_DIR:-$(cd "$state_dir" && pwd)/models/onnx}"

started_here=0
if ! .venv/bin/concord stack status >/dev/null 2>&1; then
  started_here=1
fi

if [ $# -gt 0 ]; then  # a chosen part of the suite, as before
  .venv/bin/concord stack up --infra-only || exit 1
  $py -m pytest "$@"
  rc=$?
  if [ "$started_here" = 1 ] && [ -z "${CONCORD_KEEP_STACK:-}" ]; then
    .venv/bin/concord stack down
  fi
  exit $rc
fi

mkdir -p test-artifacts
timings=test-artifacts/timings.txt
: >"$timings"
phase "setup"

.venv/bin/ruff check . && .venv/bin/ruff format --check . || { echo "ruff failed"; exit 1; }
phase "ruff"

# Three sets of infrastructure, started while mypy runs: the non-system tiers' one, and one
# for each half of the system tier, which stops and starts its stores as it pleases (other
# ports, another state directory). The system tests mostly wait (an outage of a minute, a
# fault held for seconds), so its two halves at once take half the time of one run.
system_a=(
  CONCORD_TEST_RUN=system_a CONCORD_STATE_DIR="${CONCORD_STATE_DIR:-.concord}/system-tier"
  CONCORD_PG_PORT=25432 CONCORD_REDIS_PORT=26379
  CONCORD_ES_PORT=29200 CONCORD_ES_TRANSPORT_PORT=29300
)
# (Below Linux's ephemeral range, 32768-60999, as the defaults are: there a cluster test's
# node found its transport port taken by the local end of some outgoing connection.)
system_b=(
  CONCORD_TEST_RUN=system_b CONCORD_STATE_DIR="${CONCORD_STATE_DIR:-.concord}/system-tier-b"
  CONCORD_PG_PORT=21432 CONCORD_REDIS_PORT=21379
  CONCORD_ES_PORT=21200 CONCORD_ES_TRANSPORT_PORT=21300
)
.venv/bin/concord stack up --infra-only >test-artifacts/stack-up.log 2>&1 &
main_infra=$!
env "${system_a[@]}" .venv/bin/concord stack up --infra-only \
  >test-artifacts/stack-up-system-a.log 2>&1 &
system_a_infra=$!
env "${system_b[@]}" .venv/bin/concord stack up --infra-only \
  >test-artifacts/stack-up-system-b.log 2>&1 &
system_b_infra=$!
$py -c 'from shared.ingest.embedding import get_embedder as e; e().passage_encoder(); e().query_encoder()' \
  >test-artifacts/onnx-export.log 2>&1 &
onnx_export=$!
stop_stacks() {
  if [ "$started_here" = 1 ] && [ -z "${CONCORD_KEEP_STACK:-}" ]; then
    .venv/bin/concord stack down >/dev/null
    env "${system_a[@]}" .venv/bin/concord stack down >/dev/null
    env "${system_b[@]}" .venv/bin/concord stack down >/dev/null
  fi
}
# Its cache outside the checkout, as pip's and uv's are: a clean clone on a machine that ran
# it before checks only what changed (3 s against 87 s; mypy compares each file's hash).
mypy_cache=${CONCORD_MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/concord/mypy}
if ! $py -m mypy --cache-dir "$mypy_cache" shared services workers clients/python/concord_client; then
  echo "mypy failed"
  wait
  stop_stacks
  exit 1
fi
phase "mypy --strict"
wait $main_infra || { cat test-artifacts/stack-up.log; exit 1; }
wait $system_a_infra || { cat test-artifacts/stack-up-system-a.log; exit 1; }
wait $system_b_infra || { cat test-artifacts/stack-up-system-b.log; exit 1; }
wait $onnx_export || { cat test-artifacts/onnx-export.log; exit 1; }
phase "infrastructure up, export"

workers=${CONCORD_TEST_WORKERS:-2}
# Each run ends within CONCORD_TEST_RUN_LIMIT_S (about three times its usual time): past it,
# scripts/watchdog.py prints the stacks of every process of the run and the end of its log,
# and stops it, so that a hang outside pytest-timeout's reach (a process that never exits, a
# call that never returns to Python) fails with a cause instead of running out CI's clock.
run_limit=${CONCORD_TEST_RUN_LIMIT_S:-1500}
capped() {  # LOG COMMAND...
  local log=$1
  shift
  : >"$log"
  $py scripts/watchdog.py --limit "$run_limit" --log "$log" -- "$@"
}
tiers_started=$(date +%s)
capped test-artifacts/parallel-tiers.log \
  $py -m pytest tests -m "not system" -n "$workers" --dist loadfile --max-worker-restart 0 \
  -p no:cacheprovider &
parallel=$!
# the reliability file (a third of the system tier's time) beside the rest
capped test-artifacts/system-tier-a.log \
  env "${system_a[@]}" $py -m pytest tests/system/test_reliability.py -p no:cacheprovider &
system_a_run=$!
capped test-artifacts/system-tier-b.log \
  env "${system_b[@]}" $py -m pytest tests/system --ignore tests/system/test_reliability.py \
  -p no:cacheprovider &
system_b_run=$!
wait $system_a_run
system_a_rc=$?
printf '%-28s %4ds\n' "system tier, reliability" $(( $(date +%s) - tiers_started )) | tee -a "$timings"
wait $system_b_run
system_b_rc=$?
printf '%-28s %4ds\n' "system tier, the rest" $(( $(date +%s) - tiers_started )) | tee -a "$timings"
wait $parallel
parallel_rc=$?
printf '%-28s %4ds\n' "other tiers (-n $workers)" $(( $(date +%s) - tiers_started )) | tee -a "$timings"
phase "tests (three runs)"

for log in parallel-tiers system-tier-a system-tier-b; do
  echo "================ $log ================"
  # the per-tier summary, the slowest tests and the outcome (the whole log is in test-artifacts/)
  sed -n '/tier timings/,$p' "test-artifacts/$log.log"
done

stop_stacks
echo "================ wall time per phase ================"
cat "$timings"
[ "$parallel_rc" = 0 ] && [ "$system_a_rc" = 0 ] && [ "$system_b_rc" = 0 ]
