"""Hubs that pull signed models from the CDN and swap new versions in while devices stream.

Two real hubs (``python -m cloud_hub --cdn ... --model lin``), each with an
empty repository of its own, pull from a real CDN (``model_cdn``'s app on
loopback, a SQLite registry and a blob store) and share the requests of one
device through a real Mosquitto. A new version published to the CDN reaches
both and is swapped in without a failed request; a version signed by an
unknown key never reaches a repository.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from cloud_hub.repository._cdn_pull import ModelPuller, PulledModel, parse_model_ref
from model_cdn import add_version, create_app, open_registry
from shared import SigningKey
from shared.server.store import LocalBlobStore

from ._brokers import MosquittoProcess
from ._cdn import serve_in_thread
from ._plane import Requester, wait_until
from ._update_kit import Publisher

ROOT = Path(__file__).resolve().parents[1]


class _Cdn:
    """A real CDN app over a registry and a store, and a publisher that signs for it."""

    def __init__(self, tmp: Path) -> None:
        self.key = SigningKey.generate()
        self.key_file = tmp / "publisher.pub"
        self.key_file.write_text(self.key.public_key.to_text())
        self.registry = open_registry(f"sqlite:///{tmp / 'registry.db'}")
        self.store = LocalBlobStore(tmp / "blobs")
        self.builder = Publisher(None, self.key, tmp)  # type: ignore[arg-type]  # builds only

    def publish(self, version: int, *, key: SigningKey | None = None) -> None:
        published = self.builder.build(version, seed=version, keys=[key] if key else None)
        add_version(
            self.registry,
            self.store,
            published.document,
            trusted_keys=None,  # the CDN stores what it is given; hubs check the signature
            blobs={published.blob_digest: published.blob},
        )


@pytest.fixture
def cdn(tmp_path: Path) -> Iterator[tuple[_Cdn, str]]:
    made = _Cdn(tmp_path)
    made.publish(1)
    app = create_app(registry=made.registry, store=made.store, admin_token=None)
    with serve_in_thread(app) as url:
        yield made, url
    made.registry.close()


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    from ._models import linear_classifier_weights

    return linear_classifier_weights(seed=seed)


def test_model_refs_name_a_model_and_maybe_a_version() -> None:
    assert parse_model_ref("mnist") == PulledModel("mnist")
    assert parse_model_ref("mnist@12") == PulledModel("mnist", 12)
    for bad in ("mnist@0", "mn/ist", "mnist@v2", "@3", ""):
        with pytest.raises(ValueError):
            parse_model_ref(bad)


def test_a_version_signed_by_an_unknown_key_never_reaches_the_repository(
    cdn: tuple[_Cdn, str], tmp_path: Path
) -> None:
    made, url = cdn
    repo = tmp_path / "repo"
    repo.mkdir()
    puller = ModelPuller(url, repo, [PulledModel("lin")], [made.key.public_key])
    assert puller.pull() == ["lin@1"]
    assert (repo / "lin" / "1" / "model.onnx").is_file()
    made.publish(2, key=SigningKey.generate())  # the CDN has it; no trusted key signed it
    assert puller.pull() == [] and puller.have("lin") == [1]
    pinned = ModelPuller(url, tmp_path / "other", [PulledModel("lin", 1)], [made.key.public_key])
    assert pinned.pull() == ["lin@1"]  # a pin asks for that version's manifest


def _start_hub(repo: Path, url: str, made: _Cdn, broker: str, prefix: str, group: str, log: Path):
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(repo), "--broker", broker,
        "--prefix", prefix, "--share-group", group, "--http-port", "0", "--workers", "1",
        "--log-level", "warning", "--cdn", url, "--model", "lin",
        "--trusted-key", str(made.key_file), "--cdn-poll-s", "1", "--repo-poll-s", "0.5",
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


@pytest.mark.slow
def test_hubs_pull_a_new_version_and_swap_it_in_while_devices_stream(
    cdn: tuple[_Cdn, str], tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    made, url = cdn
    prefix, group = f"tandem/{uuid.uuid4().hex[:8]}/v1", f"g{uuid.uuid4().hex[:6]}"
    hubs = []
    for i in range(2):
        (tmp_path / f"hub{i}").mkdir()
        repo, log = tmp_path / f"hub{i}", tmp_path / f"hub{i}.log"
        hubs.append(_start_hub(repo, url, made, mosquitto.url, prefix, group, log))
    requester = Requester(mosquitto.url, prefix, model="lin")
    rng = np.random.default_rng(6)
    ids: list[str] = []
    try:

        def answered_by(version: str) -> bool:
            ids.extend(
                requester.send(rng.normal(size=(1, 16)).astype(np.float32)) for _ in range(4)
            )
            return any(r.model_version == version for r in list(requester.replies.values()))

        wait_until(lambda: answered_by("1"), timeout_s=60, what="version 1 served")
        # Requests sent before any hub subscribed went nowhere; from here on none may fail.
        ids.clear()
        made.publish(2)
        wait_until(lambda: answered_by("2"), timeout_s=60, what="version 2 swapped in")
        for _ in range(25):
            answered_by("2")
        wait_until(lambda: requester.answered(ids) == len(ids), what="every reply")
    finally:
        requester.close()
        for hub in hubs:
            hub.terminate()
            hub.wait(30)
    replies = [requester.replies[i] for i in ids]
    assert all(r.ok for r in replies), [r.error_message for r in replies if not r.ok][:3]
    for request_id, reply in zip(ids, replies, strict=True):
        weight, bias = _weights(int(reply.model_version or 0))
        np.testing.assert_allclose(
            reply.tensors["logits"],
            requester.sent[request_id] @ weight + bias,
            rtol=1e-5,
            atol=1e-5,
        )
    for i in range(2):  # each hub pulled both versions into its own repository
        assert sorted(p.name for p in (tmp_path / f"hub{i}" / "lin").iterdir()) == ["1", "2"]


@pytest.mark.slow
def test_a_load_of_a_version_the_repository_lacks_pulls_it_from_the_cdn_first(
    cdn: tuple[_Cdn, str], tmp_path: Path
) -> None:
    from ._brokers import free_port

    made, url = cdn
    made.publish(2)
    port, repo = free_port(), tmp_path / "hub"
    repo.mkdir()
    command = [
        sys.executable, "-m", "cloud_hub", "--repo", str(repo), "--http-port", str(port),
        "--log-level", "warning", "--cdn", url, "--model", "lin@2",
        "--trusted-key", str(made.key_file), "--cdn-poll-s", "60", "--repo-poll-s", "0.5",
    ]  # fmt: skip
    with (tmp_path / "hub.log").open("ab") as out:
        hub = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}/v2"
    x = np.random.default_rng(4).normal(size=(2, 16)).astype(np.float32)

    def served() -> tuple[str, np.ndarray]:
        body = {"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        answer = httpx.post(f"{base}/models/lin/infer", json=body, timeout=30).json()
        logits = np.asarray(answer["outputs"][0]["data"], np.float32).reshape(2, 4)
        return str(answer["model_version"]), logits

    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{base}/health/ready", timeout=5).status_code == 200
            except httpx.HTTPError:
                assert hub.poll() is None, (tmp_path / "hub.log").read_text()[-2000:]
                return False

        wait_until(ready, timeout_s=60, what="the hub to serve")
        assert served()[0] == "2" and sorted(p.name for p in (repo / "lin").iterdir()) == ["2"]
        loaded = httpx.post(f"{base}/repository/models/lin/load",
                            json={"parameters": {"version": "1"}}, timeout=120)  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        version, logits = served()
        weight, bias = _weights(1)
        assert version == "1"
        np.testing.assert_allclose(logits, x @ weight + bias, rtol=1e-5, atol=1e-5)
        assert sorted(p.name for p in (repo / "lin").iterdir()) == ["1", "2"]
        absent = httpx.post(f"{base}/repository/models/lin/load",
                            json={"parameters": {"version": "7"}}, timeout=120)  # fmt: skip
        assert absent.status_code == 400 and "version 7 not pulled" in absent.text
        assert served()[0] == "1"
    finally:
        hub.terminate()
        hub.wait(30)
