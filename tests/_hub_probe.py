"""Wait until a hub answers on a broker: any reply, even an error, proves it listens."""

from __future__ import annotations

import time

import numpy as np

from edge_agent import MqttUplink, UplinkError
from shared import MqttSettings, Topics, new_request_id

__all__ = ["wait_for_hub"]


def wait_for_hub(
    broker_url: str, topics: Topics, *, model: str, features: int, within_s: float = 30.0
) -> None:
    uplink = MqttUplink(MqttSettings.from_url(broker_url), device_id="hub-probe", topics=topics)
    uplink.start(wait_s=10.0)
    try:
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            try:
                future, _ = uplink.send(
                    model=model,
                    tensors={"x": np.zeros((1, features), np.float32)},
                    timeout_ms=1.0,
                    request_id=new_request_id(),
                )
                future.result(timeout=0.5)
                return
            except (TimeoutError, UplinkError):
                time.sleep(0.1)
    finally:
        uplink.stop()
    raise TimeoutError(f"no hub answered for model {model!r} within {within_s}s")
