#!/usr/bin/env bash
# One-shot topic creation for the compose stack (runs in the apache/kafka image as the kafka-topics job).
#
# Partition counts:
#   * the input topic has INPUT_PARTITIONS partitions: the upper bound on useful stream-anon replicas
#     (one consumer-group member per partition; see docs/deploy.md, "Scaling out");
#   * the per-record outputs (anonymized, suppressed, dead-letter, LDP copies) and the internal ledger
#     (<input>.ledger, compacted) have the SAME count: the service writes what it derives from input partition p
#     to ledger and output partition p, so after a crash or a rebalance the new owner of p reads back only the
#     tail of ledger partition p (and of output partition p from the last checkpoint) (docs/service.md);
#   * the periodic estimate and k-means topics have one partition: a single ordered series of windows;
#   * the side paths' budget topic (<input>.side-budget) and write-ahead topic (<input>.side-outbox), both compacted,
#     have one partition each (docs/side-paths.md).
set -euo pipefail

BOOTSTRAP="${BOOTSTRAP_SERVERS:-kafka:9092}"
INPUT_TOPIC="${INPUT_TOPIC:-adult.raw}"
PARTITIONS="${INPUT_PARTITIONS:-4}"
REPLICATION="${REPLICATION_FACTOR:-1}"
# as the service creates its topics: with 3 or more replicas an acknowledged write (acks=all) is on 2 brokers
MIN_ISR=()
if [ "$REPLICATION" -ge 3 ]; then MIN_ISR=(--config "min.insync.replicas=${MIN_INSYNC_REPLICAS:-2}"); fi
PREFIX="${INPUT_TOPIC%.raw}"
KT=/opt/kafka/bin/kafka-topics.sh

create() {  # name partitions [extra kafka-topics args]
  local name="$1" parts="$2"; shift 2
  "$KT" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$name" \
        --partitions "$parts" --replication-factor "$REPLICATION" ${MIN_ISR[@]+"${MIN_ISR[@]}"} "$@"
  # --if-not-exists keeps an existing topic: fail loudly when its partition count differs.
  local have
  have=$("$KT" --bootstrap-server "$BOOTSTRAP" --describe --topic "$name" | grep -c "Partition: ")
  if [ "$have" -ne "$parts" ]; then
    echo "topic $name has $have partitions, expected $parts: delete it or change INPUT_PARTITIONS" >&2
    exit 1
  fi
  echo "topic $name: $parts partitions"
}

create "$INPUT_TOPIC" "$PARTITIONS"
# the ledger: compacted (the service writes tombstones for what no recovery needs); keep entries for as long as
# `stream-anon audit` must look back (docs/threat-model.md, "Bounded growth")
create "$INPUT_TOPIC.ledger" "$PARTITIONS" --config cleanup.policy=compact \
       --config "min.compaction.lag.ms=${LEDGER_MIN_COMPACTION_LAG_MS:-604800000}"
# the side paths' cumulative budgets (kmeans.total_epsilon, the per-person cap): one partition, compacted, internal
create "$INPUT_TOPIC.side-budget" 1 --config cleanup.policy=compact
# the side paths' write-ahead of their copies (a record on every side topic or none): one partition, compacted, internal
create "$INPUT_TOPIC.side-outbox" 1 --config cleanup.policy=compact
for suffix in anon suppressed dlq krr rs blap; do
  create "$PREFIX.$suffix" "$PARTITIONS"
done
for suffix in estimates kmeans; do
  create "$PREFIX.$suffix" 1
done
