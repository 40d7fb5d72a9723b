"""Language models as CDN packages: publish a folder, pull it, install it, serve it.

Real parts throughout: the tiny ONNX Runtime GenAI pair (``tiny_language_models``),
the model_cdn app on loopback over a SQLite registry and a blob store, real
ed25519 keys, the device's ``ModelUpdater`` and ``EdgeAgent``, the embedded hub.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloud_hub import Hub
from cloud_hub.repository._cdn_pull import ModelPuller, PulledModel
from edge_agent import EdgeAgent, ModelUpdater
from edge_agent.updater import DeviceModelStore
from model_cdn import AdminClient, CdnSource, PullError, pull_model, write_package_dir
from shared import (
    ManifestError,
    ModelManifest,
    PackageError,
    PackageListing,
    UpdateState,
    pack_files,
    read_directory,
    unpack_package,
)

from ._cdn import make_manifest_doc
from ._package_kit import MODEL, PROMPT, PackageCdn, greedy_text, package_cdn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cdn(tmp_path: Path) -> Any:
    with package_cdn(tmp_path) as made:
        yield made


def source_text(folder: Path) -> str:
    with EdgeAgent(None, device_id="ref", language_model=folder) as agent:
        return greedy_text(agent)


def test_the_archive_is_canonical_whatever_the_order_and_round_trips(
    tiny_language_models: Any,
) -> None:
    files = read_directory(tiny_language_models.device_model, max_bytes=1 << 30)
    reordered = dict(reversed(list(files.items())))
    archive = pack_files(files)
    assert pack_files(reordered) == archive  # kills: names not sorted in pack_files
    listing = PackageListing.of(files)
    assert unpack_package(archive, listing) == files
    assert [f.name for f in listing.files] == sorted(files)


def test_a_published_package_pulled_from_the_cdn_generates_the_source_text(
    cdn: PackageCdn, tiny_language_models: Any, tmp_path: Path
) -> None:
    folder = tiny_language_models.device_model
    result = cdn.publish(folder)
    manifest = result.manifest
    assert manifest.format == "onnx-genai" and manifest.package is not None
    assert {f.name for f in manifest.package.files} == {p.name for p in folder.iterdir()}
    assert manifest.requires["execution_provider"] == "CPUExecutionProvider"
    assert manifest.quantization["weights"] == "int4"  # the device model is the builder's INT4
    assert manifest.generation_smoke().prompt == PROMPT

    pulled = pull_model(CdnSource(AdminClient(cdn.url)), MODEL, None, [cdn.key.public_key])
    assert pulled.files is not None
    out = write_package_dir(tmp_path / "pulled", pulled.files)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in folder.iterdir())
    with EdgeAgent(None, device_id="phone", language_model=out) as agent:
        assert greedy_text(agent) == source_text(folder)


def test_a_package_the_listing_does_not_match_is_never_pulled(
    cdn: PackageCdn, tiny_language_models: Any
) -> None:
    first = cdn.publish(tiny_language_models.device_model)
    files = copy.deepcopy(first.signed["signed"]["package"]["files"])
    files[0]["digest"] = "sha256:" + "0" * 64  # signed, but not what the archive holds
    raw = pack_files(read_directory(tiny_language_models.device_model, max_bytes=1 << 30))
    cdn.craft(2, raw, based_on=first, files=files)
    with pytest.raises(PullError, match="refused"):
        pull_model(CdnSource(AdminClient(cdn.url)), MODEL, 2, [cdn.key.public_key])


def test_a_second_version_ships_as_a_delta_from_the_first_archive(
    cdn: PackageCdn, tiny_language_models: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "v2"
    shutil.copytree(tiny_language_models.device_model, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"]["max_length"] = 64  # a new version: same weights, other defaults
    (folder / "genai_config.json").write_text(json.dumps(config, indent=4))
    cdn.publish(tiny_language_models.device_model)
    second = cdn.publish(folder)
    assert second.manifest.deltas and second.manifest.deltas[0].from_version == 1
    assert second.manifest.deltas[0].size < second.manifest.blob.size // 4


def test_a_device_installs_a_package_atomically_and_its_agent_generates_from_it(
    cdn: PackageCdn, tiny_language_models: Any, tmp_path: Path
) -> None:
    device, hub_model = tiny_language_models.device_model, tiny_language_models.hub_model
    cdn.publish(device)
    cdn.publish(hub_model)  # v2: another model of the family, as a new version
    store_dir = tmp_path / "store"
    cdn.assign("phone-1", 1)
    with EdgeAgent(None, device_id="phone-1", language_model=device) as agent:
        updater = cdn.updater(agent, "phone-1", store_dir, poll_interval_s=3600)
        status = updater.check_now()
        assert status is not None and status.state is UpdateState.INSTALLED, status
        assert agent.language is not None and agent.language.version == "1"
        assert greedy_text(agent) == source_text(device)
        v1 = agent.language

        conversation_stream = agent.chat([{"role": "user", "content": "hi"}], max_tokens=4)
        list(conversation_stream)
        conversation = conversation_stream.conversation
        cdn.assign("phone-1", 2)
        status = updater.check_now()
        assert status is not None and status.state is UpdateState.INSTALLED, status
        assert agent.language is not v1 and agent.language.version == "2"
        assert greedy_text(agent) == source_text(hub_model)
        # The next turn of a conversation begun on v1 runs on v2, its history re-prefilled.
        next_turn = agent.chat(
            [{"role": "user", "content": "more"}], max_tokens=4, conversation=conversation
        )
        list(next_turn)
        assert conversation is not None and conversation.reprefills == 1

    store = DeviceModelStore(store_dir)
    pointer = store.pointer(MODEL)
    assert pointer is not None and (pointer.version, pointer.previous) == (2, 1)
    package = store_dir / MODEL / "2" / "package"
    assert sorted(p.name for p in package.iterdir()) == sorted(p.name for p in hub_model.iterdir())
    runtime = ModelUpdater.bootstrap_language(store_dir, [cdn.key.public_key], MODEL)
    assert runtime is not None and runtime.version == "2"  # what a restarted device serves
    assert ModelUpdater.bootstrap(store_dir, [cdn.key.public_key], MODEL) is None  # no tensors


def test_the_embedded_hub_serves_a_package_it_pulled_and_the_process_plane_refuses_it(
    cdn: PackageCdn, tiny_language_models: Any, tmp_path: Path
) -> None:
    cdn.publish(tiny_language_models.hub_model)
    repo = tmp_path / "repo"
    repo.mkdir()
    keys = [cdn.key.public_key]
    refusing = ModelPuller(cdn.url, repo, [PulledModel(MODEL)], keys, packages=False)
    assert refusing.pull() == [] and refusing.have(MODEL) == []  # kills: packages ignored

    puller = ModelPuller(cdn.url, repo, [PulledModel(MODEL)], keys)
    assert puller.pull() == [f"{MODEL}@1"]
    assert json.loads((repo / MODEL / "config.json").read_text()) == {
        "platform": "onnxruntime_genai"
    }
    hub = Hub(repo).start()
    try:
        served = hub.language.get(MODEL)
        assert served.version == "1"
        assert MODEL not in hub.repository  # not a tensor model
    finally:
        hub.stop()


def test_old_manifests_still_load_and_a_format_without_its_listing_is_refused() -> None:
    from shared import SigningKey

    old = make_manifest_doc(SigningKey.generate(), "mnist", 3)["signed"]
    assert "package" not in old
    manifest = ModelManifest.from_dict(old)
    assert manifest.format == "onnx" and manifest.package is None
    assert ModelManifest.from_dict(manifest.to_dict()).to_dict() == manifest.to_dict()
    with pytest.raises(ManifestError, match="lists its files"):
        ModelManifest.from_dict({**old, "format": "onnx-genai"})
    listing = {
        "archive": "tar",
        "files": [{"name": "a", "size": 1, "digest": "sha256:" + "0" * 64}],
    }
    with pytest.raises(ManifestError, match="lists its files"):
        ModelManifest.from_dict({**old, "package": listing})
    with pytest.raises(PackageError):
        ModelManifest.from_dict(
            {
                **old,
                "format": "onnx-genai",
                "package": {"files": [{"name": "../x", "size": 1, "digest": "sha256:" + "0" * 64}]},
            }
        )


def test_cli_publishes_a_model_folder_and_pulls_it_as_a_folder(
    tiny_language_models: Any, tmp_path: Path
) -> None:
    from shared import SigningKey

    key = SigningKey.generate()
    key_file, pub_file = tmp_path / "publisher.key", tmp_path / "publisher.pub"
    key_file.write_text(key.to_text())
    pub_file.write_text(key.public_key.to_text())
    where = ["--registry", f"sqlite:///{tmp_path / 'reg.db'}", "--store", str(tmp_path / "b")]

    def tandem(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tandem.cli", *args],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=300,
        )

    folder = tiny_language_models.device_model
    done = tandem(
        "models", "publish", str(folder), "--name", MODEL, "--sign-key", str(key_file), *where
    )
    assert done.returncode == 0, done.stderr
    refused = tandem(
        "models",
        "publish",
        str(folder),
        "--name",
        MODEL,
        "--quantize",
        "fp16",
        "--sign-key",
        str(key_file),
        *where,
    )
    assert refused.returncode == 2 and "model folder" in refused.stderr
    out = tmp_path / "pulled"
    done = tandem(
        "models", "pull", f"{MODEL}@1", "--out", str(out), "--trusted-key", str(pub_file), *where
    )
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        p.name: p.read_bytes() for p in folder.iterdir()
    }
