#!/usr/bin/env bash
# The Haystack peer's own virtual environment (bench/peers/haystack/.venv).
#
# elasticsearch-haystack pins the 8.x Elasticsearch client and Concord uses 9.x, so the peer
# cannot share Concord's environment. It does share Concord's PyTorch and sentence-transformers
# (a multi-GB CUDA build from PyPI): a .pth file appends Concord's site-packages to the peer's
# sys.path, after the peer's own packages, so the peer's elasticsearch 8.x wins.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
concord_site="$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

[ -x "$here/.venv/bin/python" ] || python3 -m venv "$here/.venv"
"$here/.venv/bin/pip" install -q -r "$here/requirements.txt"
# Its declared dependency is sentence-transformers (and with it torch): taken from Concord's env.
"$here/.venv/bin/pip" install -q --no-deps sentence-transformers-haystack==2.0.0
peer_site="$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$concord_site" > "$peer_site/zz_concord_shared_torch.pth"
"$here/.venv/bin/python" -c 'import elasticsearch, sentence_transformers; assert elasticsearch.__version__[0] == 8'
echo "haystack peer ready: $here/.venv"
