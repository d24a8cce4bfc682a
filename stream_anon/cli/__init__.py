"""``stream-anon`` command line: one sub-command per module in this package.

Each module ``stream_anon/cli/<name>.py`` exposes ``register(subparsers) -> None``, which adds its
sub-command(s) and sets ``func`` (a callable taking the parsed namespace, returning an exit code).  The modules
are imported statically (:data:`COMMAND_MODULES`): one that cannot be imported is an error of every command,
never a sub-command silently missing.  A command's heavy work (the service's clients, the benchmarks,
matplotlib for the report) is imported when the command runs.

Logging: ``--log-level`` (default INFO) for stream-anon's own loggers; the Kafka client libraries' loggers
(:data:`CLIENT_LOGGERS`: kafka-python's and librdkafka's) are off unless the level is DEBUG
(:func:`~stream_anon.kafka_io.lifecycle.quiet_client_libraries`): stream-anon says what the operator needs.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

import stream_anon
from stream_anon.cli import anonymize, audit, bench, privacy, report, service, udp
from stream_anon.cli.arguments import one_line_errors
from stream_anon.kafka_io.lifecycle import (
    CLIENT_LOGGERS as CLIENT_LOGGERS,  # re-exported: the loggers it quiets
)
from stream_anon.kafka_io.lifecycle import quiet_client_libraries

# Sub-command modules, in the order they appear in --help (a module that cannot be imported is an error, never
# skipped: the import above fails).
COMMAND_MODULES: tuple[ModuleType, ...] = (
    anonymize,  # anonymize, verify                     (core engine)
    bench,      # bench engine|ldp-*|service|side|udp-loss (benchmarks)
    privacy,    # perturb, estimate                     (LDP mechanisms)
    service,    # run, demo                             (streaming service)
    audit,      # audit                                 (ledger accounting)
    udp,        # udp-bridge                            (UDP ingest)
    report,     # report                                (visual report)
)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def version_text() -> str:
    """``stream-anon X.Y.Z`` from the installed package's metadata (the source tree's ``__version__`` when it
    is not installed), with the Python and Kafka client versions (what a bug report needs)."""
    import importlib.metadata

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    own = version("stream-anon")
    if own == "not installed":
        own = stream_anon.__version__
    return (f"stream-anon {own} (Python {platform.python_version()}, kafka-python {version('kafka-python')}, "
            f"confluent-kafka {version('confluent-kafka')})")


class _VersionAction(argparse.Action):
    """``--version``: :func:`version_text`, looked up only when asked (package metadata is slow to import)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-anon",
        description="Real-time anonymization of record streams: delay-bounded k-anonymity and local differential privacy.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show the versions of stream-anon, Python and the Kafka clients, and exit")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        help="logging level of stream-anon (default INFO); DEBUG also shows the Kafka clients' "
                             "INFO and DEBUG logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return one_line_errors(parser)


class CancelledMetadataRefresh(logging.Filter):
    """Drops kafka-python's ``ERROR Metadata refresh: failed Cancelled``: a client closed while its periodic
    metadata request was in flight (every short-lived reader at the end of a demo, an audit, a replay).  Nothing
    failed; any other metadata error still passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "Metadata refresh: failed %s" and len(record.args or ()) == 1
                    and type(record.args[0]).__name__ == "Cancelled")  # type: ignore[index]


def configure_logging(level_name: str) -> None:
    """The root logger at ``level_name``; the Kafka client libraries off unless DEBUG; the
    benign ``Metadata refresh: failed Cancelled`` of closing clients dropped (:class:`CancelledMetadataRefresh`)."""
    cluster = logging.getLogger("kafka.cluster")
    if not any(isinstance(f, CancelledMetadataRefresh) for f in cluster.filters):
        cluster.addFilter(CancelledMetadataRefresh())
    level = getattr(logging, level_name.upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)  # also when a handler exists already (basicConfig then does nothing)
    quiet_client_libraries(level)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = int(args.func(args) or 0)
    except KeyboardInterrupt:
        rc = 130
    if argv is None and args.command in FAST_EXIT_COMMANDS:
        fast_exit(rc)
    return rc


FAST_EXIT_COMMANDS = ("run", "demo")
"""Commands whose process ends with :func:`fast_exit` (when started from the command line): everything they
started is stopped and closed by then, and the interpreter's teardown of their modules (numpy, pandas, the
Kafka clients: about a second on a busy machine) would only delay the end of a stop (a Ctrl-C ends within 2 s)."""


def fast_exit(rc: int) -> NoReturn:
    """Flush what is written and end the process now with ``rc`` (no interpreter teardown)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(rc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
