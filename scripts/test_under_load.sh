#!/usr/bin/env bash
# The whole suite with one busy-loop process per core running beside it (issue 10: tests must not depend on the
# machine's speed).  `bash scripts/test_under_load.sh [ROUNDS] [pytest args...]` runs scripts/test.sh ROUNDS times
# (default 2) and prints each round's result line; exits non-zero if any round failed.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-2}"
shift || true
mkdir -p .cache
cores="$(nproc)"
pids=()
for _ in $(seq "$cores"); do
  python -c "while True: pass" &
  pids+=("$!")
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
echo "test_under_load: $cores busy-loop process(es) running beside the suite"
failed=0
for round in $(seq "$rounds"); do
  start=$(date +%s)
  bash scripts/test.sh -q -p no:cacheprovider "$@" > ".cache/test_under_load.$round.log" 2>&1
  rc=$?
  echo "round $round: exit $rc in $(( $(date +%s) - start )) s: $(tail -n 1 ".cache/test_under_load.$round.log")"
  [ "$rc" = 0 ] || failed=1
done
exit "$failed"
