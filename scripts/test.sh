#!/usr/bin/env bash
# The project's test command: installs everything the tests need, then runs the whole suite.
#   - Debian's prometheus package (promtool + a real Prometheus server) when promtool is missing and we are root
#   - the package with its test extras
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k engine`).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q prometheus
  else
    echo "scripts/test.sh: promtool not found; install Debian's 'prometheus' package (the deploy tests need it)" >&2
  fi
fi
python -m pip install -q -e '.[test]'
exec python -m pytest "$@"
