"""Each package's ``__init__`` names its public API in ``__all__``, and nothing else is public.

Packages that do not exist (yet), or are namespace packages without an ``__init__``,
are skipped; one that exists but fails to import is a failure.
"""

from __future__ import annotations
import __future__

import importlib
import importlib.util
import types

import pytest

PACKAGES = ["shared", "edge_agent", "cloud_hub", "model_cdn", "tandem"]


def import_package(name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip(f"there is no package {name!r}")
    if spec.origin is None or not spec.origin.endswith("__init__.py"):
        pytest.skip(f"{name!r} has no __init__.py yet")
    return importlib.import_module(name)


def public_members(package: types.ModuleType) -> set[str]:
    """Public names bound in the package's namespace, bar its own submodules."""
    members = set()
    for member, value in vars(package).items():
        if member.startswith("_"):
            continue
        if isinstance(value, __future__._Feature):  # from __future__ import annotations
            continue
        if isinstance(value, types.ModuleType) and value.__name__.startswith(
            package.__name__ + "."
        ):
            continue  # a subpackage, reachable as package.sub, with its own __all__
        members.add(member)
    return members


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_is_importable(name: str) -> None:
    package = import_package(name)
    exported = getattr(package, "__all__", None)
    assert isinstance(exported, list | tuple), f"{name}.__all__ is missing"
    assert all(isinstance(member, str) for member in exported)
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    for member in exported:
        namespace: dict[str, object] = {}
        exec(f"from {name} import {member}", namespace)  # the statement users write
        assert namespace[member] is getattr(package, member)


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_member_is_in_all(name: str) -> None:
    package = import_package(name)
    missing = public_members(package) - set(getattr(package, "__all__", ()))
    assert not missing, f"public in {name} but not in __all__: {sorted(missing)}"
