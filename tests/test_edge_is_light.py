"""A device installs ``shared`` and ``edge_agent`` only: neither may pull in the hub's stack.

Checked twice: by importing every module of both packages in a fresh interpreter,
and statically, so that an import hidden in a function that no test calls is
still caught.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIGHT_PACKAGES = ("shared", "edge_agent")
HEAVY = ("torch", "fastapi", "uvicorn", "starlette", "cloud_hub", "model_cdn", "tandem")

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
for top in {packages!r}:
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(package.__path__, prefix=top + "."):
        if not info.name.endswith(".__main__"):  # importing it would run it
            importlib.import_module(info.name)
heavy = {heavy!r}
print(json.dumps(sorted(
    name for name in sys.modules if name in heavy or name.split(".")[0] in heavy
)))
"""


def is_heavy(module: str) -> bool:
    return module.split(".")[0] in HEAVY


def test_importing_every_edge_module_loads_nothing_heavy() -> None:
    script = IMPORT_EVERYTHING.format(packages=LIGHT_PACKAGES, heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {', '.join(LIGHT_PACKAGES)} loaded {loaded}"


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every absolute import, and import_module/__import__ of a literal."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_no_edge_source_file_imports_anything_heavy() -> None:
    offences: list[str] = []
    files = [path for package in LIGHT_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert files
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offences.extend(
            f"{path.relative_to(ROOT)}:{line}: {module}"
            for line, module in imported_modules(tree)
            if is_heavy(module)
        )
    assert not offences, "heavy imports in edge code:\n" + "\n".join(offences)


def test_the_static_check_sees_every_kind_of_import() -> None:
    source = (
        "import torch.nn\n"
        "from fastapi import FastAPI\n"
        "import json, uvicorn as u\n"
        "from . import tandem\n"  # relative: our own module, not the package
        "def f():\n"
        "    import importlib\n"
        "    importlib.import_module('cloud_hub.batching._batcher')\n"
        "    __import__('model_cdn')\n"
        "from tandems import x\n"
    )
    modules = [module for _, module in imported_modules(ast.parse(source))]
    assert sorted(m for m in modules if is_heavy(m)) == [
        "cloud_hub.batching._batcher",
        "fastapi",
        "model_cdn",
        "torch.nn",
        "uvicorn",
    ]


# What only servers use lives in shared.server: devices never import it.
SERVER_ONLY = "shared.server"
IMPORT_DEVICE_SIDE = """
import importlib, json, pkgutil, sys
import shared
import edge_agent
for info in pkgutil.walk_packages(edge_agent.__path__, prefix="edge_agent."):
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted(name for name in sys.modules if name.startswith("shared.server"))))
"""


def relative_target(path: Path, node: ast.ImportFrom) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def test_no_device_module_imports_what_only_servers_use() -> None:
    offences: list[str] = []
    device_files = [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if p.relative_to(ROOT).parts[0] in ("edge_agent", "shared")
        and "server" not in p.relative_to(ROOT).parts
    ]
    assert device_files
    for path in device_files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules = [module for _, module in imported_modules(tree)]
        modules += [
            relative_target(path, node) + "." + alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level
            for alias in node.names
        ]
        offences += [
            f"{path.relative_to(ROOT)}: {m}"
            for m in modules
            if m == SERVER_ONLY or m.startswith(SERVER_ONLY + ".")
        ]
    assert not offences, "device code imports shared.server:\n" + "\n".join(offences)


def test_importing_the_device_side_loads_nothing_server_only() -> None:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_DEVICE_SIDE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
