#!/usr/bin/env bash
# The test command: set up, bring the infrastructure up, run the whole suite, and stop again
# whatever this script started.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1
started_here=0
if ! .venv/bin/concord stack status >/dev/null 2>&1; then
  started_here=1
fi
stack_started=$(date +%s)
.venv/bin/concord stack up --infra-only || exit 1
echo "stack up in $(( $(date +%s) - stack_started ))s"

.venv/bin/python -m pytest "$@"
rc=$?

if [ "$started_here" = 1 ] && [ -z "${CONCORD_KEEP_STACK:-}" ]; then
  .venv/bin/concord stack down
fi
exit $rc
