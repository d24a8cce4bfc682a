"""The diversity options of the service's configuration: defaults (distinct l=2 with t=0.2), parsing from file,
environment and flags (l may be a number with entropy), one-line errors naming the option, and the wiring into
the engine, the gate and the class message."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_anon.config.settings import Config, ConfigError
from stream_anon.core.diversity import DiversityRequirement
from stream_anon.formats.release import decode_class_message
from stream_anon.service.wiring import (
    load_schema,
    make_engine_factory,
    make_entry_factory,
    with_release_secret,
)


def test_default_is_distinct_2_with_t_0_2() -> None:
    cfg = Config.load(env={})
    a = cfg.anonymization
    assert (a.l, a.diversity, a.c, a.t_closeness, a.t_distance, a.t_reference_every) == (2, "distinct", None, 0.2,
                                                                                         "auto", None)
    req = a.requirement(load_schema(cfg))
    assert req == DiversityRequirement(l=2, t=0.2, distance="equal")
    engine = make_engine_factory(cfg, load_schema(cfg))(0)
    assert engine.diversity == req  # type: ignore[attr-defined]


def test_options_from_file_environment_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("anonymization: {diversity: entropy, l: 1.5, t_closeness: null}\n")
    a = Config.load(f, env={}).anonymization
    assert a.diversity == "entropy" and a.l == 1.5 and a.t_closeness is None
    env = {"STREAM_ANON_ANONYMIZATION_DIVERSITY": "recursive", "STREAM_ANON_ANONYMIZATION_C": "3",
           "STREAM_ANON_ANONYMIZATION_L": "2", "STREAM_ANON_ANONYMIZATION_T_CLOSENESS": "0.3"}
    a = Config.load(env=env).anonymization
    assert (a.diversity, a.c, a.l, a.t_closeness) == ("recursive", 3, 2, 0.3) and isinstance(a.l, int)
    a = Config.load(env=env, overrides={"anonymization.t_closeness": "null", "anonymization.c": "4.5"}).anonymization
    assert a.t_closeness is None and a.c == 4.5


@pytest.mark.parametrize("overrides, message", [
    ({"anonymization.diversity": "recursive"}, "option anonymization.c: expected a number > 0 with recursive"),
    ({"anonymization.c": "2"}, "option anonymization.c: expected unset unless diversity is recursive, got 2"),
    ({"anonymization.l": "1.5"}, "option anonymization.l: expected an integer >= 1, got 1.5"),
    ({"anonymization.diversity": "entropy", "anonymization.l": "3"},
     "option anonymization.l: expected at most the 2 distinct value(s) of the sensitive attribute 'income'"),
    ({"anonymization.t_closeness": "1.5"}, "option anonymization.t_closeness: expected a number in [0, 1], got 1.5"),
    ({"anonymization.t_distance": "ordered"}, "option anonymization.t_distance: expected equal or auto for a "
                                              "categorical sensitive attribute"),
    ({"anonymization.t_reference_every": "0"}, "option anonymization.t_reference_every: expected an integer >= 1"),
    ({"anonymization.diversity": "max"}, "option anonymization.diversity: expected one of"),
    ({"anonymization.l": "two"}, "option 'anonymization.l': expected float, got 'two'"),
])
def test_bad_diversity_options_are_one_line_naming_the_option(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        Config.load(env={}, overrides=overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_schema_without_sensitive_attribute_names_both_options(tmp_path: Path) -> None:
    schema = tmp_path / "plain.yaml"
    schema.write_text("name: plain\nrecord_id: id\nattributes:\n"
                      "  - {name: age, role: quasi_identifier, type: numeric, domain: [0, 120], integer: true}\n")
    base = {"anonymization.schema": str(schema), "side_paths.enabled": False}
    with pytest.raises(ConfigError, match=r"set anonymization\.l: null and anonymization\.t_closeness: null"):
        Config.load(env={}, overrides=base)
    with pytest.raises(ConfigError, match=r"^option anonymization\.t_closeness: t-closeness \(default 0\.2 in the "
                                          r"service\) needs a sensitive attribute"):
        Config.load(env={}, overrides={**base, "anonymization.l": "null"})
    cfg = Config.load(env={}, overrides={**base, "anonymization.l": "null", "anonymization.t_closeness": "null"})
    assert cfg.anonymization.requirement(load_schema(cfg)) is None


def test_wiring_gives_gate_and_class_message_the_model() -> None:
    cfg, _ = with_release_secret(Config.load(env={}, overrides={
        "anonymization.diversity": "entropy", "anonymization.l": "1.5", "anonymization.t_closeness": "0.25",
        "anonymization.t_reference_every": "10"}))
    schema = load_schema(cfg)
    entries = make_entry_factory(cfg, schema)(0, "x")
    gate = entries.gate
    assert gate is not None and gate.requirement == DiversityRequirement(model="entropy", l=1.5, t=0.25)
    assert gate.reference is not None and gate.reference.every == 10
    members = [{"id": i, **{a.name: (a.lo if a.kind.value == "numeric" else a.domain_values[0]) for a in schema.qis},
                "income": "<=50K" if i < 6 else ">50K"} for i in range(10)]
    for m in members:
        entries.observe(m)
    gen = {a.name: (f"[{a.lo:.0f}-{a.hi:.0f}]" if a.kind.value == "numeric" else "*") for a in schema.qis}
    [entry], verdict = entries.released_class(offsets=list(range(10)), record_ids=list(range(10)), members=members,
                                            generalized=gen, size=10, loss=1.0, horizon=9)
    assert verdict is not None and verdict.ok and entry.kind == "class"
    c = decode_class_message(entry.outputs[0].value)
    assert c.l == 2 and c.diversity == {"model": "entropy", "l": 1.5}
    assert c.t_closeness == {"t": 0.25, "distance": "equal", "reference": [["<=50K", 6], [">50K", 4]]}
