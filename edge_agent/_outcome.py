"""Why the local answer stands in for the cloud's, and what one try of the cloud came to.

``FallbackReason`` names every way an offload can end in the local answer
(``Source.EDGE_FALLBACK``). Its values are the strings that results carry in
``reason``, that ``agent.stats.by_reason`` counts and that telemetry reports
(``AgentMetrics.fallbacks`` without the ``fallback:`` prefix); they are a
contract with dashboards and rollout gates, so a value never changes. Being a
``str`` enum, a member equals (and hashes as) its string.

One try of the cloud ends in a ``CloudOutcome``: ``CloudAnswer`` (the hub
answered: the result to return) or ``Fallback`` (why the local answer must
do). Pure: no I/O, no agent state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

from shared import ErrorCode

from ._errors import EdgeError, InvalidInputError, NoAnswerError
from ._result import InferenceResult

__all__ = [
    "FALLBACK_PREFIX",
    "CloudAnswer",
    "CloudOutcome",
    "Fallback",
    "FallbackReason",
    "blames_input",
    "hub_unavailable",
    "no_answer_error",
]

FALLBACK_PREFIX = "fallback:"


class FallbackReason(enum.StrEnum):
    """Why a request that wanted the cloud got the local answer (``result.reason``)."""

    # Decided on the device, before or instead of sending.
    NO_UPLINK = "fallback:no_uplink"  # the agent has no broker
    BREAKER_OPEN = "fallback:breaker_open"  # the cloud failed recently; not tried now
    NO_TIME = "fallback:no_time"  # the deadline leaves no time to wait for the cloud
    # The request went out and no answer came back.
    TIMEOUT = "fallback:timeout"  # no reply within the time left
    BROKER_UNAVAILABLE = "fallback:broker_unavailable"  # not connected, or the connection broke
    # The hub answered with an error: "fallback:" + the reply's ``ErrorCode``.
    BAD_REQUEST = "fallback:bad_request"
    INVALID_INPUT = "fallback:invalid_input"
    UNKNOWN_MODEL = "fallback:unknown_model"
    TOO_LARGE = "fallback:too_large"
    OVERLOADED = "fallback:overloaded"
    DEADLINE_EXCEEDED = "fallback:deadline_exceeded"
    INTERNAL = "fallback:internal"

    @property
    def cause(self) -> str:
        """The value without its ``fallback:`` prefix, as telemetry's ``fallbacks`` keys it."""
        return self.value.removeprefix(FALLBACK_PREFIX)

    @classmethod
    def for_error(cls, error: ErrorCode) -> FallbackReason:
        """The reason for a hub reply carrying ``error`` (any code but ``OK``)."""
        if error is ErrorCode.OK:
            raise ValueError("a reply without an error is no reason to fall back")
        return cls(FALLBACK_PREFIX + error.value)

    @classmethod
    def for_exception(cls, error: BaseException) -> FallbackReason:
        """The reason for a send that raised: the wait ran out, or the uplink failed."""
        return cls.TIMEOUT if isinstance(error, TimeoutError) else cls.BROKER_UNAVAILABLE


# Hub replies that say "the cloud is not there for you now": they feed the breaker.
# The others say "up, but not for this request" and count as the cloud being up.
_UNAVAILABLE = frozenset({ErrorCode.OVERLOADED, ErrorCode.DEADLINE_EXCEEDED, ErrorCode.INTERNAL})


def hub_unavailable(error: ErrorCode) -> bool:
    """Whether a hub's error reply means the cloud is unavailable (a breaker failure)."""
    return error in _UNAVAILABLE


@dataclass(frozen=True, slots=True)
class CloudAnswer:
    """The hub answered: ``result`` is what the call returns."""

    result: InferenceResult


@dataclass(frozen=True, slots=True)
class Fallback:
    """The cloud did not answer usefully: the local answer stands, for ``reason``.

    ``detail``: the hub's own error message when it answered with an error.
    """

    reason: FallbackReason
    detail: str = ""


# Hub errors that blame the request, not the cloud: with no local model to stand in,
# the caller gets them as ``InvalidInputError`` rather than "the cloud failed".
_BLAMES_INPUT = frozenset(
    code.value for code in (ErrorCode.INVALID_INPUT, ErrorCode.BAD_REQUEST, ErrorCode.TOO_LARGE)
)


def blames_input(reason: FallbackReason) -> bool:
    """Whether the hub refused this request for what it carried (shape, dtype, size)."""
    return reason.cause in _BLAMES_INPUT


def no_answer_error(cloud_model: str, outcome: Fallback) -> EdgeError:
    """What a call with no local model raises when its try of the cloud came to ``outcome``.

    The input's fault, which only the hub could check, is ``InvalidInputError``
    in the hub's words; anything else is ``NoAnswerError``, saying why.
    """
    reason, detail = outcome.reason, outcome.detail
    if blames_input(reason):
        return InvalidInputError(
            f"the hub refused the input for model {cloud_model!r}: {detail or reason.cause}"
        )
    if reason is FallbackReason.UNKNOWN_MODEL:
        return NoAnswerError(
            f"model {cloud_model!r} is not on this device and the hub does not serve it "
            f"({detail or reason}); check cloud_model="
        )
    return NoAnswerError(
        f"model {cloud_model!r} is not on this device and the cloud failed ({reason}"
        + (f": {detail})" if detail else ")")
    )


CloudOutcome: TypeAlias = CloudAnswer | Fallback
