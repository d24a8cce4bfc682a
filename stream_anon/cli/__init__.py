"""``stream-anon`` command line: one sub-command per module in this package.

Each module ``stream_anon/cli/<name>.py`` exposes ``register(subparsers) -> None``, which adds its
sub-command(s) and sets ``func`` (a callable taking the parsed namespace, returning an exit code).  The modules
import only what their parsers need at module level; a command's work imports the rest when it runs (the
benchmarks, the service, matplotlib for the report), so ``stream-anon --help`` stays quick.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from stream_anon.cli import anonymize, audit, bench, privacy, report, service, udp

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-anon",
        description="Real-time anonymization of record streams: delay-bounded k-anonymity and local differential privacy.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ERROR)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
