#!/usr/bin/env bash
# The main job on a fresh machine: set up, bring the whole stack up (Postgres, Redis,
# Elasticsearch, API, workers, beat), ingest the bundled demo corpus through the queue, and run
# a few searches. The stack keeps running afterwards; stop it with `.venv/bin/concord stack down`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
.venv/bin/concord stack up

KEY_FILE=.concord/demo-api-key
if [ ! -s "$KEY_FILE" ]; then
  .venv/bin/concord keys create --tenant demo --scopes read,write --name demo > "$KEY_FILE"
fi
export CONCORD_API_KEY=$(cat "$KEY_FILE")

(cd demo && ../.venv/bin/concord ingest corpus --tenant demo --wait --timeout 300)

for query in "Ituri rainforest" "animal with stripes that is related to giraffes" \
             "how do I get rid of limescale" "how often must I feed my bread yeast culture"; do
  .venv/bin/concord search "$query" --top-k 3
done

API=$(.venv/bin/python -c "from shared.settings import get_settings; print(get_settings().api_url())")
echo
echo "API: $API (OpenAPI docs at $API/docs); demo tenant key in $KEY_FILE"
echo "try: CONCORD_API_KEY=\$(cat $KEY_FILE) .venv/bin/concord search 'pumice'"
echo "console: $API/console/ (operator pages need an admin key:"
echo "  .venv/bin/concord keys create --tenant demo --scopes admin --name console)"
