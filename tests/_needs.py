"""What a test needs from the machine: a PostgreSQL, a Redis, a browser.

``make test`` provides all of them (scripts/ensure-postgres, ensure-redis,
ensure-chromium). Outside CI a missing one skips the tests that need it and
says how to get it; under CI (``CI=true``, as CI services set it) it fails
them, so a run that tested less than it claims cannot pass.
"""

from __future__ import annotations

import os
from typing import NoReturn, overload

import pytest

__all__ = ["in_ci", "need"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


@overload
def need(missing: str) -> NoReturn: ...
@overload
def need(missing: str | None) -> None: ...
def need(missing: str | None) -> None:
    """Skip (fail under CI) with ``missing``, the reason a need is not met; None: met."""
    if missing is None:
        return
    if in_ci():
        pytest.fail(f"{missing} (CI=true: `make test` provides it, so it must be here)")
    pytest.skip(missing)
