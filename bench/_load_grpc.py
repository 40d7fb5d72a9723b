"""A closed-loop gRPC load generator, as cheap per request as ``bench._load.HttpLoad``.

``GrpcLoad``: N ``grpc.aio`` channels on one asyncio loop, each its own TCP
connection (a local subchannel pool: grpc would otherwise share one
connection among channels to the same target), each sending one prepared,
already serialized ``ModelInferRequest`` and awaiting the reply's bytes (no
protobuf work per request in the client). ``run(n, warm_s, window_s)``
returns a ``bench._load.Window`` like the other loaders.

``infer_request_bytes`` builds that request with the input in
``raw_input_contents``, as ``tritonclient.grpc`` sends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
from grpc import aio

from ._load import Window, WindowClock

__all__ = ["GrpcLoad", "infer_request_bytes"]

_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def infer_request_bytes(model: str, input_name: str, x: np.ndarray) -> bytes:
    from cloud_hub.grpc import inference_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[x.tobytes()])
    request.inputs.add(name=input_name, datatype="FP32", shape=x.shape)
    return request.SerializeToString()


class GrpcLoad:
    """N gRPC connections on one asyncio loop, calling ModelInfer with one prepared request."""

    def __init__(self, target: str, request: bytes) -> None:
        self.target = target
        self.request = request

    def run(self, n: int, warm_s: float, window_s: float) -> Window:
        return asyncio.run(self._run(n, warm_s, window_s))

    async def _run(self, n: int, warm_s: float, window_s: float) -> Window:
        window = Window(seconds=window_s)
        channels = [
            aio.insecure_channel(self.target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(n)
        ]
        try:
            await asyncio.gather(*(c.channel_ready() for c in channels))
            clock = WindowClock(warm_s, window_s)
            await asyncio.gather(*(self._requester(c, clock, window) for c in channels))
        finally:
            for channel in channels:
                await channel.close()
        return window

    async def _requester(self, channel: aio.Channel, clock: WindowClock, window: Window) -> None:
        call = channel.unary_unary(_METHOD)  # no (de)serializers: bytes in, bytes out
        now: Callable[[], float] = time.perf_counter
        while clock.running:
            t0 = now()
            try:
                await call(self.request, timeout=30.0)
                ok = True
            except aio.AioRpcError:
                ok = False
            t1 = now()
            window.record(clock, t0, t1, ok)
