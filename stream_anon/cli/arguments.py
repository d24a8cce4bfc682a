"""Checks of the offline tools' command-line arguments: every operator mistake is one line on stderr, exit 2.

Used by ``anonymize``/``verify`` (``cli/anonymize.py``) and ``perturb``/``estimate`` (``cli/privacy.py``).
Each check names the option (``--input``, ``--schema``, ...) or the environment variable the value came
from, the allowed value and the value received; files are checked before any work starts, so a run never
fails on its output path after minutes of work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # the schema module (numpy, yaml) is imported when a command runs, not for --help
    from stream_anon.core.schema import Schema

EXIT_USAGE = 2


class UsageError(ValueError):
    """An operator mistake (bad option, missing or unreadable file): one line on stderr, exit code 2."""


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def fail(prog: str, error: BaseException | str) -> int:
    """Print ``<prog>: error: <one line>`` on stderr; return the usage exit code (2)."""
    print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
    return EXIT_USAGE


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make argparse's own errors (bad int, missing required option, ...) one line, exit 2, no usage dump."""

    def error(message: str) -> NoReturn:
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {one_line(message)} (see {parser.prog} --help)\n")

    parser.error = error  # type: ignore[method-assign]
    return parser


def input_file(option: str, value: str | os.PathLike[str] | None, *, env: str | None = None) -> Path:
    """An existing, readable regular file from ``option`` (or, when not given, from ``$env``)."""
    source = option
    if value is None and env is not None:
        value = os.environ.get(env) or None
        source = f"${env}"
        if value is None:
            raise UsageError(f"{option}: no input file given and ${env} is not set")
    if value is None or str(value) == "":
        raise UsageError(f"{option}: no file given")
    p = Path(value)
    if not p.exists():
        raise UsageError(f"{source}: file {str(p)!r} does not exist")
    if not p.is_file():
        raise UsageError(f"{source}: {str(p)!r} is not a regular file")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{source}: file {str(p)!r} is not readable (permission denied)")
    return p


def output_file(option: str, value: str | os.PathLike[str], *, inputs: tuple[Path, ...] = ()) -> Path:
    """A path that can be written: not a directory, not one of ``inputs``; missing parent folders are created."""
    if str(value) == "":
        raise UsageError(f"{option}: no file given")
    p = Path(value)
    if p.is_dir():
        raise UsageError(f"{option}: {str(p)!r} is a directory, expected a file path")
    for src in inputs:
        if p.exists() and src.exists() and p.resolve() == src.resolve():
            raise UsageError(f"{option}: {str(p)!r} is also the input file; choose another output path")
    parent = p.parent
    blocker = next((a for a in (parent, *parent.parents) if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UsageError(f"{option}: cannot write {str(p)!r}: {str(blocker)!r} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option}: cannot create the folder {str(parent)!r} for {str(p)!r}: "
                         f"{e.strerror or e}") from None
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{option}: cannot write {str(p)!r} (permission denied)")
    return p


def write_text(option: str, path: Path, text: str) -> None:
    """Write a text output file; an OS error names the option."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{option}: cannot write {str(path)!r}: {e.strerror or e}") from None


def load_schema(option: str, value: str | os.PathLike[str] | None) -> Schema:
    """The schema file of ``option`` (YAML or JSON), or the shipped ADULT schema when ``value`` is None."""
    from stream_anon.core.schema import Schema, SchemaError, adult_schema

    if value is None:
        return adult_schema()
    p = input_file(option, value)
    try:
        return Schema.load(p)
    except SchemaError as e:
        raise UsageError(f"{option} {str(p)!r}: {e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {str(p)!r}: not a UTF-8 text file (expected a YAML or JSON schema)") from None
    except OSError as e:
        raise UsageError(f"{option} {str(p)!r}: cannot be read: {e.strerror or e}") from None


def comma_list(option: str, value: str | None) -> list[str] | None:
    """``a,b,c`` as a list (None when the option was not given); an empty list or a repeated name is an error."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise UsageError(f"{option}: expected a comma-separated list of column names, got {value!r}")
    repeated = sorted({x for x in items if items.count(x) > 1})
    if repeated:
        raise UsageError(f"{option}: each column at most once, got {repeated} more than once in {value!r}")
    return items


def guarded(prog: str, *errors: type[BaseException]) -> Callable[[Callable[[argparse.Namespace], int]],
                                                                 Callable[[argparse.Namespace], int]]:
    """Decorator: :class:`UsageError` and the given exception types become ``prog: error: ...`` and exit 2."""
    caught: tuple[type[BaseException], ...] = (UsageError, *errors)

    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            try:
                return int(fn(args))
            except caught as e:
                return fail(prog, e)

        run.__name__ = fn.__name__
        run.__doc__ = fn.__doc__
        return run

    return wrap
