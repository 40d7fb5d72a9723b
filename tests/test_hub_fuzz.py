"""Fuzz the hub's HTTP API from its own OpenAPI document (schemathesis).

Whatever a client sends (valid Open Inference Protocol bodies, or bodies and
parameters that break the schema), the hub answers 2xx or 4xx: a 500 is only
legitimate when an executor fails, and these models do not. The hub serves a
real ONNX classifier and an echo model of several datatypes, both quick.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from cloud_hub import CallableExecutor, Hub
from cloud_hub.http import HttpServer, create_app

from ._hub_http_kit import ECHO, echo
from ._models import write_linear_classifier

pytestmark = pytest.mark.slow

EXAMPLES = 15  # per operation and mode: the whole module stays well under a minute
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure reproduces
    suppress_health_check=list(HealthCheck),
    database=None,
)


@pytest.fixture(scope="module")
def fuzz_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("fuzz-repo")
    write_linear_classifier(root / "linear" / "1" / "model.onnx")
    (root / "linear" / "config.json").write_text(
        json.dumps({"max_batch_size": 8, "max_queue_delay_ms": 1})
    )
    with Hub(root) as hub:
        hub.add_model("echo", CallableExecutor(echo), config=ECHO)
        yield hub


@pytest.fixture(scope="module")
def hub_schema(fuzz_hub: Hub) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(fuzz_hub))


def operations(schema: Any) -> list[Any]:
    found = [result.ok() for result in schema.get_all_operations()]
    assert any(op.path.endswith("/infer") for op in found), [op.path for op in found]
    return found


def assert_no_server_error(case: Any) -> None:
    response = case.call()
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}\n"
        f"reproduce with: {case.as_curl_command()}"
    )


def fuzz(strategy: st.SearchStrategy[Any], mode: GenerationMode) -> None:
    @FUZZ_SETTINGS
    @given(case=strategy)
    def run(case: Any) -> None:
        assert_no_server_error(case)

    try:
        run()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise
        # An operation without parameters or body (GET /v2) has nothing to get wrong.


# Schemathesis's own pytest loader (``from_fixture``) does not run on pytest 9
# (it reads ``Function._nodeid``), so each operation's strategy is driven here.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_makes_the_hub_fail(hub_schema: Any, mode: GenerationMode) -> None:
    for operation in operations(hub_schema):
        fuzz(operation.as_strategy(generation_mode=mode), mode)


@pytest.mark.parametrize("model", ["linear", "echo"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_to_a_served_model_makes_the_hub_fail(
    hub_schema: Any, model: str, mode: GenerationMode
) -> None:
    # Random model names mostly meet a 404; these requests reach a real model.
    for operation in operations(hub_schema):
        if "{model_name}" not in operation.path:
            continue
        pinned = {"model_name": model}
        if "{model_version}" in operation.path:
            pinned["model_version"] = "1"
        fuzz(operation.as_strategy(generation_mode=mode, path_parameters=pinned), mode)


# -- bodies the schema cannot describe: tensors whose shape, datatype and data nearly fit ---------

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
)
ANYTHING = st.one_of(NUMBERS, st.text(max_size=4), st.none(), st.lists(NUMBERS, max_size=2))
FLOATS = st.floats(width=32, allow_nan=True, allow_infinity=True)
# What each served model takes: name -> (datatype, features per row, element strategy).
MODEL_INPUTS: dict[str, dict[str, tuple[str, int, st.SearchStrategy[Any]]]] = {
    "linear": {"x": ("FP32", 16, FLOATS)},
    "echo": {
        "text": ("BYTES", 2, st.text(max_size=6)),
        "flag": ("BOOL", 2, st.booleans()),
        "ids": ("INT64", 2, st.integers(-(2**63), 2**63 - 1)),
        "half": ("FP16", 2, st.floats(width=16)),
    },
}
MUTATIONS = ["none", "none", "none", "shape", "datatype", "data", "name", "drop", "extra"]


@st.composite
def infer_body(draw: st.DrawFn, model: str) -> dict[str, Any]:
    """A valid request for ``model``, then (most of the time) one thing wrong with it."""
    rows = draw(st.integers(1, 4))
    inputs = []
    for name, (datatype, width, element) in MODEL_INPUTS[model].items():
        inputs.append(
            {
                "name": name,
                "shape": [rows, width],
                "datatype": datatype,
                "data": draw(st.lists(element, min_size=rows * width, max_size=rows * width)),
            }
        )
    target = draw(st.sampled_from(inputs))
    mutation = draw(st.sampled_from(MUTATIONS))
    if mutation == "shape":
        target["shape"] = draw(st.lists(st.integers(-2, 2**40), max_size=5))
    elif mutation == "datatype":
        target["datatype"] = draw(st.sampled_from(["FP64", "INT8", "UINT64", "BF16", "x", ""]))
    elif mutation == "data":
        target["data"] = draw(st.one_of(ANYTHING, st.lists(ANYTHING, max_size=40)))
    elif mutation == "name":
        target["name"] = draw(st.text(max_size=8))
    elif mutation == "drop":
        inputs.remove(target)
    elif mutation == "extra":
        target["parameters"] = {"binary_data_size": draw(NUMBERS)}
    body: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        body["id"] = draw(st.text(max_size=8))
    if draw(st.booleans()):
        body["parameters"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "binary_data_output": st.one_of(st.booleans(), ANYTHING),
                    "timeout": st.one_of(st.integers(0, 10**7), ANYTHING),
                },
            )
        )
    if draw(st.booleans()):
        outputs = ["logits", "text_out", "flag_out", "ids_out", "half_out", "nope"]
        body["outputs"] = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(outputs)},
                    optional={"parameters": st.fixed_dictionaries({"binary_data": st.booleans()})},
                ),
                max_size=3,
            )
        )
    return body


@pytest.fixture(scope="module")
def http_client(fuzz_hub: Hub) -> Iterator[httpx.Client]:
    with (
        HttpServer(create_app(fuzz_hub), port=0) as server,
        httpx.Client(base_url=server.url, timeout=30.0) as client,
    ):
        yield client


@pytest.mark.parametrize("model", sorted(MODEL_INPUTS))
def test_nearly_valid_tensors_never_make_the_hub_fail(
    http_client: httpx.Client, model: str
) -> None:
    @settings(FUZZ_SETTINGS, max_examples=100)
    @given(body=infer_body(model))
    def run(body: dict[str, Any]) -> None:
        text = json.dumps(body)  # NaN and Infinity included, as Python clients send them
        response = http_client.post(
            f"/v2/models/{model}/infer", content=text, headers={"content-type": "application/json"}
        )
        status = response.status_code
        # A client that asks for a (tiny) timeout may get 504: its deadline, not a failure.
        asked_timeout = "timeout" in body.get("parameters", {})
        assert status < 500 or (status == 504 and asked_timeout), (text[:500], response.text)

    run()
