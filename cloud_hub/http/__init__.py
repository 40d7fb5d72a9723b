"""The hub's HTTP API: the Open Inference Protocol v2 (KServe / Triton) and ``/metrics``.

Serve a running hub over HTTP beside MQTT (both feed the same batchers)::

    from cloud_hub import Hub
    from cloud_hub.http import HttpServer, create_app

    with Hub("models/") as hub, HttpServer(create_app(hub), port=8000):
        hub.run_forever()

Any Open Inference Protocol client works unchanged, e.g. Triton's
``tritonclient.http.InferenceServerClient("127.0.0.1:8000")``, with JSON or
binary tensors. ``create_app`` builds the FastAPI app (routes, statuses and
limits in ``_app``), ``HttpServer`` runs it with uvicorn in a thread, and the
pure body codec (``decode_infer_request`` / ``encode_infer_response``) can be
used on its own. Importing this package imports FastAPI and uvicorn, which
``import cloud_hub`` alone does not.
"""

from ._app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_BYTES,
    SERVER_NAME,
    ServedHub,
    create_app,
    server_version,
)
from ._codec import (
    HEADER_LENGTH,
    InferRequest,
    RequestedOutput,
    check_requested_outputs,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from ._openai import TokenBudget
from ._server import HttpServer

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_JSON_BYTES",
    "HEADER_LENGTH",
    "SERVER_NAME",
    "HttpServer",
    "InferRequest",
    "RequestedOutput",
    "ServedHub",
    "TokenBudget",
    "check_requested_outputs",
    "create_app",
    "decode_infer_request",
    "encode_infer_response",
    "parse_header_length",
    "server_version",
]
