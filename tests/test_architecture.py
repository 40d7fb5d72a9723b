"""The import arrows of docs/architecture.md hold, and every file it names exists.

tandem -> edge_agent, cloud_hub, model_cdn -> shared; the three middle packages
never import each other, and shared imports none of ours. Checked statically
(every absolute and relative import of every module, functions included), so an
import hidden in a function no test calls is still caught.
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
