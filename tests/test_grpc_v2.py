"""The hub's KServe v2 gRPC API with Triton's own ``tritonclient.grpc``, unchanged, against
real servers on loopback: an in-process hub (real ONNX Runtime, real grpc.aio server in
its thread) and the multi-process hub (supervisor, HTTP ingress serving gRPC, executor
processes). Answers are compared with the HTTP API's for the same input, not with
numbers written here. Also: our .proto's field numbers and types are Triton's, and the
checked-in generated modules are what protoc makes of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import Descriptor

from cloud_hub import Hub
from cloud_hub.grpc import GrpcServer, decode_model_infer, encode_model_infer
from cloud_hub.grpc import inference_pb2 as pb
from cloud_hub.grpc import inference_pb2_grpc as pb_grpc
from cloud_hub.http import HttpServer, create_app
from shared import Limits
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key

from ._brokers import free_port
from ._hub_http_kit import WAIT_S, metric, rows
from ._hub_http_kit import hub_fixture as hub_fixture
from ._plane import expected_logits, linear_repo, running_hub

tritongrpc = pytest.importorskip("tritonclient.grpc")  # dev dependencies: the test oracles
tritonhttp = pytest.importorskip("tritonclient.http")
triton_pb = pytest.importorskip("tritonclient.grpc.service_pb2")

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


# -- the protocol files ------------------------------------------------------------------------


def _messages(descriptor: Descriptor) -> Iterator[Descriptor]:
    yield descriptor
    for nested in descriptor.nested_types:
        yield from _messages(nested)


def test_every_field_we_define_has_tritons_number_and_type() -> None:
    theirs = triton_pb.DESCRIPTOR
    checked = 0
    for top in pb.DESCRIPTOR.message_types_by_name.values():
        for ours in _messages(top):
            their = theirs.pool.FindMessageTypeByName(ours.full_name)
            for field in ours.fields:
                other = their.fields_by_name.get(field.name)
                assert other is not None, f"Triton's {ours.full_name} has no {field.name}"
                where = f"{ours.full_name}.{field.name}"
                assert field.number == other.number, where
                assert field.type == other.type, where
                assert field.is_repeated == other.is_repeated, where
                assert (field.message_type and field.message_type.full_name) == (
                    other.message_type and other.message_type.full_name
                ), where
                assert (field.containing_oneof and field.containing_oneof.name) == (
                    other.containing_oneof and other.containing_oneof.name
                ), where
                checked += 1
    assert checked > 50
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    their_service = theirs.services_by_name["GRPCInferenceService"]
    assert service.full_name == their_service.full_name  # the RPC paths clients call
    for method in service.methods:
        other = their_service.methods_by_name[method.name]
        assert method.input_type.full_name == other.input_type.full_name
        assert method.output_type.full_name == other.output_type.full_name


def test_the_checked_in_modules_are_what_the_proto_generates(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    script = ROOT / "scripts" / "generate-grpc"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=120)
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        assert fresh == (ROOT / "cloud_hub" / "grpc" / name).read_text(), (
            f"cloud_hub/grpc/{name} is stale: run python scripts/generate-grpc"
        )


# -- the codec alone ---------------------------------------------------------------------------


def _typed_request(datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(
        name="x", datatype=datatype, shape=shape, contents=pb.InferTensorContents(**contents)
    )
    return request


def test_typed_contents_decode_to_their_datatype() -> None:
    decoded = decode_model_infer(_typed_request("INT8", [2, 2], int_contents=[1, -2, 3, 127]),
                                 limits=Limits())  # fmt: skip
    x = decoded.inputs["x"]
    assert x.dtype == np.int8 and x.shape == (2, 2)
    assert x.tolist() == [[1, -2], [3, 127]]


@pytest.mark.parametrize(
    ("request_", "says"),
    [
        (_typed_request("INT8", [1], int_contents=[300]), "does not fit INT8"),
        (_typed_request("FP32", [3], fp32_contents=[1.0, 2.0]), "holds 3 elements"),
        (_typed_request("FP32", [1], int_contents=[1]), "goes in contents.fp32_contents"),
        (_typed_request("FP16", [1], fp32_contents=[1.0]), "raw_input_contents only"),
        (_typed_request("FP99", [1], fp32_contents=[1.0]), "unknown datatype"),
    ],
)
def test_typed_contents_that_do_not_fit_are_refused(
    request_: pb.ModelInferRequest, says: str
) -> None:
    from cloud_hub import HubError

    with pytest.raises(HubError, match=says):
        decode_model_infer(request_, limits=Limits())


def test_raw_contents_must_be_one_per_input_and_add_up() -> None:
    from shared import TandemError

    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 8, b""])
    request.inputs.add(name="x", datatype="FP32", shape=[2])
    with pytest.raises(TandemError, match="2 entries for 1 inputs"):
        decode_model_infer(request, limits=Limits())
    del request.raw_input_contents[1]
    request.raw_input_contents[0] = b"\0" * 7
    with pytest.raises(TandemError):
        decode_model_infer(request, limits=Limits())


def test_a_response_carries_each_output_raw_in_the_requested_order() -> None:
    outputs = {"a": np.arange(3, dtype=np.int64), "b": np.array([[1.5]], dtype=np.float32)}
    response = encode_model_infer(outputs, model="m", version="1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("a", "INT64", [3]),
        ("b", "FP32", [1, 1]),
    ]
    assert response.raw_output_contents[0] == outputs["a"].tobytes()
    assert response.raw_output_contents[1] == outputs["b"].tobytes()


def test_the_deadline_is_the_earlier_of_the_timeout_parameter_and_the_calls() -> None:
    from cloud_hub.grpc._servicer import _deadline

    assert _deadline(10.0, None, None) is None
    assert _deadline(10.0, 200_000, None) == pytest.approx(10.2)  # Triton's µs parameter
    assert _deadline(10.0, None, 0.5) == pytest.approx(10.5)  # the call's remaining time
    assert _deadline(10.0, 2_000_000, 0.5) == pytest.approx(10.5)
    assert _deadline(10.0, 100_000, 0.5) == pytest.approx(10.1)


# -- an in-process hub served over gRPC and HTTP -----------------------------------------------


@pytest.fixture(scope="module")
def servers(hub: Hub) -> Iterator[tuple[str, str]]:
    """(gRPC target, HTTP host:port) of the same hub."""
    with GrpcServer(hub, port=0) as grpc_server, HttpServer(create_app(hub), port=0) as http:
        yield grpc_server.target, http.url.removeprefix("http://")


@pytest.fixture
def client(servers: tuple[str, str]) -> Iterator[Any]:
    triton = tritongrpc.InferenceServerClient(servers[0])
    yield triton
    triton.close()


def _input(name: str, array: np.ndarray, datatype: str, module: Any = tritongrpc) -> Any:
    tensor = module.InferInput(name, list(array.shape), datatype)
    if module is tritonhttp:
        tensor.set_data_from_numpy(array, binary_data=True)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def _status(error: BaseException) -> str:
    return str(error.status())  # type: ignore[attr-defined]


def test_health_metadata_and_readiness(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("linear")
    assert client.is_model_ready("linear", "1")
    assert not client.is_model_ready("no-such-model")
    metadata = client.get_model_metadata("linear", as_json=True)
    assert metadata["name"] == "linear" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "16"]}]
    assert client.get_server_metadata(as_json=True)["name"] == "tandem-hub"


def test_fp32_raw_contents_answer_what_http_binary_answers(
    client: Any, servers: tuple[str, str]
) -> None:
    x = rows(3, seed=7)
    over_grpc = client.infer("linear", [_input("x", x, "FP32")], request_id="r-1")
    http = tritonhttp.InferenceServerClient(servers[1])
    try:
        over_http = http.infer("linear", [_input("x", x, "FP32", tritonhttp)])
    finally:
        http.close()
    assert over_grpc.get_response().id == "r-1"
    logits = over_grpc.as_numpy("logits")
    assert logits.dtype == np.float32 and logits.shape[0] == 3
    np.testing.assert_array_equal(logits, over_http.as_numpy("logits"))


def test_grpc_answers_are_counted_under_their_own_transport(client: Any, hub: Hub) -> None:
    def counted() -> float:
        text = hub.prometheus.render().decode()
        return metric(text, "tandem_inference_request_success_total", model="linear",
                      transport="grpc")  # fmt: skip

    before = counted()
    client.infer("linear", [_input("x", rows(2), "FP32")])
    assert counted() == before + 1


def test_int_bool_and_bytes_tensors_come_back_as_sent(client: Any) -> None:
    inputs = {
        "ids": (np.array([[2**40, -5]], dtype=np.int64), "INT64"),
        "flag": (np.array([[True, False]]), "BOOL"),
        "text": (np.array([[b"caf\xc3\xa9", b""]], dtype=object), "BYTES"),
        "half": (np.array([[0.5, -2.0]], dtype=np.float16), "FP16"),
    }
    result = client.infer("echo", [_input(n, a, t) for n, (a, t) in inputs.items()])
    for name, (array, _) in inputs.items():
        got = result.as_numpy(f"{name}_out")
        assert got.shape == array.shape
        assert got.tolist() == array.tolist(), name


def test_typed_contents_answer_what_raw_contents_answer(
    client: Any, servers: tuple[str, str]
) -> None:
    x = rows(2, seed=3)
    raw = client.infer("linear", [_input("x", x, "FP32")]).as_numpy("logits")
    request = pb.ModelInferRequest(model_name="linear")
    contents = pb.InferTensorContents(fp32_contents=x.ravel().tolist())
    request.inputs.add(name="x", datatype="FP32", shape=x.shape, contents=contents)
    request.outputs.add(name="logits")
    with grpc.insecure_channel(servers[0]) as channel:
        response = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=WAIT_S)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("logits", "FP32", list(raw.shape))
    typed = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(raw.shape)
    np.testing.assert_array_equal(typed, raw)


def test_a_bad_shape_is_invalid_argument(client: Any) -> None:
    wrong = np.zeros((1, 15), dtype=np.float32)
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        client.infer("linear", [_input("x", wrong, "FP32")])
    assert _status(caught.value) == "StatusCode.INVALID_ARGUMENT"
    assert "\n" not in caught.value.message()


def test_an_unknown_model_is_not_found(client: Any) -> None:
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        client.infer("no-such-model", [_input("x", rows(1), "FP32")])
    assert _status(caught.value) == "StatusCode.NOT_FOUND"
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        client.get_model_metadata("no-such-model")
    assert _status(caught.value) == "StatusCode.NOT_FOUND"


def test_an_unknown_requested_output_is_invalid_argument(client: Any) -> None:
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        client.infer("linear", [_input("x", rows(1), "FP32")],
                     outputs=[tritongrpc.InferRequestedOutput("nope")])  # fmt: skip
    assert _status(caught.value) == "StatusCode.INVALID_ARGUMENT"


def test_the_repository_index_is_https(client: Any, servers: tuple[str, str]) -> None:
    http = tritonhttp.InferenceServerClient(servers[1])
    try:
        over_http = http.get_model_repository_index()
    finally:
        http.close()
    over_grpc = client.get_model_repository_index(as_json=True)["models"]
    assert len(over_grpc) == len(over_http) >= 3
    for ours, theirs in zip(over_grpc, over_http, strict=True):
        assert ours == {k: v for k, v in theirs.items() if v}  # proto3 JSON leaves out ""


def test_rpcs_we_do_not_serve_are_unimplemented(client: Any) -> None:
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        client.get_model_config("linear")
    assert _status(caught.value) == "StatusCode.UNIMPLEMENTED"


def test_a_message_above_the_size_limit_is_refused(hub: Hub) -> None:
    with GrpcServer(hub, port=0, max_message_bytes=300) as small:
        triton = tritongrpc.InferenceServerClient(small.target)
        try:
            fits = triton.infer("linear", [_input("x", rows(1), "FP32")])  # 64 bytes of tensor
            assert fits.as_numpy("logits").shape[0] == 1
            with pytest.raises(tritongrpc.InferenceServerException) as caught:
                triton.infer("linear", [_input("x", rows(8), "FP32")])  # 512: a model's size
            assert _status(caught.value) == "StatusCode.RESOURCE_EXHAUSTED"
            assert "larger than max" in caught.value.message()  # gRPC's refusal, not ours
        finally:
            triton.close()


def test_requests_held_at_once_share_a_byte_budget(hub: Hub) -> None:
    from cloud_hub.http._bodies import ByteBudget

    budget = ByteBudget(4096)
    with GrpcServer(hub, port=0, budget=budget) as server:
        triton = tritongrpc.InferenceServerClient(server.target)
        try:
            assert triton.infer("linear", [_input("x", rows(8), "FP32")]).as_numpy("logits").size
            with pytest.raises(tritongrpc.InferenceServerException) as caught:
                triton.infer("linear", [_input("x", rows(64), "FP32")])  # 4 KiB of tensor
            assert _status(caught.value) == "StatusCode.UNAVAILABLE"
            assert budget.held == 0  # answered or refused, every lease is given back
            assert triton.infer("linear", [_input("x", rows(8), "FP32")]).as_numpy("logits").size
        finally:
            triton.close()


# -- API keys ------------------------------------------------------------------------------


class _Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def _key(keys_file: Path, *scopes: str, burst: int = 100) -> str:
    text, key = generate_api_key(scopes, name="test", rate=1.0, burst=burst)
    ApiKeyFile(keys_file).add(key)
    return text


@pytest.fixture
def secured(hub: Hub, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    keys_file = tmp_path / "api-keys.json"
    ApiKeyFile(keys_file).add(generate_api_key(["infer"])[1])  # a file with a stranger
    guard = ApiKeyGuard(ApiKeyFile(keys_file).keys, clock=_Clock())  # no refill: time stands
    with GrpcServer(hub, port=0, api_keys=guard) as server:
        triton = tritongrpc.InferenceServerClient(server.target)
        yield triton, keys_file
        triton.close()


def _infer_status(triton: Any, headers: dict[str, str] | None) -> str:
    try:
        triton.infer("linear", [_input("x", rows(1), "FP32")], headers=headers)
    except tritongrpc.InferenceServerException as e:
        return _status(e)
    return "OK"


def test_without_a_valid_key_model_rpcs_are_unauthenticated(secured: tuple[Any, Path]) -> None:
    triton, keys_file = secured
    assert triton.is_server_live() and triton.is_server_ready()  # the probes stay open
    assert _infer_status(triton, None) == "StatusCode.UNAUTHENTICATED"
    assert _infer_status(triton, {"authorization": "Basic abc"}) == "StatusCode.UNAUTHENTICATED"
    forged = _key(keys_file, "infer")[:-4] + "AAAA"
    assert _infer_status(triton, {"authorization": f"Bearer {forged}"}) == (
        "StatusCode.UNAUTHENTICATED"
    )
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        triton.get_model_metadata("linear")
    assert _status(caught.value) == "StatusCode.UNAUTHENTICATED"


def test_a_key_needs_the_scope_and_its_rate(secured: tuple[Any, Path]) -> None:
    triton, keys_file = secured
    reader = {"authorization": f"Bearer {_key(keys_file, 'models:read')}"}
    assert triton.get_model_metadata("linear", headers=reader, as_json=True)["name"] == "linear"
    assert _infer_status(triton, reader) == "StatusCode.PERMISSION_DENIED"
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        triton.get_model_repository_index(headers=reader)  # rollout:admin only
    assert _status(caught.value) == "StatusCode.PERMISSION_DENIED"
    admin = {"authorization": f"Bearer {_key(keys_file, 'rollout:admin')}"}
    assert triton.get_model_repository_index(headers=admin, as_json=True)["models"]
    inferer = {"authorization": f"Bearer {_key(keys_file, 'infer', burst=2)}"}
    assert [_infer_status(triton, inferer) for _ in range(3)] == [
        "OK", "OK", "StatusCode.RESOURCE_EXHAUSTED",
    ]  # fmt: skip


# -- the multi-process hub -----------------------------------------------------------------


@pytest.mark.slow
def test_the_process_plane_serves_grpc_from_its_http_ingress(tmp_path: Path) -> None:
    repo = linear_repo(tmp_path / "repo")
    http_port, grpc_port = free_port(), free_port()
    with running_hub(repo, None, mqtt=0, http_port=http_port, http=2, grpc_port=grpc_port):
        triton = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            assert triton.is_server_live()
            from ._plane import wait_until

            wait_until(triton.is_server_ready, what="the hub ready over gRPC")
            assert triton.is_model_ready("linear")
            rng = np.random.default_rng(11)
            for n in (1, 3, 8):
                x = rng.normal(size=(n, 16)).astype(np.float32)
                got = triton.infer("linear", [_input("x", x, "FP32")]).as_numpy("logits")
                np.testing.assert_allclose(got, expected_logits(x), rtol=1e-5, atol=1e-5)
            with pytest.raises(tritongrpc.InferenceServerException) as caught:
                triton.infer("linear", [_input("x", np.zeros((1, 3), np.float32), "FP32")])
            assert _status(caught.value) == "StatusCode.INVALID_ARGUMENT"
        finally:
            triton.close()


def test_grpc_port_needs_the_http_ingress_and_a_port_of_its_own() -> None:
    from cloud_hub.plane import check_options

    def problem(**ports: int) -> tuple[str, str] | None:
        return check_options(log_level="info", log_format="text", workers=1, no_share=False,
                             **ports)  # type: ignore[arg-type]  # fmt: skip

    assert problem(http_port=8000, grpc_port=8001) is None
    assert problem(http_port=8000, grpc_port=0) is None
    assert problem(http_port=0, grpc_port=8001) == (
        "--grpc-port", "gRPC is served by the HTTP ingress processes: give --http-port too",
    )  # fmt: skip
    assert problem(http_port=8000, grpc_port=8000)[0] == "--grpc-port"  # type: ignore[index]
    assert problem(http_port=8000, grpc_port=70000)[0] == "--grpc-port"  # type: ignore[index]


def test_grpc_over_tls_with_the_hubs_certificate(hub: Hub, tmp_path: Path) -> None:
    from shared import TlsSettings

    from ._pki import make_pki

    pki = make_pki(tmp_path)
    tls = TlsSettings(certfile=str(pki.server_cert), keyfile=str(pki.server_key))
    with GrpcServer(hub, port=0, tls=tls) as server:
        secure = tritongrpc.InferenceServerClient(
            server.target, ssl=True, root_certificates=str(pki.ca)
        )
        plain = tritongrpc.InferenceServerClient(server.target)
        try:
            got = secure.infer("linear", [_input("x", rows(2), "FP32")]).as_numpy("logits")
            assert got.shape[0] == 2
            with pytest.raises(tritongrpc.InferenceServerException) as caught:
                plain.infer("linear", [_input("x", rows(2), "FP32")], client_timeout=10)
            assert _status(caught.value) in (
                "StatusCode.UNAVAILABLE",
                "StatusCode.DEADLINE_EXCEEDED",
            )
        finally:
            secure.close()
            plain.close()


@pytest.mark.slow
def test_tandem_hub_serves_grpc_behind_its_api_keys(tmp_path: Path, mosquitto: Any) -> None:
    from ._hub_process import tandem_hub

    repo = linear_repo(tmp_path / "repo")
    keys_file = tmp_path / "api-keys.json"
    key = _key(keys_file, "infer")
    http_port, grpc_port = free_port(), free_port()
    extra = ("--grpc-port", str(grpc_port), "--api-keys", str(keys_file), "--workers", "1")
    with tandem_hub(repo, mosquitto.url, http_port, tmp_path / "hub.log", *extra):
        triton = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            x = rows(3, seed=5)
            answer = triton.infer("linear", [_input("x", x, "FP32")],
                                  headers={"authorization": f"Bearer {key}"})  # fmt: skip
            np.testing.assert_allclose(answer.as_numpy("logits"), expected_logits(x),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
            assert _infer_status(triton, None) == "StatusCode.UNAUTHENTICATED"
        finally:
            triton.close()


def test_the_benchs_grpc_load_gets_answers_and_counts_refusals(servers: tuple[str, str]) -> None:
    from bench._load_grpc import GrpcLoad, infer_request_bytes

    good = GrpcLoad(servers[0], infer_request_bytes("linear", "x", rows(1))).run(2, 0.0, 0.3)
    assert good.answered > 0 and good.errors == 0
    bad = GrpcLoad(servers[0], infer_request_bytes("no-such-model", "x", rows(1))).run(1, 0.0, 0.3)
    assert bad.answered == 0 and bad.errors > 0
