#!/usr/bin/env bash
# The test command: set up, bring the infrastructure up, run the whole suite, and stop again
# whatever this script started.
#
#   bash scripts/test.sh              the whole suite, as CI runs it (below)
#   bash scripts/test.sh ARGS...      pytest ARGS, one process, on the suite's infrastructure
#
# The whole suite, on two cores in about ten minutes:
#   1. ruff (lint and format) and mypy --strict: a type or style error fails in a minute;
#   2. two pytest runs at once, each on infrastructure of its own:
#      - every tier but system, in parallel (pytest-xdist, CONCORD_TEST_WORKERS processes,
#        3 by default): each worker has its own database, index prefix, Redis database and
#        Celery workers (tests/conftest.py);
#      - the system tier (tests/system: outages, kills, clusters, the stack itself), one
#        test at a time, on a second Postgres, Redis and Elasticsearch (ports +10000), which
#        it stops and starts as it pleases without touching the other run;
#   3. the time of each tier, and the slowest tests.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1
py=.venv/bin/python
phase_started=$(date +%s)
phase() {  # name of the phase that just ended; prints its wall time
  local now; now=$(date +%s)
  printf '%-28s %4ds\n' "$1" $((now - phase_started)) | tee -a "${timings:-/dev/null}"
  phase_started=$now
}

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
$py -m mypy shared services workers || { echo "mypy failed"; exit 1; }
phase "mypy --strict"

# The system tier's own infrastructure: other ports, another state directory.
system_env=(
  CONCORD_STATE_DIR="${CONCORD_STATE_DIR:-.concord}/system-tier"
  CONCORD_PG_PORT=25432 CONCORD_REDIS_PORT=26379
  CONCORD_ES_PORT=29200 CONCORD_ES_TRANSPORT_PORT=29300
)
.venv/bin/concord stack up --infra-only >test-artifacts/stack-up.log 2>&1 &
main_infra=$!
env "${system_env[@]}" .venv/bin/concord stack up --infra-only \
  >test-artifacts/stack-up-system.log 2>&1 &
system_infra=$!
wait $main_infra || { cat test-artifacts/stack-up.log; exit 1; }
wait $system_infra || { cat test-artifacts/stack-up-system.log; exit 1; }
phase "infrastructure up (both)"

workers=${CONCORD_TEST_WORKERS:-3}
tiers_started=$(date +%s)
$py -m pytest tests -m "not system" -n "$workers" --dist loadfile -p no:cacheprovider \
  >test-artifacts/parallel-tiers.log 2>&1 &
parallel=$!
env "${system_env[@]}" $py -m pytest tests/system -p no:cacheprovider \
  >test-artifacts/system-tier.log 2>&1 &
system=$!
wait $system
system_rc=$?
printf '%-28s %4ds\n' "system tier (serial)" $(( $(date +%s) - tiers_started )) | tee -a "$timings"
wait $parallel
parallel_rc=$?
printf '%-28s %4ds\n' "other tiers (-n $workers)" $(( $(date +%s) - tiers_started )) | tee -a "$timings"
phase "tests (both runs)"

for log in parallel-tiers system-tier; do
  echo "================ $log ================"
  # the per-tier summary, the slowest tests and the outcome (the whole log is in test-artifacts/)
  sed -n '/tier timings/,$p' "test-artifacts/$log.log"
done

if [ "$started_here" = 1 ] && [ -z "${CONCORD_KEEP_STACK:-}" ]; then
  .venv/bin/concord stack down >/dev/null
  env "${system_env[@]}" .venv/bin/concord stack down >/dev/null
fi
echo "================ wall time per phase ================"
cat "$timings"
[ "$parallel_rc" = 0 ] && [ "$system_rc" = 0 ]
