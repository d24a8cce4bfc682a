"""The packages of ``stream_anon`` are in layers, and the import graph of ``stream_anon`` and ``replay_tools`` has no
cycle.

Layers, bottom to top (:data:`LAYERS`); a module may import only from its own layer or below:

1. pure: ``core``, ``privacy``, ``formats`` (message formats both paths use) and the package itself (its version);
2. plumbing: ``kafka_io`` (Kafka clients, producer, reader, lifecycle, embedded broker), ``metrics``;
3. configuration: ``config`` (the one ``Config`` and its sections, the side-path options);
4. the paths and tools, side by side: ``service`` (main path), ``side`` (side paths), ``replay`` (what feeds the
   input), ``report`` (reads run directories); none of them imports another (:data:`APART`);
5. ``runtime``: what starts both paths (``stream-anon run``, the supervisor, the demo, which writes a report);
6. entry points: ``cli``, ``bench``, ``__main__``.

``replay_tools`` (outside the package) is on top: nothing in ``stream_anon`` imports it.

Every ``import`` / ``from ... import`` statement counts, at module level and inside functions alike (read with
``ast``, nothing is imported): a function-local import that only dodges a cycle or a layer is an import all the
same.  An edge goes to the module imported (``from pkg import name`` goes to ``pkg.name`` when that is a module,
else to ``pkg``); the implicit import of parent packages is not an edge.
"""

from __future__ import annotations

import ast
import functools
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
    for node, local in _statements(tree.body, False):
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


def _statements(body: list[ast.stmt], local: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement of ``body`` and of the blocks nested in it, with whether it is inside a function (an import
    is a statement: expressions, which hold none, are not walked)."""
    for node in body:
        yield node, local
        inner = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        blocks = [getattr(node, name, None) for name in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(node, "handlers", ())] + [c.body for c in getattr(node, "cases", ())]
        for block in blocks:
            if isinstance(block, list):
                yield from _statements(block, inner)


def _existing(dotted: str) -> str | None:
    """The module ``dotted`` names, or its longest prefix that is one of ours (None: not ours)."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


@functools.cache
def import_graph() -> dict[str, dict[str, tuple[int, bool]]]:
    """module -> {imported module: (first line, function-local)}, a module-level import before a function-local
    one (read once; callers do not change it)."""
    graph: dict[str, dict[str, tuple[int, bool]]] = {}
    for name, path in MODULES.items():
        edges: dict[str, tuple[int, bool]] = {}
        for target, line, local in _imports(name, path):
            if target != name and (target not in edges or (local, line) < edges[target][::-1]):
                edges[target] = (line, local)  # a module-level import first, then the first line
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


# Layers, bottom to top: (name, packages of stream_anon); "" is the package ``stream_anon`` itself (__init__).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pure", ("", "core", "privacy", "formats")),
    ("plumbing", ("kafka_io", "metrics")),
    ("configuration", ("config",)),
    ("paths and tools", ("service", "side", "replay", "report")),
    ("runtime", ("runtime",)),
    ("entry points", ("cli", "bench", "__main__")),
)
APART = frozenset({"service", "side", "replay", "report"})
"""Packages of one layer that never import each other (the main path, the side paths, the replay, the report)."""
OUTSIDE = "replay_tools"
"""On top of everything: may import any of ``stream_anon``; nothing in ``stream_anon`` imports it."""

LAYER_OF = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}


def package_of(module: str) -> str:
    """``stream_anon.service.app`` -> ``service``; ``stream_anon`` -> ``""``; ``replay_tools.x`` -> ``replay_tools``."""
    parts = module.split(".")
    if parts[0] == OUTSIDE:
        return OUTSIDE
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, dict[str, tuple[int, bool]]],
                     layer_of: dict[str, int] | None = None, apart: frozenset[str] = APART) -> list[str]:
    """One line per import against the layers: from a higher layer, between two packages kept apart, of
    ``replay_tools`` from ``stream_anon``, or from/to a package the table does not place."""
    layer_of = LAYER_OF if layer_of is None else layer_of
    names = {i: name for i, (name, _) in enumerate(LAYERS)}
    out = []
    for module in sorted(graph):
        src = package_of(module)
        if src == OUTSIDE:
            continue
        for target, (line, local) in sorted(graph[module].items()):
            dst = package_of(target)
            where = f"{module}:{line}{' (in a function)' if local else ''} imports {target}"
            if dst == src:
                continue
            if dst == OUTSIDE:
                out.append(f"{where}: nothing in stream_anon imports {OUTSIDE} (move what it needs into stream_anon)")
            elif src not in layer_of or dst not in layer_of:
                unplaced = src if src not in layer_of else dst
                out.append(f"{where}: package {unplaced or 'stream_anon'!r} is in no layer (add it to LAYERS)")
            elif layer_of[dst] > layer_of[src]:
                out.append(f"{where}: {dst!r} ({names.get(layer_of[dst], layer_of[dst])}) is above {src!r} "
                           f"({names.get(layer_of[src], layer_of[src])})")
            elif src in apart and dst in apart:
                out.append(f"{where}: {src!r} and {dst!r} never import each other (move the shared piece down)")
    return out


def test_graph_reads_the_real_tree() -> None:
    graph = import_graph()
    assert {"stream_anon.service.app", "stream_anon.side.app", "replay_tools.__main__"} <= set(graph)
    assert "stream_anon.config.settings" in graph["stream_anon.service.app"]
    assert "stream_anon.service.workers" in graph["stream_anon.service.app"]
    assert "stream_anon.runtime.supervisor" in graph["stream_anon.runtime.run"]


def test_every_package_is_in_a_layer() -> None:
    unplaced = sorted({package_of(m) for m in MODULES} - set(LAYER_OF) - {OUTSIDE})
    assert not unplaced, f"packages in no layer of LAYERS: {unplaced}"


def test_packages_import_only_their_own_layer_or_below() -> None:
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layers (tests/test_import_graph.py, LAYERS):\n" + "\n".join(bad)


def test_the_layer_rule_finds_each_kind_of_violation() -> None:
    graph: dict[str, dict[str, tuple[int, bool]]] = {
        "stream_anon.kafka_io.producer": {"stream_anon.config.settings": (3, False)},  # plumbing -> configuration
        "stream_anon.side.app": {"stream_anon.service.pipeline": (7, True)},  # side -> service
        "stream_anon.runtime.demo": {"replay_tools.kafka_replay": (9, False)},  # stream_anon -> replay_tools
        "stream_anon.service.app": {"stream_anon.kafka_io.clients": (1, False), "stream_anon.service.ledger": (2, False)},
        "replay_tools.__main__": {"stream_anon.cli.service": (4, False)},
    }
    bad = layer_violations(graph)
    assert len(bad) == 3, bad
    assert bad[0].startswith("stream_anon.kafka_io.producer:3 imports stream_anon.config.settings: 'config'")
    assert "replay_tools.kafka_replay: nothing in stream_anon imports replay_tools" in bad[1]
    assert bad[2].startswith("stream_anon.side.app:7 (in a function) imports stream_anon.service.pipeline: 'side' "
                             "and 'service' never import each other")


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


@pytest.mark.parametrize("module", ["stream_anon.service.app", "stream_anon.side.app"])
def test_only_the_runtime_and_the_benchmarks_import_the_apps(module: str) -> None:
    importers = sorted(m for m, edges in import_graph().items() if module in edges)
    allowed = [m for m in importers if package_of(m) in ("runtime", "bench")]
    assert importers == allowed, f"{module} is imported by {sorted(set(importers) - set(allowed))}"


def test_pure_layers_import_neither_kafka_nor_prometheus() -> None:
    """The pure layer (core/, privacy/, formats/), the configuration, the side paths' pure modules and the main
    path's protocol classes (outbox, committer, recovery, partition table, failure policy: the crash test drives them
    against a simulated broker) import no Kafka client and no Prometheus."""
    pure = [m for m in MODULES if package_of(m) in ("core", "privacy", "formats", "config")]
    pure += ["stream_anon.side.channels", "stream_anon.side.processor", "stream_anon.side.encoding",
             "stream_anon.side.decoding", "stream_anon.side.budgets", "stream_anon.service.pipeline",
             "stream_anon.service.ledger", "stream_anon.service.recovery", "stream_anon.service.outbox",
             "stream_anon.service.committer", "stream_anon.service.partitions", "stream_anon.service.failure_policy",
             "stream_anon.kafka_io.settings", "stream_anon.kafka_io.errors"]
    bad = []
    for m in pure:
        tree = ast.parse(MODULES[m].read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{m}: {n}" for n in names if n.split(".")[0] in ("kafka", "confluent_kafka", "prometheus_client")]
    assert not bad, bad


def test_the_configuration_loads_no_kafka_client() -> None:
    """``stream_anon.config`` imports the Kafka layer's settings module only (no client library): checked on the
    graph, transitively."""
    graph = import_graph()
    seen, todo = set(), [m for m in MODULES if package_of(m) == "config"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(graph.get(m, {}))
    assert {m for m in seen if package_of(m) == "kafka_io"} <= {"stream_anon.kafka_io", "stream_anon.kafka_io.settings"}


MAX_MODULE_LINES = 700
"""Issue 16: no module of the package over this many lines (split it along what it does)."""


def test_no_module_is_over_the_size_limit() -> None:
    package = Path(__file__).resolve().parent.parent / "stream_anon"
    sizes = {str(p.relative_to(package.parent)): len(p.read_text(encoding="utf-8").splitlines())
             for p in package.rglob("*.py")}
    assert len(sizes) > 50  # it read the real tree
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}
