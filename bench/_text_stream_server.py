"""One hub serving a language model over MQTT and HTTP, in a process of its own (bench part h).

``python -m bench._text_stream_server REPO BROKER PREFIX PORT DELAY_S READY ENGINE_LOG``
runs an embedded ``cloud_hub.Hub`` on ``REPO`` with its text front on ``BROKER``
(topics under ``PREFIX``, chunks coalesced with ``Coalescing(max_delay_s=DELAY_S)``,
the default sizes) and its OpenAI HTTP app on ``127.0.0.1:PORT``; writes the
file ``READY`` once both serve, and stops on SIGTERM. One engine answers both
paths, so the bench's two clients measure the transports, not two engines.

Each turn's own time per output token at the engine (its updates' times in
the engine's sink, before any transport) is appended to ``ENGINE_LOG`` as a
JSON line when the turn ends, in the order the turns end.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _time_engine(engine: Any, log: Path) -> None:
    """Wrap ``engine.submit`` so that each turn's TPOT at the engine goes to ``log``."""
    from ._text_audit import tpot_s

    submit = engine.submit
    lock = threading.Lock()

    def timed_submit(*args: Any, sink: Any, **kwargs: Any) -> Any:
        times: list[float] = []

        def timed(update: Any) -> None:
            if update.tokens:
                times.append(time.perf_counter())
            if update.finish is not None:
                n = update.completion_tokens
                row = {"tpot_s": tpot_s(times[0], times[-1], n) if times else None, "tokens": n}
                with lock, log.open("a") as out:
                    out.write(json.dumps(row) + "\n")
            sink(update)

        return submit(*args, sink=timed, **kwargs)

    engine.submit = timed_submit


def main(argv: list[str]) -> int:
    from cloud_hub import Coalescing, Hub
    from cloud_hub.http import HttpServer, create_app
    from shared import MqttSettings, Topics

    from ._text_plane import MODEL

    repo, broker, prefix, port, delay_s, ready, engine_log = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    hub = Hub(
        Path(repo), mqtt=MqttSettings.from_url(broker), topics=Topics(prefix),
        coalescing=Coalescing(max_delay_s=float(delay_s)), text_over_mqtt=True,
    )  # fmt: skip
    with hub, HttpServer(create_app(hub), port=int(port)):
        _time_engine(hub.language.get(MODEL).engine, Path(engine_log))
        Path(ready).write_text("ready\n")
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
