"""The fleet simulator's exception.

Exception tree::

    shared.TandemError
    └── SimulatorError      the simulator could not start, a download or an
                            assignment failed, or a wait for the fleet timed out

Bad settings are ``shared.ConfigError`` (a ``ValueError``), raised by
``SimulatorConfig`` before anything connects.
"""

from __future__ import annotations

from shared import TandemError

__all__ = ["SimulatorError"]


class SimulatorError(TandemError):
    """The fleet simulator could not start, or a wait for the fleet timed out."""
