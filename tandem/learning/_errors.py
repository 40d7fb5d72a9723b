"""What ``tandem models refine`` raises; one tree::

    shared.TandemError
    └── RefineError (RuntimeError)   the job could not run: no usable examples (none, or
        │                            kept without inputs), a trainer that cannot be
        │                            loaded or failed, a base model it cannot rebuild
        └── RefineRefusedError       the refined model is worse than the version in
                                     service on the held-out sets: nothing published;
                                     ``report`` holds both models' figures

Errors of the packages the job drives (``CdnError`` from publishing,
``shared.ExampleShardError`` from reading shards) pass through as they are:
each already says what went wrong, and the CLI prints any ``TandemError`` as
one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import TandemError

if TYPE_CHECKING:
    from ._report import RefineReport

__all__ = ["RefineError", "RefineRefusedError"]


class RefineError(TandemError, RuntimeError):
    """The refine job could not run."""


class RefineRefusedError(RefineError):
    """The refined model is worse than the version in service; ``report`` says by how much."""

    def __init__(self, message: str, report: RefineReport) -> None:
        super().__init__(message)
        self.report = report
