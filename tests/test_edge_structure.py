"""How the edge SDK is put together, read from its source (nothing is run).

- Its modules import each other without a cycle, counting imports made only
  for type checking: a cycle means two modules that cannot be read apart.
- Telemetry reads the agent through ``agent.snapshot()``: the telemetry
  modules import no agent module and touch no private attribute of an agent.
- Protocol facts have one home, in ``shared``: no CDN path (``/v1/…``), no
  copy of a document or blob limit or of the digest pattern, and no reply
  timing key read by its string.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "edge_agent"
TELEMETRY_MODULES = ("edge_agent._telemetry", "edge_agent._report")
AGENT_MODULES = {"edge_agent._agent", "edge_agent._agent_core"}
SHARED_FACTS = {"MAX_DOCUMENT_BYTES", "MAX_BLOB_BYTES", "DIGEST_PATTERN"}
TIMING_KEYS = {"queue_ms", "compute_ms", "hub_ms"}


def modules() -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the package by dotted name, parsed."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, ast.parse(path.read_text(), str(path)))
    return found


def package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, tree: ast.Module, known: set[str]) -> Iterator[str]:
    """The package's own modules that ``name`` imports, wherever the import stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package_of(name, path).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from pkg import mod`` imports a module; ``from pkg import name`` the package.
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        yield from (t for t in targets if t in known and t != name)


def import_graph() -> dict[str, set[str]]:
    parsed = modules()
    known = set(parsed)
    return {name: set(imports_of(name, path, tree, known)) for name, (path, tree) in parsed.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_import_graph_sees_the_agent_modules() -> None:
    graph = import_graph()
    assert "edge_agent._agent_core" in graph["edge_agent._agent"]
    assert "edge_agent._telemetry" in graph["edge_agent._agent_core"]
    assert "edge_agent._agent_core" in graph["edge_agent.updater._updater"]  # from ..


def test_edge_modules_import_each_other_without_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("module", TELEMETRY_MODULES)
def test_telemetry_reads_a_snapshot_not_the_agent(module: str) -> None:
    graph = import_graph()
    assert not graph[module] & AGENT_MODULES, f"{module} imports an agent module"
    path, tree = modules()[module]
    private = [
        f"{path.name}:{node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "agent")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "agent")
        )
    ]
    assert private == [], f"private fields of the agent read: {private}"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a path)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def test_protocol_facts_come_from_shared() -> None:
    problems = []
    for name, (_path, tree) in modules().items():
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            where = f"{name}:{getattr(node, 'lineno', '?')}"
            if id(node) in prose:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "/v1/" in node.value or node.value.startswith("/v1"):
                    problems.append(f"{where}: CDN path {node.value[:60]!r} (use shared.CdnPaths)")
                if "sha256:" in node.value and "[0-9a-f]" in node.value:
                    problems.append(f"{where}: a digest pattern (use shared.DIGEST_PATTERN)")
                if node.value in TIMING_KEYS:
                    problems.append(f"{where}: timing key {node.value!r} (use reply_timing)")
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in SHARED_FACTS:
                    problems.append(f"{where}: own copy of {target.id} (import it from shared)")
    assert problems == []
