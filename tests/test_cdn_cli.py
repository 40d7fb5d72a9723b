"""The CDN's commands as a user runs them: ``tandem keys``, ``tandem models``, ``tandem cdn``.

Each runs through typer's test runner in this process (exit code, stdout and
stderr apart; ``process=True`` runs a real ``python -m tandem.cli``); a
failure must be exactly one line on stderr.
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from model_cdn.registry import open_registry
from shared import (
    PublicKey,
    SigningKey,
    Topics,
    decompress_blob,
    verify_assignment,
    verify_manifest,
)
from shared.server.store import LocalBlobStore

from ._brokers import MosquittoProcess, free_port, wait_for_port
from ._cdn import make_manifest_doc, receive_retained
from ._cli import one_error_line, tandem, tandem_env


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of a rich table's body rows (the lines after its ─── rule)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "───" in line)
    return [line.split() for line in lines[start + 1 :] if line.strip()]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A key pair made by the command under test; returns the directory."""
    result = tandem("keys", "generate", "--out", str(tmp_path / "keys"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "keys"


def test_keys_generate_writes_a_private_key_only_its_owner_reads(keys: Path) -> None:
    private, public = keys / "publisher.key", keys / "publisher.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert SigningKey.load(private).public_key == PublicKey.load(public)
    assert not [p for p in keys.iterdir() if p.name.startswith(".tmp-")]


def test_keys_generate_refuses_to_overwrite_without_force(keys: Path, tmp_path: Path) -> None:
    before = (keys / "publisher.key").read_text()
    again = tandem("keys", "generate", "--out", str(keys), cwd=tmp_path)
    one_error_line(again, 1, "publisher.key exists", "--force")
    assert (keys / "publisher.key").read_text() == before
    forced = tandem("keys", "generate", "--out", str(keys), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (keys / "publisher.key").read_text() != before
    assert stat.S_IMODE((keys / "publisher.key").stat().st_mode) == 0o600


def test_models_list_shows_models_then_one_models_versions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    missing = tandem("models", "list", "--registry", url, cwd=tmp_path)
    one_error_line(missing, 1, "no registry at", "--registry")
    assert not (tmp_path / "registry.db").exists()  # listing creates nothing
    key = SigningKey.generate()
    registry = open_registry(url)
    try:
        registry.add_version(make_manifest_doc(key, "mnist", 1))
        registry.add_version(make_manifest_doc(key, "mnist", 4))
        registry.add_version(make_manifest_doc(key, "kws", 2))
    finally:
        registry.close()
    listed = tandem("models", "list", "--registry", url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {row[0]: row for row in table_rows(listed.stdout)}
    assert (rows["kws"][1], rows["mnist"][1], rows["mnist"][2]) == ("2", "4", "2")
    versions = tandem("models", "list", "mnist", "--registry", url, cwd=tmp_path)
    assert versions.returncode == 0, versions.stderr
    assert [row[0] for row in table_rows(versions.stdout)] == ["1", "4"]
    unknown = tandem("models", "list", "nope", "--registry", url, cwd=tmp_path)
    one_error_line(unknown, 1, "no model 'nope'")


@pytest.mark.parametrize(
    "command",
    [
        ("cdn", "serve"),
        ("models", "publish"),
        ("models", "assign"),
        ("models", "list"),
        ("keys", "generate"),
    ],
)
def test_help_teaches_with_an_example(command: tuple[str, ...], tmp_path: Path) -> None:
    result = tandem(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Example: tandem" in result.stdout or "Example: TANDEM" in result.stdout
    if command == ("cdn", "serve"):
        for option in ("--registry", "--store", "--admin-token", "--trusted-key", "--broker"):
            assert option in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["models", "assign", "mnist", "--device", "cam-1", "--sign-key", "k"], 2, "MODEL@VERSION"),
        (["models", "assign", "mnist@1", "--device", "../x", "--sign-key", "k"], 2, "device id"),
        (["models", "assign", "mnist@1", "--device", "cam-1"], 2, "TANDEM_SIGN_KEY"),
        (
            [
                "models",
                "assign",
                "mnist@1",
                "--device",
                "c",
                "--broker",
                "http://x",
                "--sign-key",
                "k",
            ],
            2,
            "mqtt://",
        ),
        (
            ["models", "publish", "missing.onnx", "--name", "m", "--sign-key", "k"],
            2,
            "no model file",
        ),
        (["models", "publish", "model.onnx", "--name", "m", "--quantize", "int4"], 2, "--quantize"),
        (["models", "publish", "model.onnx", "--name", "m", "--format", "coreml"], 2, "--format"),
        (["models", "publish", "model.onnx", "--name", "m"], 2, "TANDEM_SIGN_KEY"),
        (["models", "publish", "model.onnx", "--name", "m", "--sign-key", "nokey"], 1, "nokey"),
        (
            ["models", "publish", "model.onnx", "--name", "m", "--sign-key", "model.onnx"],
            1,
            "private key",
        ),
        (["cdn", "serve", "--registry", "mysql://db/x"], 1, "not supported"),
        (["cdn", "serve", "--trusted-key", "ed25519:bad"], 2, "public key"),
        (["cdn", "serve", "--trusted-key", "absent.pub"], 1, "absent.pub"),
        (["cdn", "serve", "--log-level", "loud"], 2, "--log-level"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_an_exit_code(
    args: list[str], code: int, needle: str, tmp_path: Path
) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not really onnx")
    result = tandem(*args, cwd=tmp_path)
    one_error_line(result, code, needle)
    assert not (tmp_path / "tandem-cdn").exists() or args[:2] == ["cdn", "serve"]


def test_models_assign_stores_signs_and_publishes_retained(
    keys: Path, tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    registry = open_registry(url)
    registry.add_version(make_manifest_doc(SigningKey.load(keys / "publisher.key"), "mnist", 3))
    registry.close()
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    common = ["--sign-key", str(keys / "publisher.key"), "--registry", url]
    result = tandem(
        "models",
        "assign",
        "mnist@3",
        "--device",
        "cam-1",
        "--device",
        "cam-2",
        "--rollback",
        "--broker",
        mosquitto.url,
        "--prefix",
        prefix,
        *common,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "cam-2: mnist@3 stored and published" in result.stdout
    public = PublicKey.load(keys / "publisher.pub")
    registry = open_registry(url)
    try:
        for device in ("cam-1", "cam-2"):
            doc = registry.get_assignment(device, "mnist")
            assert doc is not None
            got = verify_assignment(doc, [public])
            assert (got.device, got.version, got.rollback) == (device, 3, True)
    finally:
        registry.close()
    message = receive_retained(mosquitto.url, Topics(prefix).assign("cam-2"))
    assert verify_assignment(message.payload, [public]).device == "cam-2"
    unknown = tandem("models", "assign", "mnist@9", "--device", "cam-1", *common, cwd=tmp_path)
    one_error_line(unknown, 1, "mnist@9")
    dead = tandem(
        "models",
        "assign",
        "mnist@3",
        "--device",
        "cam-1",
        "--broker",
        f"mqtt://127.0.0.1:{free_port()}",
        *common,
        cwd=tmp_path,
    )
    one_error_line(dead, 1, "cannot reach the MQTT broker")


def test_cdn_serve_serves_until_stopped(keys: Path, tmp_path: Path) -> None:
    key = SigningKey.load(keys / "publisher.key")
    registry = open_registry(tmp_path / "registry.db")
    registry.add_version(make_manifest_doc(key, "mnist", 1))
    registry.close()
    port = free_port()
    env = tandem_env()
    env.update(TANDEM_CDN_ADMIN_TOKEN="t0ken")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "cdn",
            "serve",
            "--port",
            str(port),
            "--registry",
            str(tmp_path / "registry.db"),
            "--store",
            str(tmp_path / "blobs"),
            "--trusted-key",
            str(keys / "publisher.pub"),
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, timeout_s=60)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            assert client.get("/v1/models").json() == {"models": ["mnist"]}
            assert client.put("/v1/blobs/sha256:" + "0" * 64, content=b"x").status_code == 401
            token = {"Authorization": "Bearer t0ken"}
            assert (
                client.put("/v1/blobs/sha256:" + "0" * 64, content=b"x", headers=token).status_code
                == 400
            )
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells why.
    assert server.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr


def test_models_publish_quantizes_signs_and_registers(
    keys: Path, tmp_path: Path, linear_onnx: Path
) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", inputs=rng.normal(size=(64, 16)).astype(np.float32))
    val = rng.normal(size=(200, 16)).astype(np.float32)
    from ._models import linear_classifier_weights

    weight, bias = linear_classifier_weights()
    np.savez(tmp_path / "val.npz", inputs=val, labels=np.argmax(val @ weight + bias, axis=1))
    (tmp_path / "labels.txt").write_text("a\nb\nc\nd\n")
    args = [
        "models",
        "publish",
        str(linear_onnx),
        "--name",
        "linear",
        "--calibration",
        "calib.npz",
        "--validation",
        "val.npz",
        "--labels",
        "labels.txt",
        "--min-agreement",
        "0.9",
        "--sign-key",
        str(keys / "publisher.key"),
    ]
    result = tandem(*args, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for row in (
        "version",
        "digest",
        "float size",
        "quantized size",
        "compressed size",
        "delta size",
        "agreement",
        "accuracy",
    ):
        assert row in result.stdout, row
    # The defaults: ./tandem-cdn/registry.db and ./tandem-cdn/blobs
    registry = open_registry(tmp_path / "tandem-cdn" / "registry.db")
    try:
        record = registry.get_version("linear")
    finally:
        registry.close()
    manifest = verify_manifest(record.manifest, [PublicKey.load(keys / "publisher.pub")])
    assert (manifest.version, manifest.labels) == (1, ("a", "b", "c", "d"))
    assert manifest.quantization["agreement"] >= 0.9
    assert record.blob_digest in result.stdout
    blob = LocalBlobStore(tmp_path / "tandem-cdn" / "blobs").get(record.blob_digest)
    assert len(decompress_blob(blob, manifest.blob.raw_size)) == manifest.blob.raw_size
    again = tandem(*args, "--version", "1", cwd=tmp_path, timeout=300)
    one_error_line(again, 1, "not above")
    assert json.dumps(record.manifest)  # stored as plain JSON
