"""The hub's KServe v2 gRPC API (Triton's ``GRPCInferenceService``), beside its HTTP one.

Serve an in-process hub over gRPC (its own thread and event loop)::

    from cloud_hub import Hub
    from cloud_hub.grpc import GrpcServer

    with Hub("models/") as hub, GrpcServer(hub, port=8001):
        hub.run_forever()

``tandem hub --grpc-port 8001`` serves it from every HTTP ingress process, on
their event loop, over the same executors, API keys, rate limits and size
limits as HTTP (``cloud_hub.plane``). Triton's ``tritonclient.grpc`` works
unchanged: ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata
ModelInfer (raw or typed tensor contents) and RepositoryIndex are served; the
other RPCs of Triton's service answer UNIMPLEMENTED. ``inference.proto`` is the subset we
serve (Triton's field numbers); ``inference_pb2*.py`` are protoc's output,
regenerated with ``python scripts/generate-grpc`` (``make grpc``). Importing
this package imports grpcio, protobuf and FastAPI (``cloud_hub.http``).
"""

from ._codec import CONTENTS_FIELD, decode_model_infer, encode_model_infer
from ._server import DEFAULT_GRPC_PORT, GrpcServer
from ._servicer import InferenceServicer

__all__ = [
    "CONTENTS_FIELD",
    "DEFAULT_GRPC_PORT",
    "GrpcServer",
    "InferenceServicer",
    "decode_model_infer",
    "encode_model_infer",
]
