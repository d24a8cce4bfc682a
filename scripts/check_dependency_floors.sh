#!/usr/bin/env bash
# Installs the LOWEST versions pyproject.toml allows (every ">=" floor pinned, scripts/dependency_floors.py) in a
# throwaway virtual environment and runs a smoke test of the code against them: the producer with both clients and
# the consumer against a real Tansu broker, the side app, the service loop, config loading and the CLI.
# Needs the network (PyPI) and $STREAM_ANON_ADULT; about 2-3 minutes, so it is not part of scripts/test.sh:
#   bash scripts/check_dependency_floors.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m venv "$work/venv"
py="$work/venv/bin/python"
python scripts/dependency_floors.py > "$work/floors.txt"
echo "dependency floors:"; sed 's/^/  /' "$work/floors.txt"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q -r "$work/floors.txt" "pytest>=8" "pytest-timeout>=2.2" "hypothesis>=6.90"  # tests/conftest.py imports hypothesis
"$py" -m pip list 2>/dev/null | grep -i -E "kafka|prometheus|numpy|numba|pandas|pyyaml|crc32c|matplotlib|calfkit|randomgen" | sed 's/^/  installed: /'
PYTHONPATH="$PWD" "$py" -m pytest -q -p no:cacheprovider -o addopts="" \
  tests/test_service_producer.py tests/test_service_config.py tests/test_side_app.py tests/test_import_graph.py \
  "tests/test_service_run.py::test_bulk_histogram_counts_what_observe_counts" \
  "tests/test_service_run.py::test_idle_flush_releases_a_quiet_partition" \
  "tests/test_side_kafka.py::test_side_app_budget_exhaustion_stops_kmeans_and_survives_a_restart" "$@"
