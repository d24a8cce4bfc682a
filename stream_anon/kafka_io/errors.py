"""The error types of the Kafka layer (what a caller can do about each is in its docstring)."""

from __future__ import annotations


class BrokerUnavailableError(RuntimeError):
    """The broker could not be reached within ``kafka.startup_retry_seconds``, or the service was stopped while
    waiting for it (outputs not acknowledged: nothing is committed, a restart re-reads from the watermarks)."""


class ProducerFatalError(RuntimeError):
    """The producer client is in a fatal state (e.g. its idempotent producer id was fenced or could not be
    renewed): it cannot send again; close it and create a new one (``OutputProducer.reopen``)."""


class ProducerStuckError(ProducerFatalError):
    """The producer has not had a message acknowledged for ``service.producer_recovery_seconds`` (the client
    may never recover by itself, e.g. an idempotent producer after a broker restart): close it and create a new
    one."""


class MessageRejectedError(RuntimeError):
    """The broker or the client refused a message for good (too large, topic not authorized ...): re-sending it
    cannot succeed."""


class CommitFailedError(RuntimeError):
    """A commit of consumer offsets failed (e.g. after a rebalance the partition has a new owner, or the broker did
    not answer): nothing was committed; the caller commits again later or reads the records again."""


class ConsumerFailedError(RuntimeError):
    """The group consumer's polls kept failing (e.g. fenced) for longer than their bound while the broker answered:
    the process exits 1 so that a supervisor starts a fresh member."""
