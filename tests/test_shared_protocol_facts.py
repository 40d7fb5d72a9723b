"""Protocol facts written once in shared/: CDN paths, tensor specs, reply timing, limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import (
    DIGEST_PATTERN,
    MAX_DOCUMENT_BYTES,
    CdnPaths,
    ConfigError,
    ErrorCode,
    Message,
    ReplyTiming,
    TensorError,
    TensorSpec,
    decode_message,
    encode_message,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4


# -- CDN paths ------------------------------------------------------------------------------


def test_paths_under_a_base_and_bare() -> None:
    cdn = CdnPaths("https://cdn.example/")
    assert cdn.base == "https://cdn.example"
    assert cdn.models() == "https://cdn.example/v1/models"
    assert cdn.manifest("mnist") == "https://cdn.example/v1/models/mnist/manifest"
    assert cdn.manifest("mnist", 3) == "https://cdn.example/v1/models/mnist/versions/3/manifest"
    assert cdn.blob(DIGEST) == f"https://cdn.example/v1/blobs/{DIGEST}"
    assert CdnPaths().assignment("cam-1", "mnist") == "/v1/devices/cam-1/assignments/mnist"
    assert CdnPaths().rollout_command("r 1", "pause") == "/v1/rollouts/r%201/pause"


def test_every_builder_matches_its_route_template() -> None:
    """The server routes on ROUTES; the clients build with the methods: they must agree."""
    paths = CdnPaths()
    built = {
        "models": paths.models(),
        "versions": paths.versions("m"),
        "latest_manifest": paths.manifest("m"),
        "manifest": paths.manifest("m", 2),
        "version": paths.version("m", 2),
        "blob": paths.blob(DIGEST),
        "devices": paths.devices(),
        "device": paths.device("d"),
        "assignment": paths.assignment("d", "m"),
        "rollouts": paths.rollouts(),
        "rollout": paths.rollout("r"),
        "rollout_command": paths.rollout_command("r", "abort"),
        "root": paths.root(2),
        "fleet_labels": paths.fleet_labels(),
    }
    # The console's routes are built by the console's own script (checked below).
    assert set(built) == {k for k in CdnPaths.ROUTES if not k.startswith("console")}
    values = {
        "name": "m",
        "version": "2",
        "digest": DIGEST,
        "device": "d",
        "model": "m",
        "rollout_id": "r",
        "command": "abort",
    }
    for key, template in CdnPaths.ROUTES.items():
        if key in built:
            assert template.format(**values) == built[key], key


def test_the_consoles_script_asks_for_the_consoles_api_routes() -> None:
    """console.js writes its API paths by hand; each must be a route the server has."""
    import re
    from importlib.resources import files

    script = files("model_cdn.console").joinpath("console.js").read_text()
    asked = set(re.findall(r"[\"`](/console/api/[^\"`]*)[\"`]", script))
    templates = [t for k, t in CdnPaths.ROUTES.items() if k.startswith("console_")]
    patterns = [
        re.compile("^" + re.sub(r"\\{\w+\\}", r"[^/]+", re.escape(t)) + "$") for t in templates
    ]
    assert asked
    for path in asked:
        concrete = re.sub(r"\$\{[^}]*\}", "x", path).split("?")[0]  # a query is not the route
        assert any(p.match(concrete) for p in patterns), path


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.manifest("../etc"),
        lambda p: p.manifest("m", 0),
        lambda p: p.manifest("m", True),
        lambda p: p.blob("sha256:" + "A" * 64),
        lambda p: p.blob("sha256:../../x"),
        lambda p: p.assignment("a/b", "m"),
        lambda p: p.rollout(""),
        lambda p: p.rollout_command("r", "delete"),
    ],
)
def test_paths_refuse_what_would_change_the_url(call: object) -> None:
    with pytest.raises(ConfigError):
        call(CdnPaths())  # type: ignore[operator]


def test_digest_pattern_and_document_limit() -> None:
    match = DIGEST_PATTERN.fullmatch(DIGEST)
    assert match is not None and match.group(1) == DIGEST[7:]
    assert DIGEST_PATTERN.fullmatch(DIGEST + "0") is None
    assert MAX_DOCUMENT_BYTES == 1024 * 1024


# -- tensor specs ---------------------------------------------------------------------------


def test_one_convention_for_free_dims() -> None:
    spec = TensorSpec.from_dims("image", "FP32", [-1, 28, 28])
    assert spec.shape == (None, 28, 28)
    assert spec.dims == (-1, 28, 28)
    assert spec == TensorSpec.from_dict(spec.to_dict())
    assert spec.to_dict()["shape"] == [None, 28, 28]
    assert spec.accepts((5, 28, 28)) and not spec.accepts((5, 28)) and not spec.accepts((1, 2, 28))
    assert spec.describe(batched=True) == "image: FP32[?, ?, 28, 28]"


@pytest.mark.parametrize(
    ("name", "datatype", "shape"),
    [
        ("", "FP32", (1,)),
        ("x" * 257, "FP32", (1,)),
        ("x", "FLOAT", (1,)),
        ("x", "FP32", (-1,)),
        ("x", "FP32", (True,)),
        ("x", "FP32", (1.0,)),
        ("x", "FP32", (1,) * 9),
        ("x", "FP32", "12"),
    ],
)
def test_tensor_spec_refuses_bad_fields(name: str, datatype: str, shape: object) -> None:
    with pytest.raises(TensorError):
        TensorSpec(name, datatype, shape)  # type: ignore[arg-type]


def test_from_dims_refuses_below_minus_one() -> None:
    with pytest.raises(TensorError):
        TensorSpec.from_dims("x", "FP32", [-2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 2**31)), max_size=8))
def test_tensor_spec_round_trips(shape: list[int | None]) -> None:
    spec = TensorSpec("t", "INT8", tuple(shape))
    assert TensorSpec.from_dict(spec.to_dict()) == spec
    assert TensorSpec.from_dims("t", "INT8", spec.dims) == spec


# -- reply timing ---------------------------------------------------------------------------


def test_reply_timing_travels_in_the_reply() -> None:
    request = Message(kind="request", request_id="r1", model="m", reply_to="t/dev/d/reply")
    timing = ReplyTiming(queue_ms=1.25, compute_ms=2.5, hub_ms=4.0, extra={"decode_ms": 0.1})
    reply = request.reply(timing=timing, error=ErrorCode.OK)
    back = decode_message(encode_message(reply))
    assert back.reply_timing == timing
    assert back.reply_timing.total_ms == 4.0


def test_reply_timing_from_an_old_hub_without_hub_ms() -> None:
    timing = ReplyTiming.from_dict({"queue_ms": 1.0, "compute_ms": 2.0})
    assert timing.hub_ms is None and timing.total_ms == 3.0
    assert ReplyTiming.from_dict({}).total_ms == 0.0
