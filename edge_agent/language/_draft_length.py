"""How many tokens the device drafts per speculative round, from the link and the acceptance rate.

The round model (pure; what ``best_k`` maximizes and ``DraftLength`` follows):

- Each drafted token is accepted with probability ``alpha``, independently, and
  the round stops at the first rejection; the hub always adds one token of its
  own. Tokens per round: ``expected_tokens(alpha, k) = 1 + alpha + ... + alpha**k
  = (1 - alpha**(k+1)) / (1 - alpha)`` (``k + 1`` at ``alpha = 1``).
- A round takes ``round_s = rtt_s + hub_verify_s + k * draft_s_per_token``: the
  device drafts ``k`` tokens, sends them, the hub verifies them in one pass, the
  reply comes back. ``rtt_s`` is the network round trip; when only the time from
  sending to the reply is measured (``DraftLength``), pass it as ``rtt_s`` with
  ``hub_verify_s=0``.
- Drafting ahead (``ahead=True``): while a verification is in flight the device
  drafts the next round from its own guess of the outcome (all drafts kept and
  the hub's token equal to its own next draft, probability ``alpha**(k+1)``).
  When the guess holds, up to ``rtt_s + hub_verify_s`` seconds of the next
  round's drafting are already done, so the expected round time is
  ``round_s - alpha**(k+1) * min(k * draft_s_per_token, rtt_s + hub_verify_s)``.

``best_k`` is the ``k`` in ``k_min..k_max`` with the most expected tokens per
second, ``expected_tokens / round_s`` (the smaller ``k`` on a tie). It grows
with the round trip (a longer fixed cost per round pays for more drafts) and
shrinks with ``alpha`` (drafts past the first rejection are wasted).

``crossover`` is where this beats cloud-only streaming, in which the hub
decodes token after token at ``hub_s_per_token`` each and streams them (the
round trip is paid once per turn, not per token). With ``hub_verify_s =
verify_passes * hub_s_per_token`` (one pass over ``k + 1`` tokens costs about
one decoding step when the hub is memory-bound; more on a compute-bound CPU),
speculative decoding is faster per token when ``round_s / E < h``, that is::

    h * (E - verify_passes) > rtt_s + k * draft_s_per_token
    h* = (rtt_s + k * draft_s_per_token) / (E - verify_passes)

with ``E = expected_tokens(alpha, k)``; ``E - 1`` is the drafts accepted per
round, so at ``verify_passes = 1`` and free drafting this is the round trip
over the tokens accepted per round. With ``E <= verify_passes`` it never wins
(``inf``). Drafting ahead replaces ``round_s`` by its expected value above;
``h*`` then solves a piecewise-linear equation (both pieces in ``crossover``).
"""

from __future__ import annotations

import math

from .._errors import InvalidInputError

__all__ = ["DraftLength", "best_k", "crossover", "expected_tokens", "round_seconds"]


def _check_alpha(alpha: float) -> float:
    if not (isinstance(alpha, int | float) and 0.0 <= alpha <= 1.0):
        raise InvalidInputError(f"acceptance rate must be in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_seconds(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and 0.0 <= value < math.inf):
        raise InvalidInputError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _check_count(name: str, value: int, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInputError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round yields on average: ``(1 - alpha**(k+1)) / (1 - alpha)``."""
    alpha, k = _check_alpha(alpha), _check_count("k", k, low=0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def round_seconds(
    alpha: float,
    k: int,
    rtt_s: float,
    hub_verify_s: float,
    draft_s_per_token: float,
    *,
    ahead: bool = False,
) -> float:
    """The expected time of one round of ``k`` drafts (the model in the module docstring)."""
    alpha, k = _check_alpha(alpha), _check_count("k", k, low=0)
    rtt_s, hub_verify_s = _check_seconds("rtt_s", rtt_s), _check_seconds("verify", hub_verify_s)
    draft_s = _check_seconds("draft_s_per_token", draft_s_per_token)
    in_flight = rtt_s + hub_verify_s
    seconds = in_flight + k * draft_s
    if ahead:
        seconds -= alpha ** (k + 1) * min(k * draft_s, in_flight)
    return seconds


def best_k(
    alpha: float,
    rtt_s: float,
    hub_verify_s: float,
    draft_s_per_token: float,
    k_max: int,
    *,
    k_min: int = 1,
    ahead: bool = False,
) -> int:
    """The draft length in ``k_min..k_max`` with the most expected tokens per second."""
    k_min, k_max = _check_count("k_min", k_min), _check_count("k_max", k_max)
    if k_min > k_max:
        raise InvalidInputError(f"k_min {k_min} is above k_max {k_max}")
    best, best_rate = k_min, -1.0
    for k in range(k_min, k_max + 1):
        seconds = round_seconds(alpha, k, rtt_s, hub_verify_s, draft_s_per_token, ahead=ahead)
        tokens = expected_tokens(alpha, k)
        rate = math.inf if seconds == 0 else tokens / seconds
        if rate > best_rate * (1 + 1e-12):  # a strictly better rate: ties keep the smaller k
            best, best_rate = k, rate
    return best


def crossover(
    alpha: float,
    k: int,
    rtt_s: float,
    draft_s_per_token: float = 0.0,
    *,
    verify_passes: float = 1.0,
    ahead: bool = False,
    ratio: float = 1.0,
) -> float:
    """The hub's seconds per token above which speculative decoding beats cloud-only streaming.

    ``h*`` of the module docstring, for ``k`` drafts at acceptance ``alpha``:
    ``(rtt_s + k * draft_s_per_token) / (E - verify_passes)``, ``inf`` when
    ``E <= verify_passes``. With ``ahead``, the expected round time of drafting
    ahead: with ``a = alpha**(k+1)``, ``D = k * draft_s_per_token`` and
    ``W = rtt_s + verify_passes * h`` (the time in flight), the round is
    ``W + D - a * min(D, W)``; solving ``round = E * h`` on each side of ``D = W``
    gives ``h = (rtt_s + (1 - a) * D) / (E - verify_passes)`` where ``D <= W``
    and ``h = ((1 - a) * rtt_s + D) / (E - (1 - a) * verify_passes)`` where
    ``D > W``; the one consistent with its side is returned.

    ``ratio`` < 1 asks for more than breaking even: the hub time per token above
    which a speculative token takes at most ``ratio`` of a cloud-only one (0.65:
    35% lower latency); every formula above then has ``ratio * E`` for ``E``.
    """
    if not (isinstance(ratio, int | float) and 0 < ratio < math.inf):
        raise InvalidInputError(f"ratio must be a finite number > 0, got {ratio!r}")
    tokens = ratio * expected_tokens(alpha, k)
    rtt_s, draft_s = _check_seconds("rtt_s", rtt_s), _check_seconds("draft", draft_s_per_token)
    v = _check_seconds("verify_passes", verify_passes)
    drafting = k * draft_s
    if not ahead:
        return (rtt_s + drafting) / (tokens - v) if tokens > v else math.inf
    a = alpha ** (k + 1)
    if tokens > v:  # drafting shorter than the flight: D <= rtt + v * h
        h = (rtt_s + (1 - a) * drafting) / (tokens - v)
        if drafting <= rtt_s + v * h:
            return h
    if tokens > (1 - a) * v:  # drafting longer than the flight
        h = ((1 - a) * rtt_s + drafting) / (tokens - (1 - a) * v)
        if drafting > rtt_s + v * h:
            return h
    return math.inf


class DraftLength:
    """The draft length ``k`` of the next round, moved toward ``best_k`` after each round.

    ``observe`` takes one finished round: ``rtt_s`` from sending the drafts to
    the hub's reply (its verification included), how many tokens were
    ``drafted`` and ``accepted``, and the device's seconds per drafted token.
    It keeps exponentially weighted averages (weight ``smoothing`` on the new
    round) of the round trip, of the drafting time, and of acceptance as
    accepted tokens over tested tokens (a round that kept every draft tested
    ``drafted`` tokens, one that stopped tested ``accepted + 1``: the
    per-token rate of a run stopped at its first rejection, not
    ``accepted / drafted``, which undercounts). ``k`` then moves toward
    ``best_k`` by at most ``max_step`` per round, within ``k_min..k_max``.
    """

    def __init__(
        self,
        *,
        k_min: int = 1,
        k_max: int = 16,
        start: int = 4,
        smoothing: float = 0.2,
        max_step: int = 2,
        ahead: bool = False,
    ) -> None:
        self.k_min, self.k_max = _check_count("k_min", k_min), _check_count("k_max", k_max)
        start, self.max_step = _check_count("start", start), _check_count("max_step", max_step)
        if not k_min <= start <= k_max:
            raise InvalidInputError(f"start {start} is outside k_min..k_max ({k_min}..{k_max})")
        if not (isinstance(smoothing, int | float) and 0 < smoothing <= 1):
            raise InvalidInputError(f"smoothing must be in (0, 1], got {smoothing!r}")
        self.smoothing, self.ahead = float(smoothing), ahead
        self._k = start
        self._accepted = self._tested = 0.0  # EWMAs; their ratio is alpha
        self._rtt_s: float | None = None
        self._draft_s = 0.0
        self._rounds = 0

    @property
    def k(self) -> int:
        """How many tokens to draft next round."""
        return self._k

    @property
    def alpha(self) -> float | None:
        """The smoothed per-token acceptance rate (None before any token was tested)."""
        return self._accepted / self._tested if self._tested > 0 else None

    @property
    def rtt_s(self) -> float | None:
        """The smoothed seconds from sending drafts to the reply (None before a round)."""
        return self._rtt_s

    def observe(self, rtt_s: float, drafted: int, accepted: int, draft_s_per_token: float) -> None:
        """Fold in one round; ``k`` is then the next round's draft length."""
        rtt_s = _check_seconds("rtt_s", rtt_s)
        draft_s = _check_seconds("draft_s_per_token", draft_s_per_token)
        drafted = _check_count("drafted", drafted, low=0)
        if isinstance(accepted, bool) or not isinstance(accepted, int):
            raise InvalidInputError(f"accepted must be an integer, got {accepted!r}")
        if not 0 <= accepted <= drafted:
            raise InvalidInputError(f"accepted {accepted} is outside 0..drafted ({drafted})")
        tested = drafted if accepted == drafted else accepted + 1
        w = self.smoothing if self._rounds else 1.0  # the first round sets the averages
        self._accepted += w * (accepted - self._accepted)
        self._tested += w * (tested - self._tested)
        self._rtt_s = rtt_s if self._rtt_s is None else self._rtt_s + w * (rtt_s - self._rtt_s)
        self._draft_s += w * (draft_s - self._draft_s)
        self._rounds += 1
        alpha = self.alpha
        if alpha is None:  # nothing drafted yet: nothing learned about acceptance
            return
        target = best_k(
            alpha, self._rtt_s, 0.0, self._draft_s, self.k_max, k_min=self.k_min, ahead=self.ahead
        )
        step = max(-self.max_step, min(self.max_step, target - self._k))
        self._k = max(self.k_min, min(self.k_max, self._k + step))
