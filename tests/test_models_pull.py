"""``tandem models pull NAME[@VERSION] --out FILE``: a published model, verified, as a plain file.

What a user with a plain device needs after publishing (issue 14): the model
file ``EdgeAgent("model.onnx")`` loads. Pulled from the registry and store
the publish wrote, or from a running CDN over HTTP; written only once the
manifest's signature, expiry, name, version and digests check out, and
whole. Every failure is one line, and leaves no file (nor a changed one).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent import EdgeAgent, OffloadPolicy, Source
from model_cdn import (
    PullError,
    RegistrySource,
    create_app,
    open_registry,
    pull_model,
)
from model_cdn.publish import publish_model
from shared import ExpiredError, SigningKey, decompress_blob
from shared.server.store import LocalBlobStore

from ._cdn import serve_in_thread
from ._cli import marked_required, one_error_line, tandem
from ._models import write_linear_classifier


@dataclass(frozen=True)
class Published:
    """Two versions of ``linear`` in a registry and store under ``root``, and their files."""

    root: Path
    key: SigningKey
    floats: dict[int, Path]  # version -> the float model it was published from
    raw: dict[int, bytes]  # version -> the model file devices get

    @property
    def registry_url(self) -> str:
        return f"sqlite:///{self.root / 'registry.db'}"

    def local(self, *args: str) -> list[str]:
        return [*args, "--registry", self.registry_url, "--store", str(self.root / "blobs")]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    root = tmp_path_factory.mktemp("pull")
    key = SigningKey.generate()
    (root / "publisher.pub").write_text(key.public_key.to_text())
    registry = open_registry(f"sqlite:///{root / 'registry.db'}")
    store = LocalBlobStore(root / "blobs")
    inputs = np.random.default_rng(3).normal(size=(200, 16)).astype(np.float32)
    floats, raw = {}, {}
    try:
        for version, seed in ((1, 0), (2, 1)):
            floats[version] = write_linear_classifier(root / f"v{version}.onnx", seed=seed)
            result = publish_model(
                floats[version],
                name="linear",
                signing_key=key,
                registry=registry,
                store=store,
                calibration=inputs,
                validation=(inputs, None),
                min_agreement=0.9,
            )
            blob = result.manifest.blob
            raw[version] = decompress_blob(store.get(blob.digest), blob.raw_size)
    finally:
        registry.close()
    return Published(root, key, floats, raw)


def _float_outputs(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["logits"], {"x": x})[0])


def test_the_pulled_file_is_the_published_model_and_an_edge_agent_runs_it(
    published: Published, tmp_path: Path
) -> None:
    pub = str(published.root / "publisher.pub")
    result = tandem(
        *published.local("models", "pull", "linear", "--out", "linear.onnx", "--trusted-key", pub),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "linear@2" in result.stdout and "checked" in result.stdout
    assert (tmp_path / "linear.onnx").read_bytes() == published.raw[2]
    assert [p.name for p in tmp_path.iterdir()] == ["linear.onnx"]  # no temporary left
    x = np.random.default_rng(9).normal(size=(1, 16)).astype(np.float32)
    policy = OffloadPolicy.always_local()
    with EdgeAgent(tmp_path / "linear.onnx", device_id="plain-1", policy=policy) as agent:
        answer = agent.infer(x)
    assert answer.source is Source.EDGE
    want = _float_outputs(published.floats[2], x)
    assert int(np.argmax(answer.output)) == int(np.argmax(want))  # INT8 of the float model
    np.testing.assert_allclose(answer.output, want, atol=0.1 * float(np.abs(want).max()))


def test_pull_from_a_cdn_over_http_pinned_or_latest(published: Published, tmp_path: Path) -> None:
    """Through the CDN's read routes, with the read token a CDN that guards reads wants."""
    registry = open_registry(published.registry_url, create=False)
    store = LocalBlobStore(published.root / "blobs")
    app = create_app(registry=registry, store=store, admin_token=None, read_token="r3ad")
    pub = str(published.root / "publisher.pub")
    try:
        with serve_in_thread(app) as url:
            pull = ("models", "pull", "--trusted-key", pub, "--cdn", url)
            refused = tandem(*pull, "linear", "--out", "m.onnx", cwd=tmp_path)
            one_error_line(refused, 1, "--token")  # the CDN's 401, in one line
            assert not (tmp_path / "m.onnx").exists()
            for ref, version in (("linear@1", 1), ("linear", 2)):
                out = tmp_path / f"{version}.onnx"
                result = tandem(*pull, ref, "--out", str(out), "--token", "r3ad", cwd=tmp_path)
                assert result.returncode == 0, result.stderr
                assert out.read_bytes() == published.raw[version]
                assert url in result.stdout
    finally:
        registry.close()


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["linear", "--trusted-key", "{stranger}"], 1, ["does not verify", "stranger.pub"]),
        (["nope", "--trusted-key", "{pub}"], 1, ["nope"]),
        (["linear@7", "--trusted-key", "{pub}"], 1, ["linear@7"]),
        (["linear@0", "--trusted-key", "{pub}"], 2, ["NAME@VERSION"]),
        (["../x", "--trusted-key", "{pub}"], 2, ["model name"]),
        (["linear"], 2, ["--trusted-key"]),
        (["linear", "--trusted-key", "{pub}", "--out", "model.tflite"], 2, ["onnx", ".onnx"]),
        (["linear", "--trusted-key", "{pub}", "--cdn", "http://127.0.0.1:9"], 1, ["reach"]),
    ],
)
def test_each_failure_is_one_line_and_writes_nothing(
    args: list[str], code: int, needles: list[str], published: Published, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger.pub"
    stranger.write_text(SigningKey.generate().public_key.to_text())
    names = {"pub": str(published.root / "publisher.pub"), "stranger": str(stranger)}
    argv = [a.format(**names) for a in args]
    if "--out" not in argv:
        argv += ["--out", "model.onnx"]
    (tmp_path / "model.onnx").write_bytes(b"what was there before")
    one_error_line(tandem(*published.local("models", "pull", *argv), cwd=tmp_path), code, *needles)
    assert (tmp_path / "model.onnx").read_bytes() == b"what was there before"
    assert not (tmp_path / "model.tflite").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "stranger.pub"]


def test_a_blob_changed_in_the_store_is_refused(published: Published, tmp_path: Path) -> None:
    shutil.copytree(published.root, tmp_path / "copy")
    copy = Published(tmp_path / "copy", published.key, published.floats, published.raw)
    registry = open_registry(copy.registry_url, create=False)
    try:
        digest = registry.get_version("linear", 1).blob_digest
    finally:
        registry.close()
    blob = next(p for p in (copy.root / "blobs").rglob("*") if p.is_file() and digest[7:] in p.name)
    blob.write_bytes(blob.read_bytes()[::-1])  # same size, other bytes
    pub = str(copy.root / "publisher.pub")
    args = copy.local("models", "pull", "linear@1", "--out", "m.onnx", "--trusted-key", pub)
    one_error_line(tandem(*args, cwd=tmp_path), 1, "linear@1", "digest")
    assert not (tmp_path / "m.onnx").exists()


class _Substituting(RegistrySource):
    """A source that answers for one model with another's manifest and blob: what a
    compromised or misconfigured mirror could serve, signed by the right key."""

    def __init__(self, base: RegistrySource, answers: dict[tuple[str, int | None], Any]) -> None:
        super().__init__(base.registry, base.store, base.where)
        self.answers = answers

    def manifest(self, name: str, version: int | None) -> Any:
        other_name, other_version = self.answers.get((name, version), (name, version))
        return super().manifest(other_name, other_version)


def test_a_manifest_for_another_model_or_version_or_an_expired_one_is_refused(
    published: Published,
) -> None:
    registry = open_registry(published.registry_url, create=False)
    source = RegistrySource(registry, LocalBlobStore(published.root / "blobs"))
    keys = [published.key.public_key]
    try:
        other_version = _Substituting(source, {("linear", 2): ("linear", 1)})
        with pytest.raises(PullError, match="asked for linear@2"):
            pull_model(other_version, "linear", 2, keys)
        assert pull_model(other_version, "linear", None, keys).ref == "linear@2"
        registry.add_version(_renamed(registry, published.key, "impostor"))
        other_name = _Substituting(source, {("linear", None): ("impostor", None)})
        with pytest.raises(PullError, match="signed for impostor"):
            pull_model(other_name, "linear", None, keys)
        later = datetime.now(UTC) + timedelta(days=400)  # past the 365-day expiry
        with pytest.raises(ExpiredError):
            pull_model(source, "linear", 1, keys, now=later)
        with pytest.raises(PullError, match="public key"):
            pull_model(source, "linear", 1, [])
    finally:
        registry.close()


def _renamed(registry: Any, key: SigningKey, name: str) -> dict[str, Any]:
    """linear@1's manifest, re-signed by the publisher under another model name."""
    from shared import sign_document

    signed = dict(registry.get_version("linear", 1).manifest["signed"])
    signed["name"] = name
    return sign_document(signed, key)


def test_pull_help_marks_what_it_needs(tmp_path: Path) -> None:
    result = tandem("models", "pull", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Example: tandem models pull" in result.stdout
    assert marked_required(result.stdout, "--out")
    assert marked_required(result.stdout, "--trusted-key")
    assert not marked_required(result.stdout, "--cdn")
