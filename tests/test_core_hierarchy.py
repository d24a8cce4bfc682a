"""Hierarchies: malformed files give errors naming the row; LCA and loss tables match brute force."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from stream_anon.core.hierarchy import Hierarchy, HierarchyError
from stream_anon.core.loss import cail_table, gt_loss_table
from stream_anon.core.schema import ADULT_SCHEMA_PATH, adult_schema

ADULT_HIERARCHIES = sorted((ADULT_SCHEMA_PATH.parent / "hierarchies").glob("*.csv"))


def test_ragged_rows_error_names_the_row() -> None:
    text = "a;A;*\nb;A;*\nc;*\n"
    with pytest.raises(HierarchyError, match=r"row 3 'c;\*': has 2 levels, expected 3"):
        Hierarchy.from_csv_text(text, "h")


def test_different_roots() -> None:
    with pytest.raises(HierarchyError, match=r"row 2 'b;B;ALL': root 'ALL' differs from '\*'"):
        Hierarchy.from_csv_text("a;A;*\nb;B;ALL\n", "h")


def test_duplicate_leaf() -> None:
    with pytest.raises(HierarchyError, match=r"row 3 'a;B;\*': leaf 'a' repeats row 1"):
        Hierarchy.from_csv_text("a;A;*\nb;B;*\na;B;*\n", "h")


def test_label_under_two_parents() -> None:
    with pytest.raises(HierarchyError, match=r"row 2 'b;X;Q;\*': label 'X' appears under two different parents"):
        Hierarchy.from_csv_text("a;X;P;*\nb;X;Q;*\n", "h")


def test_label_naming_two_different_nodes_is_rejected() -> None:
    # "B" is an inner node covering {a} and a leaf elsewhere: a released "B" would be ambiguous
    with pytest.raises(HierarchyError, match="label 'B' names two different nodes"):
        Hierarchy.from_csv_text("a;B;*\nB;C;*\n", "h")


def test_single_child_chain_is_allowed() -> None:
    h = Hierarchy.from_csv_text("x;x;*\ny;Y;*\nz;Y;*\n", "h")  # ARX style: a value repeated as its own parent
    assert h.leaves == ("x", "y", "z")
    node = h.node("x")
    assert (h.node_leaf_lo[node], h.node_leaf_hi[node]) == (0, 0)
    assert h.lca[0, 0] == 0  # the LCA of one leaf is the leaf itself


def test_empty_label_and_empty_file() -> None:
    with pytest.raises(HierarchyError, match="row 1 'a;;\\*': empty label"):
        Hierarchy.from_csv_text("a;;*\n", "h")
    with pytest.raises(HierarchyError, match="'h': no rows"):
        Hierarchy.from_csv_text("\n\n", "h")
    with pytest.raises(HierarchyError, match="no node labelled 'nope'"):
        Hierarchy.flat("h", ["a", "b"]).node("nope")


def test_flat_and_degenerate() -> None:
    h = Hierarchy.flat("f", ["a", "b", "c"])
    assert h.n_leaves == 3 and h.height == 1 and h.node_labels[h.root] == "*"
    assert gt_loss_table(h)[0, 2] == 1 and gt_loss_table(h)[1, 1] == 0
    single = Hierarchy.from_rows("one", [["only"]])
    assert single.n_leaves == 1 and gt_loss_table(single).tolist() == [[0.0]]


def _descendant_leaves(h: Hierarchy, node: int) -> set[int]:
    return {leaf for leaf in range(h.n_leaves) if node in h.ancestors(leaf)}


@pytest.mark.parametrize("path", ADULT_HIERARCHIES, ids=lambda p: p.stem)
def test_adult_hierarchy_lca_and_tables_match_brute_force(path: Path) -> None:
    h = Hierarchy.from_csv(path)
    m = h.n_leaves
    depths = {len(h.ancestors(leaf)) for leaf in range(m)}
    assert len(depths) == 1, "all leaves at the same depth"
    for node in range(len(h.node_labels)):  # contiguous ranges == descendant leaves
        lo, hi = int(h.node_leaf_lo[node]), int(h.node_leaf_hi[node])
        assert _descendant_leaves(h, node) == set(range(lo, hi + 1))
    gt, cail = gt_loss_table(h), cail_table(h)
    for a, b in itertools.product(range(m), repeat=2):
        common = [n for n in h.ancestors(a) if n in set(h.ancestors(b))]
        brute = max(common, key=lambda n: int(h.node_depth[n]))  # deepest common ancestor
        assert h.lca[a, b] == brute
        leaves = h.leaf_count(brute)
        assert gt[a, b] == pytest.approx(float(Fraction(leaves - 1, m - 1)), abs=1e-15)
        assert cail[a, b] == pytest.approx(0.0 if a == b else leaves / m, abs=1e-15)
    # the LCA of a set is the LCA of its min and max leaf (the property the engine relies on)
    rng = np.random.default_rng(3)
    for _ in range(200):
        members = rng.choice(m, size=min(m, int(rng.integers(1, 5))), replace=False).tolist()
        shared = set.intersection(*(set(h.ancestors(x)) for x in members))
        deepest = max(shared, key=lambda n: int(h.node_depth[n]))
        assert h.lca_of(members) == deepest
        assert h.label_of_range(min(members), max(members)) == h.node_labels[h.lca_of(members)]
        assert all(h.covers(h.lca_of(members), x) for x in members)
    assert Hierarchy.from_csv_text(h.to_csv_text(), h.name).to_csv_text() == h.to_csv_text()
    assert h.to_csv_text() == path.read_text(encoding="utf-8")  # shipped files are already in DFS order


def test_adult_hierarchies_cover_the_schema_and_missing_value() -> None:
    s = adult_schema()
    names = {a.name for a in s.categorical_qis}
    assert names == {p.stem for p in ADULT_HIERARCHIES}
    for a in s.categorical_qis:
        assert a.hierarchy is not None
        labels = a.hierarchy.node_labels
        assert len(set(labels)) == len(labels), f"{a.name}: labels must be unique"
    for name in ("workclass", "occupation", "native-country"):
        h = s[name].hierarchy
        assert h is not None and "?" in h.leaf_index
        q = h.leaf_index["?"]
        parent = int(h.node_parent[q])
        assert h.node_labels[parent].startswith("Unknown") and h.leaf_count(parent) == 1


def test_csv_loader_options(tmp_path: Path) -> None:
    p = tmp_path / "colour.csv"
    p.write_text("red,warm,*\norange,warm,*\nblue,cold,*\n\n", encoding="utf-8")
    h = Hierarchy.from_csv(p, delimiter=",")
    assert h.name == "colour" and h.leaves == ("red", "orange", "blue")
    assert h.label_of_range(0, 1) == "warm" and h.label_of_range(1, 2) == "*"
