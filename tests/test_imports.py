"""The import graph of taskq/ and cli/ has no circles, ``TYPE_CHECKING`` imports included.

Every module is parsed with ``ast`` (nothing is imported): an ``import`` or ``from ...
import`` anywhere in it, at module level, inside a function (a lazy import) or under
``if TYPE_CHECKING:``, is an edge. A package's ``__init__`` re-exporting its own modules
is not a circle of theirs: the edge from a module to a package containing it is left
out. The modules below the admin client call through the engine's ``Connection``, not
by importing client.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("taskq", "cli")


def _imports(path: Path, package: str) -> set[str]:
    """Every module name ``path`` imports, and for ``from M import x`` also ``M.x``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of taskq/ and cli/ it imports."""
    modules: dict[str, Path] = {}
    for top in TOPS:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            modules[".".join(rel.parts).removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {
            m
            for m in _imports(path, package)
            if m in modules and m != name and not name.startswith(m + ".")
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    """The parser finds relative, absolute, lazy and ``TYPE_CHECKING`` imports."""
    graph = import_graph()
    assert "taskq.admin.jobs" in graph["taskq.admin.client"]  # from taskq.admin.jobs import ...
    assert "taskq.admin.client" in graph["taskq"]  # the package re-exports it
    assert "taskq" not in graph["taskq.admin.client"]  # a module's own package: no edge
    assert "taskq.admin.client" in graph["taskq.ops.exporter"]  # under TYPE_CHECKING
    assert "cli.demo_torch" in graph["cli.demo"]  # inside a function


def test_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_is_on_an_import_cycle() -> None:
    """No import, ``TYPE_CHECKING`` and lazy ones included, leads from a module of taskq/
    or cli/ back to itself."""
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(
    "module",
    [
        "taskq.admin.stats",
        "taskq.admin.stats_tasks",
        "taskq.admin.barrier",
        "taskq.admin.checkpoints",
        "taskq.admin.shardset",
        "taskq.admin.jobs",
        "taskq.trainer",
        "taskq.trainer.core",
        "taskq.trainer.protocol",
        "taskq.trainer.heartbeat",
        "taskq.trainer.worker",
        "taskq.trainer.sharded",
    ],
)
def test_the_modules_below_the_client_do_not_import_it(module: str) -> None:
    """They reach none of the client's modules: they call through the engine's
    ``Connection`` (engine/connection.py): the trainer takes one (a ``Client`` given is
    taken for its connection). (ops/, torchdata/ and the CLI use a ``Client``: they are
    above it.)"""
    graph = import_graph()
    seen: set[str] = set()
    todo = list(graph[module])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    reached = sorted(
        m for m in seen if m == "taskq.admin.client" or m.startswith("taskq.admin.client_")
    )
    assert not reached, f"{module} reaches {reached}"


#: layer -> the layers its modules may import (itself included). Data flow: training loop
#: -> torchdata -> trainer -> admin -> engine -> Redis; ops and the CLI sit on admin.
ALLOWED = {
    "ground": {"ground"},
    "data": {"ground", "data"},
    "engine": {"ground", "engine"},
    "admin": {"ground", "data", "engine", "admin"},  # data: the audit's task sizes
    "trainer": {"ground", "data", "engine", "admin", "trainer"},
    "torchdata": {"ground", "data", "engine", "admin", "trainer", "torchdata"},
    "ops": {"ground", "data", "engine", "admin", "ops"},
    "public": {"ground", "data", "engine", "admin", "trainer", "torchdata", "ops", "public"},
    "cli": {"ground", "data", "engine", "admin", "trainer", "torchdata", "ops", "public", "cli"},
}
LAYER_OF_PACKAGE = {
    "taskq.testing": "public",  # beside the flow, for tests: it may reach any layer
    "taskq.engine": "engine",
    "taskq.admin": "admin",
    "taskq.trainer": "trainer",
    "taskq.torchdata": "torchdata",
    "taskq.torch": "torchdata",
    "taskq.ops": "ops",
    "taskq.data": "data",
    "taskq.datasets": "data",
    "cli": "cli",
}


def layer_of(module: str) -> str:
    """The layer a module belongs to (the shared ground: errors, keys, models, config...)."""
    if module == "taskq":
        return "public"
    for package, layer in LAYER_OF_PACKAGE.items():
        if module == package or module.startswith(package + "."):
            return layer
    return "ground"


def test_every_layer_has_modules() -> None:
    assert {layer_of(m) for m in import_graph()} == set(ALLOWED)


def test_no_module_imports_a_layer_above_its_own() -> None:
    """The arrows go one way: nothing below imports what sits above it."""
    graph = import_graph()
    upward = sorted(
        f"{m} ({layer_of(m)}) imports {dep} ({layer_of(dep)})"
        for m, deps in graph.items()
        for dep in deps
        if layer_of(dep) not in ALLOWED[layer_of(m)]
    )
    assert not upward, "\n".join(upward)


def test_import_taskq_leaves_torch_out_and_taskq_torch_is_there_on_first_use() -> None:
    """``import taskq`` then ``taskq.torch.TaskDataset`` (a lazy attribute), in a fresh
    interpreter: torch is imported by that first use, not by ``import taskq``."""
    code = (
        "import sys, taskq\n"
        "before = 'torch' in sys.modules\n"
        "ds = taskq.torch.TaskDataset\n"
        "print(before, 'torch' in sys.modules, ds.__module__)\n"
        "try:\n"
        "    taskq.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == [
        "False True taskq.torchdata.dataset",
        "module 'taskq' has no attribute 'no_such_name'",
    ]
