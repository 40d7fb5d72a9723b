"""Digits through the learning loop's fleet, every answer recorded with its time and phase.

``Timeline`` is what the loop's plot and figures are made of: one
``Answer`` per request (when it was answered, in which phase, whether it was
right, whether it was offloaded, which edge version the device ran) and,
sampled every ``tick_s`` by a ``Timeline.watch`` thread, the fleet's
edge-cloud agreement counters as the devices count them (what their
telemetry reports and the rollout's agreement gate judges).

``stream`` sends images through the agents (one thread per device, as a
fleet answers concurrently) until all are answered; ``stream_until`` cycles
through them until an event is set (traffic while a rollout runs). A
failure on any device is raised, not hidden.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_agent import EdgeAgent, InferenceResult

__all__ = ["Answer", "Timeline", "stream", "stream_until"]


@dataclass(frozen=True, slots=True)
class Answer:
    t: float  # seconds since the timeline began
    phase: str
    correct: bool
    offloaded: bool
    edge: str  # the edge model the device ran: name@version


@dataclass
class Timeline:
    started: float = field(default_factory=time.perf_counter)
    answers: list[Answer] = field(default_factory=list)
    agreement: list[tuple[float, int, int]] = field(default_factory=list)  # (t, compared, agreed)
    phases: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.perf_counter() - self.started

    def record(self, phase: str, result: InferenceResult, label: int) -> None:
        answer = Answer(
            self.now(),
            phase,
            int(np.argmax(result.output)) == label,
            result.source.value != "edge",
            result.model_versions.get("edge", "none"),
        )
        with self._lock:
            self.answers.append(answer)

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def of(self, phase: str) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.phase == phase]

    def accuracy(self, phase: str) -> float:
        answers = self.of(phase)
        return sum(a.correct for a in answers) / len(answers) if answers else float("nan")

    def offload_rate(self, phase: str) -> float:
        answers = self.of(phase)
        return sum(a.offloaded for a in answers) / len(answers) if answers else float("nan")

    def watch(self, agents: Sequence[EdgeAgent], stop: threading.Event, tick_s: float) -> None:
        """Sample the fleet's agreement counters until ``stop`` (run it in a thread)."""
        while not stop.wait(tick_s):
            compared = agreed = 0
            for agent in agents:
                rate, n = agent.telemetry.agreement()
                compared += n
                agreed += round((rate or 0.0) * n)
            with self._lock:
                self.agreement.append((self.now(), compared, agreed))


class _Phase:
    """``with timeline.phase(name):`` marks when a phase began and ended."""

    def __init__(self, timeline: Timeline, name: str) -> None:
        self.timeline, self.name = timeline, name

    def __enter__(self) -> str:
        self.start = self.timeline.now()
        return self.name

    def __exit__(self, *exc: object) -> None:
        self.timeline.phases.append((self.name, self.start, self.timeline.now()))


def _run(
    agents: Sequence[EdgeAgent],
    next_item: Callable[[], tuple[np.ndarray, int] | None],
    timeline: Timeline,
    phase: str,
) -> None:
    errors: list[BaseException] = []

    def device(agent: EdgeAgent) -> None:
        while True:
            item = next_item()
            if item is None:
                return
            image, label = item
            try:
                timeline.record(phase, agent.infer(image), label)
            except BaseException as e:  # surfaced below; a demo must not hide a failure
                errors.append(e)
                return

    threads = [threading.Thread(target=device, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def stream(
    agents: Sequence[EdgeAgent],
    images: np.ndarray,
    labels: np.ndarray,
    timeline: Timeline,
    phase: str,
) -> None:
    """Every image once, each by whichever device is free."""
    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(images)):
        work.put(i)

    def next_item() -> tuple[np.ndarray, int] | None:
        try:
            i = work.get_nowait()
        except queue.Empty:
            return None
        return images[i : i + 1], int(labels[i])

    with timeline.phase(phase):
        _run(agents, next_item, timeline, phase)


def stream_until(
    agents: Sequence[EdgeAgent],
    images: np.ndarray,
    labels: np.ndarray,
    timeline: Timeline,
    phase: str,
    stop: threading.Event,
    pace_s: float = 0.0,
) -> None:
    """The images over and over until ``stop``; ``pace_s`` between a device's requests."""
    order = itertools.cycle(range(len(images)))
    lock = threading.Lock()

    def next_item() -> tuple[np.ndarray, int] | None:
        if stop.is_set():
            return None
        if pace_s:
            time.sleep(pace_s)
        with lock:
            i = next(order)
        return images[i : i + 1], int(labels[i])

    with timeline.phase(phase):
        _run(agents, next_item, timeline, phase)
