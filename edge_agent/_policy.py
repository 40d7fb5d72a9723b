"""Offload policies: where each request is answered. Pure logic, no I/O.

A request passes two checks:

1. **heavy** (``HeavyCheck``, before local compute): offload without running
   locally when the input is too big, the model is not on the device, or the
   predicted local latency misses the deadline while the predicted offload
   latency meets it (or at least beats local).
2. **uncertain** (``UncertainCheck``, after local compute): offload when the
   uncertainty score of the local output is above a threshold. The threshold
   is given, or **calibrated to an offload budget**: the (1 - budget)
   quantile of scores on a calibration set, so that share of requests scores
   above it. With ``adapt=True`` (the default) the threshold is the quantile,
   at a level ``u``, of a sliding window of recent scores (256, seeded with
   the calibration scores, re-taken every 16 requests), and ``u`` itself
   moves by ``step * (budget - offloaded)`` after every decision (a
   stochastic-approximation quantile tracker). The window follows the input
   distribution when it drifts; ``u`` absorbs what the window misjudges (its
   lag right after a shift, a calibration set harder or easier than live
   traffic, ties at the threshold). Because ``u`` stays in [0, 1], the
   realized share of any ``n`` consecutive decisions is the budget within
   ``(u_end - u_start) / (step * n)``: no backlog of past errors is paid
   back later, so the rate holds on a shifted stream, not just on average
   (the earlier design fed back the share realized over the whole
   1,000-decision window, which kept correcting an overshoot long after the
   window had caught up: 16.9% at a 20% budget after a drift). Requests
   offloaded as heavy are charged to the same budget.
   The score is a built-in one, any callable, or a router trained on the
   calibration split (``LearnedScore``, ``OffloadPolicy.learned``); a router
   with input features is handed each request's inputs as well.

Invariants: ``OffloadPolicy.before`` never runs the model; ``after`` only
reads its outputs; a decision always carries a reason; with a budget b the
uncertain share of locally-run requests converges to at most b minus the
heavy share (ties at the threshold stay local, so "at most").
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ._estimator import LatencyEstimator, NetworkEstimator
from ._learned import LearnedScore
from ._scores import OutputKind, ScoreFn, resolve_score, to_probabilities

__all__ = [
    "Decision",
    "HeavyCheck",
    "OffloadPolicy",
    "RequestFacts",
    "Route",
    "UncertainCheck",
    "next_level",
    "quantile_threshold",
]


class Route(enum.StrEnum):
    LOCAL = "local"
    CLOUD = "cloud"


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route
    reason: str
    score: float | None = None


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What is known about a request before it runs."""

    payload_bytes: int
    deadline_ms: float | None
    local_model: bool = True
    queue_depth: int = 0


# Decisions that do not depend on the request are made once (frozen, so shareable).
_RUN_LOCAL = Decision(Route.LOCAL, "local")
_ALWAYS_LOCAL = Decision(Route.LOCAL, "always_local")
_ALWAYS_CLOUD = Decision(Route.CLOUD, "always_cloud")
_NO_LOCAL_MODEL = Decision(Route.CLOUD, "no_local_model")


@dataclass(frozen=True, kw_only=True)
class HeavyCheck:
    """Offload before local compute when a request is too heavy for the device.

    ``max_input_bytes``: inputs above this go to the cloud. ``use_latency``:
    compare predicted local and offload latency against the deadline.
    """

    max_input_bytes: int | None = None
    use_latency: bool = True

    def check(
        self, facts: RequestFacts, local: LatencyEstimator, network: NetworkEstimator
    ) -> Decision | None:
        if self.max_input_bytes is not None and facts.payload_bytes > self.max_input_bytes:
            return Decision(Route.CLOUD, "heavy:input_size")
        if not self.use_latency or facts.deadline_ms is None:
            return None
        local_ms = local.predict_ms(facts.queue_depth)
        if local_ms <= facts.deadline_ms:
            return None
        offload_ms = network.predict_ms(facts.payload_bytes)
        if offload_ms < local_ms:
            return Decision(Route.CLOUD, "heavy:latency")
        return None


class UncertainCheck:
    """Offload after local compute when the local answer is not confident enough.

    Give ``threshold`` directly, or ``budget`` (a share of requests in [0, 1])
    and calibrate with ``calibrate(outputs)`` on held-out samples. ``output``
    names the output tensor to score (default: the first). With a budget and
    ``adapt`` (the default) the threshold follows the stream: the quantile
    of the last ``window`` scores, re-taken every ``refresh_every``
    requests, at a level (``level``) that each decision moves by ``step``
    times its error (see the module docstring).
    """

    def __init__(
        self,
        score: str | ScoreFn = "margin",
        *,
        threshold: float | None = None,
        budget: float | None = None,
        adapt: bool = True,
        window: int = 256,
        refresh_every: int = 16,
        step: float = 0.02,
        outputs: OutputKind = "auto",
        output: str | None = None,
    ) -> None:
        if (threshold is None) == (budget is None):
            raise ValueError("give exactly one of threshold= or budget=")
        if budget is not None and not 0.0 <= budget <= 1.0:
            raise ValueError(f"budget must be within [0, 1], got {budget}")
        if window < 10 or refresh_every < 1:
            raise ValueError("window must be >= 10 and refresh_every >= 1")
        if not 0.0 < step <= 1.0:
            raise ValueError(f"step must be within (0, 1], got {step}")
        self.score_name, self._score = resolve_score(score)
        self.budget = budget
        self.adapt = adapt and budget is not None
        self.outputs = outputs
        self.output = output
        self.refresh_every = refresh_every
        self._threshold = threshold if threshold is not None else float("inf")
        self._calibrated = threshold is not None
        self.step = step
        self._window: deque[float] = deque(maxlen=window)
        self._since_refresh = 0
        self._lock = threading.Lock()
        self._effective_budget = budget
        self._level = budget or 0.0  # the window quantile's level u (see the module docstring)

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    @property
    def uses_inputs(self) -> bool:
        """Whether the score reads the request's inputs too (a router with input features)."""
        return isinstance(self._score, LearnedScore) and self._score.uses_inputs

    def scores(
        self,
        outputs: Mapping[str, np.ndarray] | np.ndarray,
        inputs: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Uncertainty score of each row of the scored output (``inputs``: for a router)."""
        if isinstance(outputs, Mapping):
            name = self.output or next(iter(outputs))
            if name not in outputs:
                raise KeyError(f"output {name!r} not among {list(outputs)}")
            values = outputs[name]
        else:
            values = outputs
        probs = to_probabilities(values, self.outputs)
        score = self._score
        if isinstance(score, LearnedScore) and score.uses_inputs:
            return score.logits(probs, inputs)
        return np.asarray(score(probs), dtype=np.float64)

    def calibrate(
        self,
        outputs: Iterable[Mapping[str, np.ndarray] | np.ndarray]
        | Mapping[str, np.ndarray]
        | np.ndarray,
        *,
        inputs: Mapping[str, np.ndarray] | None = None,
    ) -> float:
        """Set the threshold from outputs of held-out samples; returns it.

        Accepts one array (or mapping) of outputs [n, classes], or an iterable
        of per-request outputs. Needs a budget. A router with input features
        needs ``inputs`` too (named arrays, rows first), with one array of
        outputs.
        """
        if self.budget is None:
            raise ValueError("calibrate() needs budget=; this check has a fixed threshold")
        if isinstance(outputs, np.ndarray | Mapping):
            scores = self.scores(outputs, inputs)
        else:
            scores = np.concatenate([self.scores(o) for o in outputs])
        if scores.size == 0:
            raise ValueError("calibrate() needs at least one sample")
        with self._lock:
            self._window.clear()
            self._window.extend(scores[-(self._window.maxlen or 1) :].tolist())
            self._since_refresh = 0
            self._level = self._target()
            self._threshold = quantile_threshold(scores, self.budget)
            self._calibrated = True
        return self._threshold

    def set_effective_budget(self, budget: float) -> None:
        """Budget left for uncertain offloads after heavy ones took their share."""
        budget = min(max(budget, 0.0), 1.0)
        with self._lock:  # the level keeps its correction: it moves with the budget
            moved = self._level + budget - self._target()
            self._level = min(max(moved, 0.0), 1.0)
            self._effective_budget = budget

    def decide(self, row_scores: np.ndarray) -> Decision:
        """Offload if any row of the request is above the threshold."""
        score = float(row_scores.max()) if row_scores.size else 0.0
        offload = score > self._threshold
        if self.adapt:
            self._observe(score, offload)
        if offload:
            return Decision(Route.CLOUD, "uncertain", score)
        return Decision(Route.LOCAL, "confident", score)

    @property
    def level(self) -> float:
        """The quantile level the adapting threshold aims at (the budget, give or take what
        the window misjudges)."""
        return self._level

    def _target(self) -> float:
        return self._effective_budget if self._effective_budget is not None else 0.0

    def _observe(self, score: float, offloaded: bool) -> None:
        with self._lock:
            self._window.append(score)
            # Each decision moves the level by its error (a stochastic-approximation quantile
            # tracker): an offload above the budget's share lowers it, a local answer raises
            # it. At a budget of 0 or 1 the level stays there (nothing to track).
            self._level = next_level(self._level, self._target(), self.step, offloaded)
            self._since_refresh += 1
            if self._since_refresh < self.refresh_every or len(self._window) < 10:
                return
            self._since_refresh = 0
            self._threshold = quantile_threshold(np.fromiter(self._window, float), self._level)
            self._calibrated = True


def next_level(level: float, target: float, step: float, taken: bool | float) -> float:
    """The quantile level after one decision: moved by its error (``taken``: offloaded,
    handed off; or the share of the decision's units that were, as a text turn's hub
    tokens), clipped to [0, 1]; at a target of 0 or 1, the target (nothing to track)."""
    if 0.0 < target < 1.0:
        error = target - float(taken)
        return min(max(level + step * error, 0.0), 1.0)
    return target


def quantile_threshold(scores: np.ndarray, budget: float) -> float:
    """The score above which a ``budget`` share of ``scores`` lies."""
    if budget <= 0.0:
        return float("inf")
    if budget >= 1.0:
        return float("-inf")
    return float(np.quantile(scores, 1.0 - budget, method="higher"))


class OffloadPolicy:
    """A heavy check and an uncertain check composed; or always local / always cloud.

    Build with the constructor or the factories: ``OffloadPolicy.always_local()``,
    ``OffloadPolicy.always_cloud()``, ``OffloadPolicy.budget(0.15, score="margin")``.
    """

    def __init__(
        self,
        *,
        heavy: HeavyCheck | None = None,
        uncertain: UncertainCheck | None = None,
        always: Route | None = None,
        heavy_share_alpha: float = 0.02,
    ) -> None:
        self.heavy = heavy
        self.uncertain = uncertain
        self.always = always
        self._heavy_share = 0.0
        self._alpha = heavy_share_alpha

    @classmethod
    def always_local(cls) -> OffloadPolicy:
        return cls(always=Route.LOCAL)

    @classmethod
    def always_cloud(cls) -> OffloadPolicy:
        return cls(always=Route.CLOUD)

    @classmethod
    def budget(
        cls,
        budget: float,
        *,
        score: str | ScoreFn = "margin",
        heavy: HeavyCheck | None = None,
        **options: object,
    ) -> OffloadPolicy:
        """Offload the least confident ``budget`` share of requests (call ``calibrate``)."""
        check = UncertainCheck(score, budget=budget, **options)  # type: ignore[arg-type]
        return cls(heavy=heavy if heavy is not None else HeavyCheck(), uncertain=check)

    @classmethod
    def learned(
        cls,
        budget: float,
        router: LearnedScore,
        *,
        heavy: HeavyCheck | None = None,
        **options: object,
    ) -> OffloadPolicy:
        """Offload the ``budget`` share a trained router ranks highest (call ``calibrate``).

        ``router`` is a ``LearnedScore`` fitted on labelled rows the edge
        never trained on (``LearnedScore.fit``: the calibration split, and
        out-of-fold rows where there are some); the threshold is calibrated to
        the budget as for the built-in scores (a router with input features
        needs ``calibrate(outputs, inputs=...)``).
        """
        return cls.budget(budget, score=router, heavy=heavy, **options)

    @classmethod
    def threshold(cls, threshold: float, *, score: str | ScoreFn = "margin") -> OffloadPolicy:
        return cls(heavy=HeavyCheck(), uncertain=UncertainCheck(score, threshold=threshold))

    @property
    def wants_scores(self) -> bool:
        return self.uncertain is not None

    def calibrate(
        self,
        outputs: Iterable[Mapping[str, np.ndarray] | np.ndarray]
        | Mapping[str, np.ndarray]
        | np.ndarray,
        *,
        inputs: Mapping[str, np.ndarray] | None = None,
    ) -> float:
        if self.uncertain is None:
            raise ValueError("this policy has no uncertain check to calibrate")
        return self.uncertain.calibrate(outputs, inputs=inputs)

    def fixed_route(self, *, local_model: bool) -> Decision | None:
        """``before``'s decision when it does not depend on the request's facts, else None.

        Lets a caller skip building ``RequestFacts`` for always-local/always-cloud
        policies and for devices without a local model.
        """
        if self.always is Route.CLOUD:
            return _ALWAYS_CLOUD
        if not local_model:
            return _NO_LOCAL_MODEL
        if self.always is Route.LOCAL:
            return _ALWAYS_LOCAL
        return None

    def before(
        self, facts: RequestFacts, local: LatencyEstimator, network: NetworkEstimator
    ) -> Decision:
        """Route before any local compute: CLOUD here means 'do not run locally'."""
        fixed = self.fixed_route(local_model=facts.local_model)
        if fixed is not None:
            return fixed
        decision = self.heavy.check(facts, local, network) if self.heavy else None
        self._charge_heavy(decision is not None)
        return decision or _RUN_LOCAL

    def after(self, scores: np.ndarray | None) -> Decision:
        """Route after local compute, from the output's uncertainty scores.

        An ``always`` policy has decided in ``before``: this returns that same
        route, so a caller may skip the call (and the scores) for one.
        """
        if self.always is Route.LOCAL or self.uncertain is None or scores is None:
            return _ALWAYS_LOCAL if self.always else _RUN_LOCAL
        return self.uncertain.decide(scores)

    def _charge_heavy(self, heavy: bool) -> None:
        self._heavy_share += self._alpha * ((1.0 if heavy else 0.0) - self._heavy_share)
        check = self.uncertain
        if check is not None and check.budget is not None:
            rest = 1.0 - self._heavy_share
            check.set_effective_budget(
                (check.budget - self._heavy_share) / rest if rest > 0 else 0.0
            )
