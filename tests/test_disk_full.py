"""A full disk leaves nothing half-written behind: no staging folder, no temporary file.

Issue 21 (item 9) filled the disk under a device install, a hub pull and the
CLI: staging folders stayed. Each case here makes the writes fail for real:
the work runs in a process of its own whose RLIMIT_FSIZE is below the size
of what it writes (the kernel refuses the write with EFBIG, as a full disk
refuses it with ENOSPC; SIGXFSZ ignored, as Python does), against a real
CDN on loopback. After the refusal the folders hold what they held before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_cdn import ModelNotFoundError, add_version, create_app, open_registry
from shared import SigningKey
from shared.server.store import LocalBlobStore

from ._cdn import serve_in_thread
from ._cli import tandem, tandem_env
from ._models import write_linear_classifier
from ._update_kit import Published, Publisher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE as on Linux")

_LIMITED = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write is EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
"""


def _run_limited(code: str, limit: int, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python process that can write no file past ``limit`` bytes."""
    preamble = _LIMITED.format(limit=limit)
    return subprocess.run(
        [sys.executable, "-B", "-c", preamble + textwrap.dedent(code)],
        cwd=cwd,
        env=tandem_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _entries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def published(tmp_path: Path) -> tuple[Published, SigningKey]:
    key = SigningKey.generate()
    made = Publisher(None, key, tmp_path).build(1)  # type: ignore[arg-type]  # builds only
    return made, key


def test_a_device_install_that_hits_a_full_disk_leaves_no_staging_folder(
    published: tuple[Published, SigningKey], tmp_path: Path
) -> None:
    made, _ = published
    store = tmp_path / "device-models"
    (store / "lin").mkdir(parents=True)
    (tmp_path / "signed.json").write_bytes(made.signed)
    (tmp_path / "raw.onnx").write_bytes(made.raw)
    code = """
        import json
        from pathlib import Path
        from edge_agent import StoreError
        from edge_agent.updater import DeviceModelStore
        from shared import ModelManifest
        signed = Path("signed.json").read_bytes()
        manifest = ModelManifest.from_dict(json.loads(signed)["signed"])
        try:
            DeviceModelStore("device-models").install("lin", manifest, signed,
                                                      Path("raw.onnx").read_bytes())
        except StoreError as e:
            print("refused:", e)
    """
    done = _run_limited(code, len(made.raw) // 2, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "refused: cannot write lin@1" in done.stdout, done.stdout + done.stderr
    assert _entries(store) == ["lin"]  # no .staging-*, no half-written version


@pytest.fixture
def cdn(tmp_path: Path, published: tuple[Published, SigningKey]) -> Iterator[str]:
    made, _ = published
    registry = open_registry(f"sqlite:///{tmp_path / 'cdn.db'}")
    store = LocalBlobStore(tmp_path / "cdn-blobs")
    add_version(
        registry, store, made.document, trusted_keys=None, blobs={made.blob_digest: made.blob}
    )
    try:
        with serve_in_thread(create_app(registry=registry, store=store, admin_token=None)) as url:
            yield url
    finally:
        registry.close()


def test_a_hub_pull_that_hits_a_full_disk_leaves_no_staging_folder(
    cdn: str, published: tuple[Published, SigningKey], tmp_path: Path
) -> None:
    made, key = published
    repo = tmp_path / "repo"
    repo.mkdir()
    code = f"""
        import json
        from cloud_hub.repository._cdn_pull import ModelPuller, PulledModel
        from shared import PublicKey
        key = PublicKey.from_text({key.public_key.to_text()!r})
        puller = ModelPuller({cdn!r}, "repo", [PulledModel("lin")], [key])
        print(json.dumps(puller.pull()))
    """
    done = _run_limited(code, len(made.raw) // 2, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []  # not pulled, and said so
    assert "not pulled" in done.stderr
    assert _entries(repo) == ["lin"]  # no .pull-*: the next poll starts clean


def test_models_pull_on_a_full_disk_exits_with_one_line_and_writes_nothing(
    cdn: str, published: tuple[Published, SigningKey], tmp_path: Path
) -> None:
    made, key = published
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "publisher.pub").write_text(key.public_key.to_text())
    code = f"""
        import sys
        from tandem.cli import main
        sys.argv = ["tandem", "models", "pull", "lin", "--out", "out/lin.onnx",
                    "--trusted-key", "publisher.pub", "--cdn", {cdn!r}]
        main()
    """
    done = _run_limited(code, len(made.raw) // 2, tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("tandem models pull:"), lines[0]
    assert _entries(out) == []  # no .part file


@pytest.mark.parametrize("quantize", ["none", "int8-static"])
def test_models_publish_on_a_full_disk_leaves_no_temporary_folder(
    quantize: str, tmp_path: Path
) -> None:
    """A 1 MB model against a 400 kB limit: the registry (small) is written, the model's
    copies are not. Neither the store nor TMPDIR keeps anything but onnxruntime's own
    session-id file (``.ses``, 51 bytes, written by any session)."""
    assert tandem("keys", "generate", "--out", "keys", cwd=tmp_path).returncode == 0
    write_linear_classifier(tmp_path / "a.onnx", in_features=4096, classes=64, seed=0)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "calib.npy", rng.normal(size=(32, 4096)).astype(np.float32))
    np.savez(tmp_path / "val.npz", inputs=rng.normal(size=(32, 4096)).astype(np.float32))
    scratch = tmp_path / "scratch"  # the process's TMPDIR: quantizing writes there first
    scratch.mkdir()
    code = f"""
        import sys
        from tandem.cli import main
        sys.argv = ["tandem", "models", "publish", "a.onnx", "--name", "linear",
                    "--sign-key", "keys/publisher.key", "--quantize", {quantize!r},
                    "--calibration", "calib.npy", "--validation", "val.npz",
                    "--min-agreement", "0.5", "--registry", "sqlite:///registry.db",
                    "--store", "blobs"]
        main()
    """
    done = _run_limited(code, 400_000, tmp_path, TMPDIR=str(scratch))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("tandem models publish:"), lines[0]
    assert "File too large" in lines[0] or "disk" in lines[0], lines[0]
    assert [e for e in _entries(scratch) if e != ".ses"] == []
    assert not (tmp_path / "blobs").exists(), _entries(tmp_path / "blobs")
    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}", create=False)
    try:
        with pytest.raises(ModelNotFoundError):  # nothing registered either
            registry.list_versions("linear")
    finally:
        registry.close()


def test_the_limit_is_what_refuses_the_writes(tmp_path: Path) -> None:
    """The harness bites: below the limit a write passes, past it the kernel refuses it."""
    code = """
        from pathlib import Path
        Path("small").write_bytes(b"x" * 100)
        try:
            Path("big").write_bytes(b"x" * 5000)
        except OSError as e:
            print("refused", e.errno)
    """
    done = _run_limited(code, 1000, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", str(__import__("errno").EFBIG)]
    assert (tmp_path / "small").stat().st_size == 100
