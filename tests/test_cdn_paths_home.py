"""The CDN's URL layout has one home, ``shared.CdnPaths``: the server declares its routes
from ``CdnPaths.ROUTES`` and model_cdn's code writes no ``/v1/…`` path of its own.

Docstrings may show paths (they document the API); string literals in code may not.
"""

from __future__ import annotations

import ast
from pathlib import Path

from model_cdn import LocalBlobStore, create_app, open_registry
from shared import CdnPaths

ROOT = Path(__file__).resolve().parents[1]


def docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def v1_literals(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = docstrings(tree)
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r:.60}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and ("/v1/" in node.value or node.value.rstrip("/") == "/v1")
    ]


def test_model_cdn_writes_no_v1_path_outside_shared_cdn_paths() -> None:
    files = sorted((ROOT / "model_cdn").rglob("*.py"))
    assert files
    found = [hit for path in files for hit in v1_literals(path)]
    assert found == []


def test_the_scan_finds_a_path_in_code_and_not_in_a_docstring(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""GET /v1/models"""\nURL = f"/v1/blobs/{1}"\nBASE = "/v1"\n')
    found = [hit.split(": ", 1)[1] for hit in v1_literals(sample, tmp_path)]
    assert sorted(found) == ["'/v1'", "'/v1/blobs/'"]


def test_the_server_serves_exactly_the_routes_of_cdn_paths(tmp_path: Path) -> None:
    registry = open_registry(tmp_path / "registry.db")
    try:
        app = create_app(
            registry=registry, store=LocalBlobStore(tmp_path / "blobs"), admin_token="t"
        )
    finally:
        registry.close()
    served = {getattr(route, "path", "") for route in app.routes}
    routes = set(CdnPaths.ROUTES.values())
    assert {p for p in served if p.startswith("/v1")} == {p for p in routes if p.startswith("/v1")}
    assert served - set(CdnPaths.ROUTES.values()) == {"/healthz", "/metrics"}
