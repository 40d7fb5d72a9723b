"""How late timeout fallbacks end, and how soon offloading resumes once the hub is back.

``python -m bench.fallback_timing [--calls N] [--load K]`` (not a part of
BENCHMARKS.md: a check of two edge behaviours that issue 14 reported, run
before and after a change to compare):

1. **Fallback lateness.** The demo's INT8 edge model, a Mosquitto of its
   own and no hub: every offload times out and falls back to the local
   answer. Two policies: ``always_cloud`` (the local model has not run when
   the wait ends, so its time is reserved inside the deadline) and a
   threshold that offloads everything after the local run. Reported per
   case: how far past its deadline each call ended (p50, p99, max) and the
   share with ``deadline_met`` False. ``--load K`` runs K CPU-burning
   processes meanwhile, as a busy device (or a laptop running the hub too).
2. **Resume after a broker freeze.** A real hub (``python -m cloud_hub``)
   serving the demo's cloud model; one agent offloading at about 20 calls/s;
   the broker frozen (SIGSTOP) for ``--freeze-s`` seconds, then thawed; the
   time from the thaw to the first answer from the cloud.

Every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ._procs import BrokerProcess, HubProcess, write_model


def _burn(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x += 1


@contextlib.contextmanager
def cpu_load(processes: int, seconds: float) -> Iterator[None]:
    """``processes`` busy loops for at most ``seconds``; stopped (by PID) on exit."""
    ctx = multiprocessing.get_context("spawn")
    burners = [
        ctx.Process(target=_burn, args=(time.monotonic() + seconds,)) for _ in range(processes)
    ]
    for p in burners:
        p.start()
    try:
        yield
    finally:
        for p in burners:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
            p.join(10)


def lateness(broker_url: str, images: np.ndarray, calls: int, deadline_ms: float) -> list[str]:
    from edge_agent import EdgeAgent, OffloadPolicy, Source
    from tandem.demo.models import build_demo_models

    models = build_demo_models()
    rows = []
    for label, policy in (
        ("always_cloud (local not run yet)", OffloadPolicy.always_cloud()),
        ("uncertain (local ran first)", OffloadPolicy.threshold(-1.0)),
    ):
        # A breaker that never opens: every call must wait out its deadline.
        from edge_agent import CircuitBreaker

        breaker = CircuitBreaker(failure_threshold=10**9)
        with EdgeAgent(
            models.edge_int8_onnx,
            device_id=f"late-{len(rows)}",
            broker=broker_url,
            cloud_model="mnist",
            policy=policy,
            breaker=breaker,
        ) as agent:
            for image in images[:50]:  # warm the local estimate up
                agent.infer(image[None], deadline_ms=deadline_ms)
            over = []
            for i in range(calls):
                result = agent.infer(images[i % len(images)][None], deadline_ms=deadline_ms)
                assert result.source is Source.EDGE_FALLBACK, result.reason
                over.append(result.latency.total_ms - deadline_ms)
        o = np.array(over)
        rows.append(
            f"{label:34s} p50 {np.percentile(o, 50):+7.2f} ms  p99 {np.percentile(o, 99):+7.2f} ms"
            f"  max {o.max():+7.2f} ms  late {np.mean(o > 0):6.1%}"
        )
    return rows


def resume_after_freeze(workdir: Path, images: np.ndarray, freeze_s: float) -> str:
    from edge_agent import EdgeAgent, OffloadPolicy, Source
    from tandem.demo.models import HUB_MODEL_CONFIG, build_demo_models

    models = build_demo_models()
    repo = workdir / "repo"
    write_model(repo, "mnist", models.cloud_onnx, dict(HUB_MODEL_CONFIG))
    with BrokerProcess(workdir) as broker:
        broker.start()
        with HubProcess(repo, broker.url, workdir) as hub:
            hub.start()
            with EdgeAgent(
                models.edge_int8_onnx,
                device_id="freeze-1",
                broker=broker.url,
                cloud_model="mnist",
                policy=OffloadPolicy.always_cloud(),
            ) as agent:
                i = 0

                def call() -> Source:
                    nonlocal i
                    i += 1
                    source = agent.infer(images[i % len(images)][None], deadline_ms=100).source
                    time.sleep(0.05)  # about 20 calls/s: an app's pace, not a benchmark's
                    return source

                while call() is not Source.CLOUD:
                    pass
                os.kill(broker.pid, signal.SIGSTOP)
                try:
                    frozen_until = time.monotonic() + freeze_s
                    while time.monotonic() < frozen_until:
                        call()
                finally:
                    os.kill(broker.pid, signal.SIGCONT)
                thawed = time.monotonic()
                while call() is not Source.CLOUD and time.monotonic() - thawed < 120:
                    pass
                waited = time.monotonic() - thawed
    return f"first cloud answer {waited:.2f} s after a {freeze_s:g} s broker freeze ended"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fallback_timing", description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--deadline-ms", type=float, default=50.0)
    parser.add_argument("--load", type=int, default=0, help="CPU-burning processes meanwhile")
    parser.add_argument("--freeze-s", type=float, default=10.0)
    parser.add_argument("--skip-freeze", action="store_true")
    args = parser.parse_args(argv)
    from tandem.demo.data import load_digit_splits

    images = np.ascontiguousarray(load_digit_splits().test_images)
    with tempfile.TemporaryDirectory(prefix="tandem-fallback-") as tmp:
        work = Path(tmp)
        with BrokerProcess(work) as broker:
            broker.start()
            seconds = args.calls * args.deadline_ms / 1000.0 * 3 + 60
            with cpu_load(args.load, seconds):
                print(f"fallback lateness, deadline {args.deadline_ms:g} ms, load {args.load}:")
                for row in lateness(broker.url, images, args.calls, args.deadline_ms):
                    print("  " + row, flush=True)
        if not args.skip_freeze:
            print("  " + resume_after_freeze(work, images, args.freeze_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
