"""One hub serving a language model over MQTT and HTTP, in a process of its own (bench part h).

``python -m bench._text_stream_server REPO BROKER PREFIX PORT DELAY_S READY`` runs
an embedded ``cloud_hub.Hub`` on ``REPO`` with its text front on ``BROKER``
(topics under ``PREFIX``, chunks coalesced with ``Coalescing(max_delay_s=DELAY_S)``,
the default sizes) and its OpenAI HTTP app on ``127.0.0.1:PORT``; writes the
file ``READY`` once both serve, and stops on SIGTERM. One engine answers both
paths, so the bench's two clients measure the transports, not two engines.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path


def main(argv: list[str]) -> int:
    from cloud_hub import Coalescing, Hub
    from cloud_hub.http import HttpServer, create_app
    from shared import MqttSettings, Topics

    repo, broker, prefix, port, delay_s, ready = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    hub = Hub(
        Path(repo), mqtt=MqttSettings.from_url(broker), topics=Topics(prefix),
        coalescing=Coalescing(max_delay_s=float(delay_s)), text_over_mqtt=True,
    )  # fmt: skip
    with hub, HttpServer(create_app(hub), port=int(port)):
        Path(ready).write_text("ready\n")
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
