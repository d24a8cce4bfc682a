"""Distinct individuals and distinct sensitive values of a set of buffered records.

CASTLE counts k over distinct individuals, not records (a person id may own several records), and the
l-diversity extension counts l over distinct sensitive values (docs/castle.md, "Model" and "Extensions").
The engine needs these counts for every open cluster, for all of Gamma and for the leftover cluster, while
records join, leave and clusters merge: a :class:`Tally` keeps, per tracked key, how many records carry it,
so that each of those operations keeps the distinct counts exact in O(1) per record.
"""

from __future__ import annotations

from typing import Any


class Tally:
    """Records of a set, with the number of records per person id and per sensitive value.

    ``persons``: count person ids (the schema has a person id); without them every record is its own
    individual. ``values``: count sensitive values (l-diversity is on). Untracked keys passed to
    :meth:`add` / :meth:`remove` are ignored.
    """

    __slots__ = ("by_person", "by_value", "records")

    def __init__(self, *, persons: bool, values: bool):
        self.records = 0
        self.by_person: dict[Any, int] | None = {} if persons else None
        self.by_value: dict[Any, int] | None = {} if values else None

    @property
    def individuals(self) -> int:
        """Distinct individuals: distinct person ids, or the number of records without a person id."""
        return self.records if self.by_person is None else len(self.by_person)

    @property
    def values(self) -> int:
        """Distinct sensitive values (0 when values are not tracked)."""
        return 0 if self.by_value is None else len(self.by_value)

    def meets(self, k: int, l: int | None) -> bool:  # noqa: E741 - the paper's name
        """>= k distinct individuals and, when ``l`` is given, >= l distinct sensitive values."""
        return self.individuals >= k and (l is None or self.values >= l)

    def add(self, person: Any, value: Any) -> None:
        """One record of individual ``person`` with sensitive value ``value`` joins the set."""
        self.records += 1
        persons, values = self.by_person, self.by_value
        if persons is not None:
            persons[person] = persons.get(person, 0) + 1
        if values is not None:
            values[value] = values.get(value, 0) + 1

    def remove(self, person: Any, value: Any) -> None:
        """One record of the set leaves it."""
        self.records -= 1
        persons, values = self.by_person, self.by_value
        if persons is not None:
            left = persons[person] - 1
            if left:
                persons[person] = left
            else:
                del persons[person]
        if values is not None:
            left = values[value] - 1
            if left:
                values[value] = left
            else:
                del values[value]

    def add_all(self, other: Tally) -> None:
        """Every record of ``other`` joins the set (merge of two clusters)."""
        self.records += other.records
        for mine, theirs in ((self.by_person, other.by_person), (self.by_value, other.by_value)):
            if mine is not None and theirs is not None:
                for key, n in theirs.items():
                    mine[key] = mine.get(key, 0) + n

    def remove_all(self, other: Tally) -> None:
        """Every record of ``other`` (a subset of this set) leaves it (a cluster of Gamma is released)."""
        self.records -= other.records
        for mine, theirs in ((self.by_person, other.by_person), (self.by_value, other.by_value)):
            if mine is not None and theirs is not None:
                for key, n in theirs.items():
                    left = mine[key] - n
                    if left:
                        mine[key] = left
                    else:
                        del mine[key]

    def clear(self) -> None:
        self.records = 0
        if self.by_person is not None:
            self.by_person.clear()
        if self.by_value is not None:
            self.by_value.clear()
