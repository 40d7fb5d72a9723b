"""``tandem models publish`` says what it will not do, instead of doing something else silently.

From a new user's first hour (issue 14): ``--sign-key`` was required but not
marked so in ``--help``; ``--format tflite`` ignored ``--quantize``; the
same bytes published again became a new version without a word. Each is
now a marked option or a one-line refusal, locally and through the CDN's
admin API, and the escape hatch (``--allow-same``) is there when wanted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_cdn import IdenticalModelError, PublishError, create_app, open_registry
from model_cdn.publish import publish_model
from shared import SigningKey
from shared.server.store import LocalBlobStore

from ._cdn import serve_in_thread
from ._cli import marked_required, one_error_line, tandem
from ._models import write_linear_classifier

TOKEN = "first-h0ur"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """Two float models, a key pair and samples, as a user has them."""
    assert tandem("keys", "generate", "--out", "keys", cwd=tmp_path).returncode == 0
    write_linear_classifier(tmp_path / "a.onnx", seed=0)
    write_linear_classifier(tmp_path / "b.onnx", seed=1)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.normal(size=(64, 16)).astype(np.float32))
    np.savez(tmp_path / "val.npz", inputs=rng.normal(size=(200, 16)).astype(np.float32))
    return tmp_path


def _publish(work: Path, model: str, *extra: str) -> list[str]:
    return [
        "models", "publish", model, "--name", "linear", "--sign-key", "keys/publisher.key",
        "--calibration", "calib.npy", "--validation", "val.npz", "--min-agreement", "0.9",
        *extra,
    ]  # fmt: skip


def _versions(registry_url: str) -> list[int]:
    registry = open_registry(registry_url, create=False)
    try:
        return [r.version for r in registry.list_versions("linear")]
    finally:
        registry.close()


@pytest.mark.parametrize("command", ["publish", "assign"])
def test_help_marks_sign_key_required(command: str, tmp_path: Path) -> None:
    result = tandem("models", command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert marked_required(result.stdout, "--sign-key")
    assert "TANDEM_SIGN_KEY" in result.stdout  # the other way to give it


def test_assign_help_says_the_key_is_the_assigners(tmp_path: Path) -> None:
    """Issue 21: assignments are signed by the assigner role, not the publisher's key."""
    result = tandem("models", "assign", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(line.strip("│ ") for line in result.stdout.splitlines())
    assert "The assigner's private key file" in text, result.stdout
    assert "publisher's private key" not in text, result.stdout


@pytest.mark.parametrize("method", ["int8-static", "int8-dynamic", "fp16"])
def test_tflite_with_a_quantize_mode_is_refused_not_ignored(
    method: str, work: Path, tmp_path: Path
) -> None:
    from ._tflite_models import linear_classifier_tflite

    (work / "a.tflite").write_bytes(linear_classifier_tflite(quantized=True))
    tflite = ("--format", "tflite", "--tflite-file", "a.tflite")
    refused = tandem(*_publish(work, "a.onnx", *tflite, "--quantize", method), cwd=work)
    one_error_line(refused, 2, f"--quantize {method}", "--format tflite")
    assert not (work / "tandem-cdn").exists()  # nothing published, nothing created
    with pytest.raises(PublishError, match="TFLite"):
        publish_model(
            work / "a.onnx",
            name="linear",
            signing_key=SigningKey.generate(),
            registry=open_registry(f"sqlite:///{tmp_path / 'lib.db'}"),
            store=LocalBlobStore(tmp_path / "lib-blobs"),
            format="tflite",
            tflite_file=work / "a.tflite",
            quantize=method,
        )


def test_tflite_without_quantize_publishes_the_file_as_converted(work: Path) -> None:
    from ._tflite_models import linear_classifier_tflite

    (work / "a.tflite").write_bytes(linear_classifier_tflite(quantized=True))
    for extra in ((), ("--quantize", "none")):
        args = _publish(work, "a.onnx", "--format", "tflite", "--tflite-file", "a.tflite")
        result = tandem(*args, *extra, "--allow-same", cwd=work)
        assert result.returncode == 0, result.stderr
    registry = open_registry(f"sqlite:///{work / 'tandem-cdn' / 'registry.db'}", create=False)
    try:
        signed = [r.manifest["signed"] for r in registry.list_versions("linear")]
    finally:
        registry.close()
    assert [s["format"] for s in signed] == ["tflite", "tflite"]
    assert {s["quantization"]["method"] for s in signed} == {"tflite-file"}


def test_the_same_model_again_is_refused_naming_the_version_it_repeats(work: Path) -> None:
    registry = f"sqlite:///{work / 'registry.db'}"
    local = ("--registry", registry, "--store", "blobs")
    assert tandem(*_publish(work, "a.onnx", *local), cwd=work).returncode == 0
    again = tandem(*_publish(work, "a.onnx", *local), cwd=work)
    one_error_line(again, 1, "linear@1", "--allow-same", "--quantize")
    assert tandem(*_publish(work, "b.onnx", *local), cwd=work).returncode == 0
    back = tandem(*_publish(work, "a.onnx", *local), cwd=work)  # not the latest: found anyway
    one_error_line(back, 1, "linear@1", "--allow-same")
    assert _versions(registry) == [1, 2]
    anyway = tandem(*_publish(work, "a.onnx", *local, "--allow-same"), cwd=work)
    assert anyway.returncode == 0, anyway.stderr
    assert _versions(registry) == [1, 2, 3]


def test_the_refusals_hint_builds_a_second_version_of_the_same_float_model(work: Path) -> None:
    """Issue 21: the README's rollout needs a v2, and a newcomer has one float model. The
    refusal's hint (another --quantize) must publish a real second version."""
    registry = f"sqlite:///{work / 'registry.db'}"
    local = ("--registry", registry, "--store", "blobs")
    assert tandem(*_publish(work, "a.onnx", *local), cwd=work).returncode == 0
    refused = tandem(*_publish(work, "a.onnx", *local), cwd=work)
    one_error_line(refused, 1, "--quantize, e.g. int8-dynamic", "--allow-same")
    hinted = tandem(*_publish(work, "a.onnx", *local, "--quantize", "int8-dynamic"), cwd=work)
    assert hinted.returncode == 0, hinted.stderr
    assert _versions(registry) == [1, 2]


@pytest.fixture
def cdn(work: Path) -> Iterator[str]:
    registry = open_registry(f"sqlite:///{work / 'cdn.db'}")
    app = create_app(registry=registry, store=LocalBlobStore(work / "cdn-blobs"), admin_token=TOKEN)
    try:
        with serve_in_thread(app) as url:
            yield url
    finally:
        registry.close()


def test_the_same_model_again_is_refused_through_the_admin_api_too(work: Path, cdn: str) -> None:
    remote = ("--cdn", cdn, "--token", TOKEN)
    for model in ("a.onnx", "b.onnx"):
        assert tandem(*_publish(work, model, *remote), cwd=work).returncode == 0
    for model, version in (("b.onnx", 2), ("a.onnx", 1)):
        refused = tandem(*_publish(work, model, *remote), cwd=work)
        one_error_line(refused, 1, f"linear@{version}", "--allow-same")
    assert _versions(f"sqlite:///{work / 'cdn.db'}") == [1, 2]


def test_the_library_raises_a_typed_error_with_the_version(work: Path) -> None:
    options = {
        "name": "linear",
        "signing_key": SigningKey.generate(),
        "registry": open_registry(f"sqlite:///{work / 'lib.db'}"),
        "store": LocalBlobStore(work / "lib-blobs"),
        "quantize": "none",
    }
    publish_model(work / "a.onnx", **options)
    with pytest.raises(IdenticalModelError) as same:
        publish_model(work / "a.onnx", **options)
    assert same.value.version == 1 and "allow_same" in str(same.value)
