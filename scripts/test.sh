#!/usr/bin/env bash
# The project's test command: installs everything the tests need, then runs the whole suite.
#   - Debian's prometheus package (promtool + a real Prometheus server) when promtool is missing and we are root
#   - Node.js/npm (Debian's nodejs and npm) when missing and we are root, then the npm package s3rver into the
#     project-local, gitignored .cache/npm (the durable-broker tests run Tansu on it; stream_anon.kafka_io.broker
#     finds it there, or wherever $STREAM_ANON_S3RVER points)
#   - Java 17 and Maven (Debian's openjdk-17-jre-headless and maven) when missing and we are root, then the Apache
#     Kafka jars into the project-local, gitignored .cache/apache-kafka (`python scripts/apache_kafka.py fetch`,
#     from Maven Central; idempotent), so the Apache Kafka tests never download mid-run
#   - the package with its test extras
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k engine`).
#
# `bash scripts/test.sh --fast [pytest args]` installs nothing and runs the fast tier (README "Testing"): every
# test marked neither `integration` (a broker, a server, a subprocess: applied in tests/conftest.py) nor `slow`,
# i.e. every unit, property and pure test, on every core (pytest-xdist, from the test extras; `-n 0`: one
# process, e.g. for --pdb); under 2 minutes on two cores, also beside a busy loop per core.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode, and pytest's rewritten test modules, are cached under the gitignored .cache/pycache (never beside the
# sources), also where PYTHONDONTWRITEBYTECODE is set: collection takes ~2 s instead of ~12 s.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/.cache/pycache}"
unset PYTHONDONTWRITEBYTECODE
FAST_TIER="not integration and not slow"
args=()
fast=0
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else args+=("$arg"); fi
done
if [ "$fast" = 1 ]; then
  workers=()
  if python -c "import xdist" 2>/dev/null; then
    workers=(-n auto --dist loadfile)  # a file's tests in one worker, in file order (as when run alone)
  else
    echo "scripts/test.sh: pytest-xdist is missing (pip install -e '.[test]'): the fast tier runs on one core" >&2
  fi
  exec python -m pytest -m "$FAST_TIER" ${workers[@]+"${workers[@]}"} ${args[@]+"${args[@]}"}
fi
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q prometheus
  else
    echo "scripts/test.sh: promtool not found; install Debian's 'prometheus' package (the deploy tests need it)" >&2
  fi
fi
if ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q nodejs npm; } \
      || echo "scripts/test.sh: installing nodejs/npm failed; the durable broker tests will fail" >&2
  else
    echo "scripts/test.sh: npm not found; install Node.js and npm (the durable broker tests need s3rver)" >&2
  fi
fi
if [ -z "${STREAM_ANON_S3RVER:-}" ] && [ ! -f .cache/npm/node_modules/s3rver/lib/s3rver.js ] \
    && command -v npm >/dev/null 2>&1; then
  npm install --prefix .cache/npm --no-audit --no-fund s3rver@3.7.1 \
    || echo "scripts/test.sh: installing s3rver failed; the durable broker tests will fail" >&2
fi
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q openjdk-17-jre-headless maven; } \
      || echo "scripts/test.sh: installing Java/Maven failed; the Apache Kafka tests will fail" >&2
  else
    echo "scripts/test.sh: java or mvn not found; install Java 17+ and Maven (the Apache Kafka tests need them)" >&2
  fi
fi
python -m pip install -q -e '.[test]'
if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
  python scripts/apache_kafka.py fetch \
    || echo "scripts/test.sh: fetching Apache Kafka failed; the Apache Kafka tests will fail" >&2
fi
# the full suite: integration tests mostly wait on brokers and processes, so two workers (a file's tests in one
# worker, in file order) halve its time on a 2-core machine; STREAM_ANON_TEST_WORKERS=1 runs it in one process
workers=()
if [ "${STREAM_ANON_TEST_WORKERS:-2}" -gt 1 ] && python -c "import xdist" 2>/dev/null; then
  workers=(-n "${STREAM_ANON_TEST_WORKERS:-2}" --dist loadfile)
fi
exec python -m pytest ${workers[@]+"${workers[@]}"} "$@"
