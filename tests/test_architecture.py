"""The import arrows of docs/architecture.md hold, and every file it names exists.

tandem -> edge_agent, cloud_hub, model_cdn -> shared; the three middle packages
never import each other, and shared imports none of ours. What crosses a package
line is public: no module (nor an example, nor a bench script) imports another
package's ``_private`` module, and each of tandem's subpackages (``cli``,
``demo``, ``learning``, ``broker``, ``simulator``) counts as a package of its own
here. No import circles inside a package. Checked statically (every absolute and
relative import of every module, functions and ``TYPE_CHECKING`` blocks
included), so an import hidden in a function no test calls is still caught.

Tests: a test may import the private module it tests (a unit test of
``rollout/_significance.py`` needs its private parts); nothing else. A name that a
public package exports is imported from that package, as users write it
(checked); the rest of the rule for tests is kept by review.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("shared", "edge_agent", "cloud_hub", "model_cdn", "tandem")
ALLOWED = {
    "shared": set(),
    "edge_agent": {"shared"},
    "cloud_hub": {"shared"},
    "model_cdn": {"shared"},
    "tandem": {"shared", "edge_agent", "cloud_hub", "model_cdn"},
}


def imports_of(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, top-level package) of ours that ``path`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = path.relative_to(ROOT).with_suffix("").parts
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append((node.lineno, node.module.split(".")[0]))
            elif node.level:  # relative: resolve against the module's own package
                base = parts[: len(parts) - node.level]
                found.append((node.lineno, base[0] if base else package))
    return [(line, top) for line, top in found if top in OURS]


@pytest.mark.parametrize("package", OURS)
def test_imports_point_one_way(package: str) -> None:
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, top in imports_of(path, package):
            if top != package and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not wrong, "\n".join(wrong)


def test_every_file_the_architecture_page_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:shared|edge_agent|cloud_hub|model_cdn|tandem)/[\w/.]*)`", text))
    assert len(named) > 30
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"docs/architecture.md names files that are gone: {missing}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute_imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import of ``path``; ``from X import y`` gives X.y too."""
    return [(line, m) for line, names in import_statements(path) for m in names]


def import_statements(path: Path) -> list[tuple[int, list[str]]]:
    """Each import of ``path`` (functions and ``TYPE_CHECKING`` blocks included) as
    (line, what it names): ``import a.b`` names ``a.b``; ``from X import y, z`` names
    X, X.y and X.z (resolved against the module's package when relative)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parts = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, [a.name]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, [module, *(f"{module}.{a.name}" for a in node.names)]))
    return found


# tandem holds several programs (the CLI, the demos, the learning job, the broker's
# side, the simulator): each subpackage is a home of its own, as a top-level package is.
TANDEM_HOMES = tuple(sorted(p.parent.name for p in (ROOT / "tandem").glob("*/__init__.py")))


def home_of(module: str) -> str:
    """The package ``module`` lives in for the private rule: a top-level package of ours,
    or one of tandem's subpackages."""
    parts = module.split(".")
    if parts[0] == "tandem" and len(parts) > 1 and parts[1] in TANDEM_HOMES:
        return ".".join(parts[:2])
    return parts[0]


def is_private_of_another(importer: str, module: str) -> bool:
    """Whether ``module`` is a private part of a home other than ``importer``'s."""
    home = home_of(module)
    if home.split(".")[0] not in OURS or home == home_of(importer):
        return False
    rest = module.split(".")[home.count(".") + 1 :]
    return any(p.startswith("_") and not p.startswith("__") for p in rest)


@pytest.mark.parametrize("where", [*OURS, "examples", "bench"])
def test_nothing_imports_another_packages_private_modules(where: str) -> None:
    wrong = []
    for path in sorted((ROOT / where).rglob("*.py")):
        importer = module_name(path) if where in OURS else where
        for line, module in absolute_imports(path):
            if is_private_of_another(importer, module):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def exported(module: str) -> set[str]:
    """The names the module or package ``module`` of ours lists in ``__all__`` (read, not run)."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not path.is_file():
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                value = node.value
                if isinstance(value, ast.List | ast.Tuple):
                    return {e.value for e in value.elts if isinstance(e, ast.Constant)}
    return set()


def public_home(module: str, name: str) -> str | None:
    """The nearest public package above the private ``module`` that exports ``name``."""
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
    for j in range(private[0] if private else 0, 0, -1):
        if name in exported(".".join(parts[:j])):
            return ".".join(parts[:j])
    return None


def test_tests_import_public_names_from_where_they_are_public() -> None:
    """A test may import the private module it tests (its unit tests need the private
    parts), but a name its package exports comes from the package, as users write it."""
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if home := public_home(node.module, alias.name):
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        wrong.append(f"{where} imports {alias.name} from {node.module}, not {home}")
    assert not wrong, "\n".join(wrong)


def test_the_private_rule_sees_what_it_should() -> None:
    assert is_private_of_another("tandem", "cloud_hub.plane._launch")
    assert is_private_of_another("examples", "tandem.broker._embedded")
    assert not is_private_of_another("tandem.demo.drift._run", "tandem.demo._run")
    assert is_private_of_another("tandem.cli._demo_view", "tandem.demo._run")
    assert is_private_of_another("tandem.demo.drift._run", "tandem.learning._refine")
    assert not is_private_of_another("tandem.cli.fleet", "tandem.broker")
    assert set(TANDEM_HOMES) >= {"broker", "cli", "demo", "learning", "simulator"}
    assert not is_private_of_another("tandem", "cloud_hub.plane")
    assert not is_private_of_another("tandem", "model_cdn.__init__")
    assert public_home("tandem.demo.drift._run", "DriftConfig") == "tandem.demo.drift"
    assert public_home("model_cdn.registry._base", "Registry") == "model_cdn.registry"
    assert public_home("tandem.demo.drift._run", "_loop") is None


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, at any depth of its code.

    ``from X import y`` is an edge to the module ``X.y`` when there is one, else to
    ``X`` (a name from ``X``, or from its ``__init__`` when ``X`` is a package); so
    ``from . import sub`` leads to ``sub``, and ``from . import Name`` to the
    package's ``__init__``, and from there to what it imports.
    """
    paths = sorted((ROOT / package).rglob("*.py"))
    names = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        targets = set()
        for _, named in import_statements(path):
            for module in named[1:] or named:
                while module and module not in names:
                    module = module.rpartition(".")[0]
                if module and module != me:
                    targets.add(module)
        graph[me] = targets
    return graph


@pytest.mark.parametrize("package", OURS)
def test_no_import_circles_between_modules(package: str) -> None:
    """No import leads back to the importer: imports inside functions and under
    ``TYPE_CHECKING`` count too, since a circle deferred into a function (or into
    the type checker) is still two modules that need each other."""
    circle = find_circle(import_graph(package))
    assert circle is None, " -> ".join(circle or [])


def test_the_import_graph_sees_imports_in_functions_and_from_a_package() -> None:
    graph = import_graph("tandem")
    # ``_build_entry`` imports ``_build`` inside the function, to keep torch out of the import
    assert "tandem.demo.language._build" in graph["tandem.demo.language"]
    # ``from . import main`` names a function of the package: the edge goes to its __init__
    assert graph["tandem.cli.__main__"] == {"tandem.cli"}


def test_the_circle_finder_finds_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
