"""The package's modules depend on each other one way: no import cycles, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import django_redislock

PACKAGE = Path(django_redislock.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):  # every import, also inside functions
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` depends on the submodule; `from module import name`
                # on the module (every import runs the package __init__s: not an edge).
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in modules] or [node.module]
            for target in targets:
                if target in modules and target != name and target != "django_redislock":
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_modules():
    assert find_cycle(import_graph()) is None


def test_the_engine_knows_no_face_integration_or_admin():
    graph = import_graph()
    engine_side = (
        "flow", "drivers", "kinds", "face", "runtime", "targets", "transport",
        "holds", "watchdog", "wakeups", "scripts", "connection", "keys",
    )  # fmt: skip
    forbidden = ("celery", "admin", "management", "decorators", "operations")
    for low in engine_side:
        deps = graph[f"django_redislock.{low}"]
        assert not [d for d in deps if d.split(".")[1] in forbidden], (low, deps)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
