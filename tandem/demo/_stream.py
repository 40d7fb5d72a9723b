"""The test digits through a fleet of edge agents, and what came back, per mode.

``stream`` hands the images to the agents from a shared queue, one thread per
agent (devices answer concurrently, as a fleet does), and returns the
results in input order; ``summarize`` turns them into a :class:`ModeResult`.
A failure on any device is raised after the threads end, not hidden.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edge_agent import EdgeAgent, InferenceResult

__all__ = ["ModeResult", "stream", "summarize"]


@dataclass
class ModeResult:
    name: str
    accuracy: float
    offload_rate: float  # share of requests sent to the cloud (answered or not)
    p50_ms: float
    p99_ms: float
    sources: Counter[str] = field(default_factory=Counter)
    fallbacks: int = 0
    deadline_misses: int = 0
    edge_versions: Counter[str] = field(default_factory=Counter)  # "mnist-edge@1" -> requests

    def to_dict(self) -> dict[str, object]:
        d = {k: v for k, v in vars(self).items() if not isinstance(v, Counter)}
        return d | {"sources": dict(self.sources), "edge_versions": dict(self.edge_versions)}


def stream(
    agents: list[EdgeAgent], images: np.ndarray, progress: Callable[[float], None]
) -> list[InferenceResult]:
    """Send every image through the fleet, one request per image; results in input order."""
    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(images)):
        work.put(i)
    results: list[InferenceResult | None] = [None] * len(images)
    errors: list[BaseException] = []
    done = [0]
    lock = threading.Lock()

    def device(agent: EdgeAgent) -> None:
        while True:
            try:
                i = work.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = agent.infer(images[i : i + 1])
            except BaseException as e:  # surfaced below; a demo must not hide a failure
                errors.append(e)
                return
            with lock:
                done[0] += 1
                if done[0] % 25 == 0 or done[0] == len(images):
                    progress(done[0] / len(images))

    threads = [threading.Thread(target=device, args=(a,), daemon=True) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def summarize(name: str, results: list[InferenceResult], labels: np.ndarray) -> ModeResult:
    predictions = np.array([int(np.argmax(r.output)) for r in results])
    latencies = np.array([r.latency.total_ms for r in results])
    sources = Counter(r.source.value for r in results)
    offloaded = sum(1 for r in results if r.source.value != "edge")
    return ModeResult(
        name=name,
        accuracy=float((predictions == labels).mean()),
        offload_rate=offloaded / len(results),
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        sources=sources,
        fallbacks=sources.get("edge-fallback", 0),
        deadline_misses=sum(not r.deadline_met for r in results),
        edge_versions=Counter(r.model_versions.get("edge", "none") for r in results),
    )
