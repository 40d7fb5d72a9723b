"""One exception tree per package, complete, exported, and drawn as it is.

For each package: every exception class that any of its modules defines
lives in (or is re-exported from) its ``_errors`` module, is exported from the
package's ``__init__`` (and listed in ``__all__``), derives from the package's
base, and appears in the tree that ``_errors``' docstring draws, under the
parent the drawing shows.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import types

import pytest

import shared
from cloud_hub import HubError
from edge_agent import EdgeError
from model_cdn import CdnError
from shared import TandemError

TREES = [
    ("shared", TandemError),
    ("edge_agent", EdgeError),
    ("cloud_hub", HubError),
    ("model_cdn", CdnError),
]

# A drawn line: the tree's prefix ("│   ", "├── ", "└── ", spaces), then a class name.
_DRAWN = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>(?:shared\.)?[A-Z]\w*)\b")


def package_modules(name: str) -> list[types.ModuleType]:
    package = importlib.import_module(name)
    found = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
        found.append(importlib.import_module(info.name))
    return found


def defined_exceptions(name: str) -> dict[str, type[BaseException]]:
    """Exception classes whose defining module is one of the package's."""
    found: dict[str, type[BaseException]] = {}
    for module in package_modules(name):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[value.__name__] = value
    return found


def drawn_tree(doc: str) -> dict[str, str | None]:
    """``{class name: parent name}`` as the ``Exception tree::`` block draws it."""
    block = doc.split("::", 1)[1]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name)
    for line in block.splitlines():
        if line and not line.startswith(" "):
            break  # the prose after the drawing
        match = _DRAWN.match(line)
        if match is None:
            continue  # blank, or a description wrapped onto its own line
        column, name = len(match["prefix"]), match["name"].removeprefix("shared.")
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


@pytest.mark.parametrize(("name", "base"), TREES)
def test_every_exception_is_in_errors_exported_and_under_the_base(
    name: str, base: type[BaseException]
) -> None:
    package = importlib.import_module(name)
    errors = importlib.import_module(f"{name}._errors")
    defined = defined_exceptions(name)
    assert base.__name__ in defined or base is TandemError
    assert len(defined) > 3
    for cls_name, cls in defined.items():
        assert getattr(errors, cls_name, None) is cls, f"{cls_name} is not in {name}._errors"
        assert getattr(package, cls_name, None) is cls, f"{name} does not export {cls_name}"
        assert cls_name in package.__all__, f"{cls_name} is missing from {name}.__all__"
        assert issubclass(cls, base), f"{cls_name} does not derive from {base.__name__}"


@pytest.mark.parametrize(("name", "base"), TREES)
def test_the_drawn_tree_is_the_class_tree(name: str, base: type[BaseException]) -> None:
    errors = importlib.import_module(f"{name}._errors")
    assert errors.__doc__ is not None
    drawn = drawn_tree(errors.__doc__)
    defined = defined_exceptions(name)
    assert set(defined) <= set(drawn), f"not drawn: {sorted(set(defined) - set(drawn))}"
    for cls_name, parent in drawn.items():
        cls = defined.get(cls_name) or getattr(shared, cls_name)
        if parent is None:
            assert cls is TandemError  # the one root of every tree
            continue
        parent_cls = defined.get(parent) or getattr(shared, parent)
        assert parent_cls in cls.__bases__, f"{cls_name} is drawn under {parent}"
