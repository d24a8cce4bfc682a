"""A user's CSV as the records the service expects: shaped and typed by the schema, keyed by its record id field.

The service's decoder (``stream_anon.formats.decoding.RecordDecoder``) accepts a JSON object whose keys are
exactly the schema's record id field (``record_id``, whatever it is called), its attributes and its person id
field (``person_id``, if any), with numbers as JSON numbers and categories as strings.  A CSV read with
``read_csv_with_schema`` may hold more columns, and its values are strings; :func:`schema_records` keeps
only the schema's fields, converted by ``Schema.validate`` (numbers typed, strings stripped), so every record
passes the decoder.  Rows without a record id column get ``<schema name>-<row>`` ids (in the schema's
record id field); a schema without a record id (``record_id: null``) gives records without an id.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from stream_anon.core.datasets import iter_records, read_csv_with_schema
from stream_anon.core.schema import Schema


def schema_records(path: str | os.PathLike[str], schema: Schema, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The rows of the CSV at ``path`` as service-ready records (see the module docstring), at most ``limit``.

    Raises ``DatasetError`` naming the row and field of the first bad value.
    """
    df = read_csv_with_schema(path, schema)
    for rec in itertools.islice(iter_records(df), limit):
        yield schema.validate(rec, allow_extra=True)  # exactly the schema's fields, typed

