"""The side paths' decoder (``stream_anon/side/decoding.py``): never raises, whatever the bytes, and clips only
finite numbers outside the public domain."""

from __future__ import annotations

import json
from collections import Counter

from fuzz_support import malformed_messages  # type: ignore[import-not-found]

from stream_anon.core.schema import adult_schema
from stream_anon.formats.decoding import DeadLetter, RecordDecoder
from stream_anon.side.decoding import SideDecoder

GOOD = {"id": "r1", "age": 39, "workclass": "State-gov", "fnlwgt": 77516, "education": "Bachelors",
        "education-num": 13, "marital-status": "Never-married", "occupation": "Adm-clerical",
        "relationship": "Not-in-family", "race": "White", "sex": "Male", "capital-gain": 2174, "capital-loss": 0,
        "hours-per-week": 40, "native-country": "United-States", "income": "<=50K"}


def test_every_fuzz_kind_gives_an_outcome_never_an_exception() -> None:
    schema = adult_schema()
    side, main = SideDecoder(schema, 65536), RecordDecoder(schema, 65536)
    outcomes: Counter[str] = Counter()
    for m in malformed_messages(5, 3000):
        rec, clipped = side.decode(m.value)  # must not raise (issue 11: a 5,000-digit integer killed the side paths)
        base = main.decode(m.value)
        if isinstance(rec, DeadLetter):
            assert isinstance(base, DeadLetter) and rec == base and clipped == ()
        elif clipped:
            assert isinstance(base, DeadLetter) and base.reason == "out_of_domain"
        outcomes["clipped" if clipped else "valid" if isinstance(rec, dict) else rec.reason] += 1
    assert outcomes["clipped"] > 0 and outcomes["out_of_domain"] > 0 and outcomes["valid"] > 0, outcomes


def test_huge_integers_are_not_clipped_and_an_outlier_is() -> None:
    side = SideDecoder(adult_schema(), 65536)
    body = json.dumps({**GOOD, "age": "@"}).replace('"@"', "9" * 5000).encode()
    rec, clipped = side.decode(body)
    assert isinstance(rec, DeadLetter) and rec.reason == "out_of_domain" and clipped == ()
    rec, clipped = side.decode(b"\xef\xbb\xbf" + json.dumps({**GOOD, "age": 150}).encode())  # BOM accepted
    assert isinstance(rec, dict) and rec["age"] == 90 and clipped == ("age",)
    rec, clipped = side.decode(json.dumps({**GOOD, "age": 150, "race": "Martian"}).encode())
    assert isinstance(rec, DeadLetter) and clipped == ()  # another problem remains: the dead letter stands
