"""The import graph of ``stream_anon`` and ``replay_tools`` has no cycle.

Every ``import`` / ``from ... import`` statement counts, at module level and inside functions alike (read with
``ast``, nothing is imported): a function-local import that only dodges a cycle is a cycle all the same.  An
edge goes to the module imported (``from pkg import name`` goes to ``pkg.name`` when that is a module, else to
``pkg``); the implicit import of parent packages is not an edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stream_anon", "replay_tools")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported internal module, line, inside a function) for every import statement of ``name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    functions: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            functions.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        local = id(node) in functions
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _existing(alias.name)
                if target is not None:
                    yield target, node.lineno, local
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in MODULES else _existing(base)
                if target is not None:
                    yield target, node.lineno, local


def _existing(dotted: str) -> str | None:
    """The module ``dotted`` names, or its longest prefix that is one of ours (None: not ours)."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, dict[str, tuple[int, bool]]]:
    """module -> {imported module: (first line, function-local)}."""
    graph: dict[str, dict[str, tuple[int, bool]]] = {}
    for name, path in MODULES.items():
        edges: dict[str, tuple[int, bool]] = {}
        for target, line, local in _imports(name, path):
            if target != name and target not in edges:
                edges[target] = (line, local)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, tuple[int, bool]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_in(component: list[str], graph: dict[str, dict[str, tuple[int, bool]]]) -> list[str]:
    """One concrete cycle through the component's first module (a -> b -> ... -> a)."""
    members = set(component)
    start = component[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in prev and w != start:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_graph_reads_the_real_tree() -> None:
    graph = import_graph()
    assert {"stream_anon.service.app", "stream_anon.side.app", "replay_tools.udp_bench"} <= set(graph)
    assert "stream_anon.service.config" in graph["stream_anon.service.app"]
    assert "stream_anon.service.workers" in graph["stream_anon.service.app"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = []
    for comp in strongly_connected(graph):
        path = _cycle_in(comp, graph)
        hops = []
        for a, b in zip(path, path[1:], strict=False):
            line, local = graph[a][b]
            hops.append(f"{a}:{line}{' (in a function)' if local else ''} -> {b}")
        cycles.append(f"cycle among {comp}:\n    " + "\n    ".join(hops))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph: dict[str, dict[str, tuple[int, bool]]] = {"a": {"b": (1, False)}, "b": {"c": (2, True)},
                                                     "c": {"a": (3, False)}, "d": {"a": (4, False)}}
    comps = strongly_connected(graph)
    assert comps == [["a", "b", "c"]]
    assert _cycle_in(comps[0], graph) == ["a", "b", "c", "a"]


# Entry points: the command line, the demo and the benchmarks compose the service; nothing below them imports it.
ENTRY_POINTS = ("stream_anon.cli.", "stream_anon.bench.", "stream_anon.service.demo", "stream_anon.__main__")


@pytest.mark.parametrize("module", ["stream_anon.service.app", "stream_anon.side.app"])
def test_only_entry_points_import_the_apps(module: str) -> None:
    importers = sorted(m for m, edges in import_graph().items() if module in edges)
    allowed = [m for m in importers if m.startswith(ENTRY_POINTS) or m == "stream_anon.service.supervisor"]
    assert importers == allowed, f"{module} is imported by {sorted(set(importers) - set(allowed))}"


def test_pure_layers_import_neither_kafka_nor_prometheus() -> None:
    """core/ and privacy/ (and the side paths' pure modules) import no Kafka client and no Prometheus."""
    pure = [m for m in MODULES if m.startswith(("stream_anon.core", "stream_anon.privacy"))]
    pure += ["stream_anon.side.config", "stream_anon.side.channels", "stream_anon.side.processor",
             "stream_anon.side.encoding", "stream_anon.service.pipeline"]
    bad = []
    for m in pure:
        tree = ast.parse(MODULES[m].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{m}: {n}" for n in names if n.split(".")[0] in ("kafka", "confluent_kafka", "prometheus_client")]
            bad += [f"{m}: {n}" for n in names if n.startswith("stream_anon.service")
                    and m.startswith(("stream_anon.core", "stream_anon.privacy", "stream_anon.side"))]
    assert not bad, bad
