"""Generalization hierarchies for categorical quasi-identifiers.

A hierarchy is a tree whose leaves are the attribute's values.  It loads from ARX-style CSV
files: one row per leaf, ``leaf;parent;grandparent;...;*``, every row of the same length (all
leaves at the same depth), every row ending in the same root.

Leaves are numbered in depth-first order (children in order of first appearance in the file),
so every node covers a *contiguous* range of leaf indices.  The lowest common ancestor of any
set of leaves is therefore the LCA of its smallest and largest leaf index, and a cluster's
generalization on a categorical attribute is fully described by the pair ``(min_leaf,
max_leaf)``.  All loss look-ups are precomputed ``M x M`` tables indexed by that pair, which
lets the engine score every open cluster with one vectorized gather.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class HierarchyError(ValueError):
    """A hierarchy file or tree is malformed; the message names the offending row."""


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """A generalization tree over a categorical domain.

    Attributes:
        name: attribute name (for error messages).
        leaves: leaf labels in depth-first order; ``leaf_index[label]`` is the position.
        node_labels: label of every node; nodes ``0..M-1`` are the leaves in order.
        node_parent: parent node id (root's parent is -1).
        node_depth: 0 for the root.
        node_leaf_lo / node_leaf_hi: the contiguous leaf-index range a node covers.
        lca: ``(M, M)`` int table, node id of the lowest common ancestor of leaves i and j.
    """

    name: str
    leaves: tuple[str, ...]
    node_labels: tuple[str, ...]
    node_parent: np.ndarray
    node_depth: np.ndarray
    node_leaf_lo: np.ndarray
    node_leaf_hi: np.ndarray
    lca: np.ndarray
    leaf_index: dict[str, int] = field(repr=False)
    _label_to_node: dict[str, int] = field(repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_rows(cls, name: str, rows: Sequence[Sequence[str]]) -> Hierarchy:
        """Build from rows ``[leaf, parent, ..., root]`` (ARX layout)."""
        if not rows:
            raise HierarchyError(f"hierarchy {name!r}: no rows")
        depth = len(rows[0])
        root = rows[0][-1].strip()
        cleaned: list[list[str]] = []
        for i, raw in enumerate(rows, start=1):
            row = [c.strip() for c in raw]
            if len(row) != depth:
                raise HierarchyError(
                    f"hierarchy {name!r}, row {i} {';'.join(row)!r}: has {len(row)} levels, "
                    f"expected {depth} (all leaves must be at the same depth)"
                )
            if any(c == "" for c in row):
                raise HierarchyError(f"hierarchy {name!r}, row {i} {';'.join(row)!r}: empty label")
            if row[-1] != root:
                raise HierarchyError(
                    f"hierarchy {name!r}, row {i} {';'.join(row)!r}: root {row[-1]!r} differs from {root!r}"
                )
            cleaned.append(row)
        # A node is identified by its path from the root; a label must name one node only.
        path_to_children: dict[tuple[str, ...], list[tuple[str, ...]]] = {(root,): []}
        label_owner: dict[tuple[int, str], tuple[str, ...]] = {(0, root): (root,)}
        leaf_rows: dict[str, int] = {}
        for i, row in enumerate(cleaned, start=1):
            if row[0] in leaf_rows:
                raise HierarchyError(
                    f"hierarchy {name!r}, row {i} {';'.join(row)!r}: leaf {row[0]!r} repeats row {leaf_rows[row[0]]}"
                )
            leaf_rows[row[0]] = i
            top_down = list(reversed(row))
            for level in range(1, depth):
                path = tuple(top_down[: level + 1])
                label = path[-1]
                owner = label_owner.get((level, label))
                if owner is not None and owner != path:
                    raise HierarchyError(
                        f"hierarchy {name!r}, row {i} {';'.join(row)!r}: label {label!r} appears under two "
                        f"different parents ({' > '.join(owner)} and {' > '.join(path)})"
                    )
                if owner is None:
                    label_owner[(level, label)] = path
                    path_to_children[path[:-1]].append(path)
                    path_to_children.setdefault(path, [])
        # Depth-first numbering: leaves get ids 0..M-1 in DFS order, inner nodes follow.
        leaves: list[tuple[str, ...]] = []
        inner: list[tuple[str, ...]] = []
        ranges: dict[tuple[str, ...], tuple[int, int]] = {}

        def visit(path: tuple[str, ...]) -> tuple[int, int]:
            children = path_to_children[path]
            if not children:
                idx = len(leaves)
                leaves.append(path)
                ranges[path] = (idx, idx)
                return ranges[path]
            inner.append(path)
            lo = hi = -1
            for child in children:
                clo, chi = visit(child)
                lo = clo if lo < 0 else lo
                hi = chi
            ranges[path] = (lo, hi)
            return ranges[path]

        visit((root,))
        if depth == 1:  # degenerate: the root is the only leaf
            inner = []
        ordered = leaves + [p for p in inner if p not in set(leaves)]
        node_id = {p: i for i, p in enumerate(ordered)}
        n_nodes = len(ordered)
        parent = np.full(n_nodes, -1, dtype=np.int32)
        depth_arr = np.zeros(n_nodes, dtype=np.int32)
        lo_arr = np.zeros(n_nodes, dtype=np.int32)
        hi_arr = np.zeros(n_nodes, dtype=np.int32)
        for p, i in node_id.items():
            depth_arr[i] = len(p) - 1
            lo_arr[i], hi_arr[i] = ranges[p]
            if len(p) > 1:
                parent[i] = node_id[p[:-1]]
        m = len(leaves)
        # A label must name one node, or several nodes covering the same leaves (a single-child chain such
        # as "?;Unknown-workclass;Unknown;*"); otherwise a released label would be ambiguous.
        first_node: dict[str, int] = {}
        for i, p in enumerate(ordered):
            j = first_node.setdefault(p[-1], i)
            if j != i and (lo_arr[j], hi_arr[j]) != (lo_arr[i], hi_arr[i]):
                raise HierarchyError(
                    f"hierarchy {name!r}: label {p[-1]!r} names two different nodes "
                    f"({' > '.join(ordered[j])} and {' > '.join(p)}); labels must be unique"
                )
        # Deepest node covering [i, j]: paint every node's block [lo..hi]^2, shallowest first, so deeper
        # nodes overwrite their ancestors (the nodes covering a leaf pair form a chain of ancestors; in a
        # single-child chain the deepest node, the leaf itself, wins).
        lca = np.zeros((m, m), dtype=np.int32)
        for n in sorted(range(n_nodes), key=lambda n: (depth_arr[n], n)):
            lca[lo_arr[n]: hi_arr[n] + 1, lo_arr[n]: hi_arr[n] + 1] = n
        labels = tuple(p[-1] for p in ordered)
        return cls(
            name=name,
            leaves=tuple(p[-1] for p in leaves),
            node_labels=labels,
            node_parent=parent,
            node_depth=depth_arr,
            node_leaf_lo=lo_arr,
            node_leaf_hi=hi_arr,
            lca=lca,
            leaf_index={p[-1]: i for i, p in enumerate(leaves)},
            _label_to_node={lab: i for i, lab in reversed(list(enumerate(labels)))},
        )

    @classmethod
    def from_csv(cls, path: str | Path, name: str | None = None, delimiter: str = ";") -> Hierarchy:
        """Load an ARX-style hierarchy CSV (``leaf;parent;...;*``)."""
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        return cls.from_csv_text(text, name or p.stem, delimiter=delimiter)

    @classmethod
    def from_csv_text(cls, text: str, name: str, delimiter: str = ";") -> Hierarchy:
        rows = [r for r in csv.reader(io.StringIO(text), delimiter=delimiter) if r and any(c.strip() for c in r)]
        return cls.from_rows(name, rows)

    @classmethod
    def flat(cls, name: str, values: Iterable[str], root: str = "*") -> Hierarchy:
        """A two-level hierarchy: every value directly under the root (suppression-only)."""
        return cls.from_rows(name, [[v, root] for v in values])

    # ------------------------------------------------------------------ queries
    @property
    def n_leaves(self) -> int:
        return len(self.leaves)

    @property
    def root(self) -> int:
        return int(np.flatnonzero(self.node_parent < 0)[0])

    @property
    def height(self) -> int:
        return int(self.node_depth.max())

    def node(self, label: str) -> int:
        """Node id of a label (leaf or inner)."""
        try:
            return self._label_to_node[label]
        except KeyError:
            raise HierarchyError(f"hierarchy {self.name!r}: no node labelled {label!r}") from None

    def leaf_count(self, node: int) -> int:
        return int(self.node_leaf_hi[node] - self.node_leaf_lo[node] + 1)

    def node_leaf_counts(self) -> np.ndarray:
        counts: np.ndarray = (self.node_leaf_hi - self.node_leaf_lo + 1).astype(np.int64)
        return counts

    def covers(self, node: int, leaf: int) -> bool:
        return bool(self.node_leaf_lo[node] <= leaf <= self.node_leaf_hi[node])

    def lca_of(self, leaf_indices: Iterable[int]) -> int:
        idx = list(leaf_indices)
        return int(self.lca[min(idx), max(idx)])

    def label_of_range(self, lo: int, hi: int) -> str:
        return self.node_labels[int(self.lca[lo, hi])]

    def ancestors(self, node: int) -> list[int]:
        """The node and its ancestors up to the root."""
        out = [node]
        while self.node_parent[out[-1]] >= 0:
            out.append(int(self.node_parent[out[-1]]))
        return out

    def to_csv_text(self, delimiter: str = ";") -> str:
        """Serialize back to ARX layout (round-trips with :meth:`from_csv_text`)."""
        lines = []
        for leaf in range(self.n_leaves):
            lines.append(delimiter.join(self.node_labels[n] for n in self.ancestors(leaf)))
        return "\n".join(lines) + "\n"
