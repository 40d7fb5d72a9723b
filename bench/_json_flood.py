"""Big JSON bodies against a hub's ``/infer``, from a process of their own, driven over stdin.

``python -m bench._json_flood PORT MODEL INPUT_NAME ELEMENTS CONCURRENCY``

builds one Open Inference Protocol JSON body with ``ELEMENTS`` random
numbers as a flat ``[1, ELEMENTS]`` FP32 tensor (about 15 MiB for 1.8
million: under the hub's 16 MiB JSON limit, and the wrong shape for any
image model, so the hub parses it whole and then answers 400), prints
``{"ready": true, "body_bytes": ...}`` and then obeys one command a line:

``burst``
    CONCURRENCY bodies at once, each on a fresh connection; prints the
    statuses and the seconds it took.
``flood SECONDS``
    CONCURRENCY connections each sending bodies back to back for SECONDS;
    prints how many were answered, by status.
``quit`` (or end of input)
    exits.

A process of its own so that building and sending 15 MiB bodies never
takes the GIL, or the CPU accounting, of the bench process that measures
MQTT latency meanwhile.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections import Counter

import numpy as np

__all__ = ["flood_body", "main"]

_TIMEOUT_S = 120.0


def flood_body(input_name: str, elements: int) -> bytes:
    """A valid OIP JSON request whose one tensor has the wrong shape for an image model."""
    data = np.random.default_rng(0).random(elements).round(6).tolist()
    doc = {
        "inputs": [{"name": input_name, "datatype": "FP32", "shape": [1, elements], "data": data}]
    }
    return json.dumps(doc, separators=(",", ":")).encode()


class _Sender:
    def __init__(self, port: int, model: str, body: bytes) -> None:
        self.port = port
        self.path = f"/v2/models/{model}/infer"
        self.body = body
        self.headers = {"Content-Type": "application/json"}

    def one(
        self, conn: http.client.HTTPConnection | None
    ) -> tuple[int, http.client.HTTPConnection | None]:
        """One body (on ``conn``, else a new connection); the connection to use next, if any."""
        for attempt in range(2):
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=_TIMEOUT_S)
            try:
                conn.request("POST", self.path, body=self.body, headers=self.headers)
                reply = conn.getresponse()
                reply.read()
                if reply.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
                return reply.status, conn
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def burst(self, concurrency: int) -> dict[str, object]:
        statuses: list[int] = []
        t0 = time.perf_counter()
        threads = [
            threading.Thread(target=lambda: statuses.append(self.one(None)[0]))
            for _ in range(concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"statuses": statuses, "seconds": time.perf_counter() - t0}

    def flood(self, concurrency: int, seconds: float) -> dict[str, object]:
        counts: Counter[int] = Counter()
        end = time.monotonic() + seconds
        lock = threading.Lock()

        def loop() -> None:
            conn: http.client.HTTPConnection | None = None
            while time.monotonic() < end:
                try:
                    status, conn = self.one(conn)
                except (OSError, http.client.HTTPException):
                    status, conn = 0, None  # 0: no answer at all
                with lock:
                    counts[status] += 1

        t0 = time.perf_counter()
        threads = [threading.Thread(target=loop) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {
            "answered": sum(counts.values()),
            "statuses": {str(k): v for k, v in counts.items()},
            "seconds": time.perf_counter() - t0,
        }


def main(argv: list[str]) -> None:
    port, model, input_name, elements, concurrency = argv
    body = flood_body(input_name, int(elements))
    sender = _Sender(int(port), model, body)
    print(json.dumps({"ready": True, "body_bytes": len(body)}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "burst":
            out = sender.burst(int(concurrency))
        elif command == "flood":
            out = sender.flood(int(concurrency), float(args[0]))
        elif command == "quit":
            return
        else:
            out = {"error": f"unknown command {command!r}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
