"""``python -m bench [part ...]``: run parts (all by default), then render BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from ._env import hardware
from ._report import write_markdown, write_result

# CLI name -> module; each module has ``run() -> dict`` returning a result (see _report).
PARTS = {
    "collaboration": "bench.collaboration",  # (a)
    "round-trip": "bench.round_trip",  # (b)
    "hub-throughput": "bench.hub_throughput",  # (c)
    "grpc": "bench.grpc_vs_http",  # (c2): the hub's gRPC API against HTTP binary tensors
    "edge-overhead": "bench.edge_overhead",  # (d)
    "distribution": "bench.distribution",  # (e)
    "rollout-gates": "bench.rollout_gates",  # (f)
    "learning-loop": "bench.learning_loop",  # (g)
    "language-models": "bench.language_models",  # (h1): a cold build of the LLM pair, ~4 min
    "edge-generate": "bench.edge_generate",  # (h): EdgeAgent.generate vs og's loop, footprint
    "hub-generate": "bench.hub_generate",  # (h2): the hub's engine over HTTP, kept KV caches
    "text-hub-kills": "bench.text_hub_kills",  # (h): 100 turns, the hub SIGKILLed mid-stream
    "text-stream-tpot": "bench.text_stream_tpot",  # (h): MQTT vs HTTP SSE time per token
    "text-collab": "bench.text_collab",  # (i): a delayed link, cloud vs edge, the crossover
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "parts", nargs="*", metavar="part", help=f"parts to run (default: all): {', '.join(PARTS)}"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only re-render BENCHMARKS.md from the JSON files present",
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not args.report_only:
        for part in args.parts or list(PARTS):
            print(f"[bench] {part} ...", flush=True)
            start = time.perf_counter()
            result = importlib.import_module(PARTS[part]).run()
            result["part"] = part
            result["duration_s"] = round(time.perf_counter() - start, 1)
            result["hardware"] = hardware()
            path = write_result(result)
            verdicts = [t["met"] for t in result["targets"] if t["met"] is not None]
            print(
                f"[bench] {part}: {sum(verdicts)}/{len(verdicts)} targets met "
                f"in {result['duration_s']} s -> {path}",
                flush=True,
            )
    print(f"[bench] wrote {write_markdown()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
