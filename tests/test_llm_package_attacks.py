"""Attacks on a device installing a language model package, one test per attack.

A device serves v1 of the package (installed by its own updater from the real
CDN), then is assigned a v2 that an attacker shaped. Most v2s are signed by the
publisher's real key (a compromised or buggy publisher, or a stolen build
machine): the device must still refuse every archive that is not exactly the
signed listing, with a typed error, and keep serving v1 with ``current.json``
unmoved and nothing written outside its store. Named after the attack, as in
``test_updater_attacks.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edge_agent import DownloadSettings, EdgeAgent, ModelUpdater
from edge_agent.updater import STEPS, DeviceModelStore
from model_cdn.publish import PublishResult
from shared import (
    PackageError,
    PackageListing,
    SigningKey,
    UpdateState,
    UpdateStatus,
    compress_blob,
    digest,
    pack_files,
    read_directory,
    unpack_package,
)

from ._package_kit import MODEL, PROMPT, PackageCdn, greedy_text, package_cdn, tar_of
from ._update_kit import wait_until

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Device:
    cdn: PackageCdn
    agent: EdgeAgent
    updater: ModelUpdater
    store_dir: Path
    v1: PublishResult
    files: dict[str, bytes]  # v1's files
    text: str  # what v1 generates

    def attack(self) -> UpdateStatus:
        """Assign v2 and let the device act on it; returns its report."""
        self.cdn.assign("phone-1", 2)
        status = self.updater.check_now()
        assert status is not None
        return status

    def assert_still_on_v1(self, status: UpdateStatus, reason: str) -> None:
        assert status.state is UpdateState.FAILED and status.version == 2, status
        assert reason in status.reason, status.reason
        assert self.agent.language is not None and self.agent.language.version == "1"
        assert greedy_text(self.agent) == self.text
        pointer = DeviceModelStore(self.store_dir).pointer(MODEL)
        assert pointer is not None and pointer.version == 1
        assert not (self.store_dir / MODEL / "2").exists()


@pytest.fixture
def device(tiny_language_models: Any, tmp_path: Path) -> Iterator[Device]:
    folder = tiny_language_models.device_model
    with package_cdn(tmp_path / "cdn-side") as cdn:
        v1 = cdn.publish(folder)
        cdn.assign("phone-1", 1)
        store_dir = tmp_path / "device" / "store"
        with EdgeAgent(None, device_id="phone-1", language_model=folder) as agent:
            updater = cdn.updater(agent, "phone-1", store_dir, poll_interval_s=3600)
            status = updater.check_now()
            assert status is not None and status.state is UpdateState.INSTALLED
            files = read_directory(folder, max_bytes=1 << 30)
            yield Device(cdn, agent, updater, store_dir, v1, files, greedy_text(agent))


def member(name: str, size: int, kind: bytes = tarfile.REGTYPE, **fields: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def listing_of(files: dict[str, bytes]) -> list[dict[str, Any]]:
    return PackageListing.of(files).to_dict()["files"]


def files_outside(root: Path, store_dir: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(store_dir)}


def test_tampered_archive_is_refused(device: Device) -> None:
    raw = pack_files(device.files)
    device.cdn.craft(2, raw, based_on=device.v1)
    blob = compress_blob(raw)
    stored = device.cdn.store.local_path(digest(blob))  # the CDN's copy, changed behind it
    assert stored is not None
    stored.write_bytes(blob[:-8] + bytes(8))
    device.assert_still_on_v1(device.attack(), "digest")


def test_tampered_member_is_refused(device: Device) -> None:
    files = dict(device.files)
    changed = bytearray(files["tokenizer_config.json"])
    changed[5] ^= 0x01  # one bit, same size: only the member's digest can tell
    files["tokenizer_config.json"] = bytes(changed)
    listing = listing_of(device.files)  # the listing of the untouched files, signed
    device.cdn.craft(2, pack_files(files), based_on=device.v1, files=listing)
    device.assert_still_on_v1(device.attack(), "not the file the manifest lists")


def test_extra_member_is_refused(device: Device) -> None:
    files = {**device.files, "evil.so": b"\x7fELF" + bytes(64)}
    device.cdn.craft(2, pack_files(files), based_on=device.v1, files=listing_of(device.files))
    device.assert_still_on_v1(device.attack(), "not listed in the manifest")


def test_path_traversal_member_is_refused(device: Device, tmp_path: Path) -> None:
    before = files_outside(tmp_path / "device", device.store_dir)
    payload = b"pwned"
    name = "../../../escaped.txt"
    members = [member(n, len(d)) for n, d in sorted(device.files.items())]
    members.append(member(name, len(payload)))
    raw = tar_of(members, {**device.files, name: payload})
    listing = [*listing_of(device.files)]
    device.cdn.craft(2, raw, based_on=device.v1, files=listing)
    device.assert_still_on_v1(device.attack(), "not a plain file name")
    assert files_outside(tmp_path / "device", device.store_dir) == before
    assert not list(tmp_path.rglob("escaped.txt"))


def test_symlink_member_is_refused(device: Device) -> None:
    link = member("model.onnx.data", 0, tarfile.SYMTYPE, linkname="/etc/passwd")
    others = {n: d for n, d in device.files.items() if n != "model.onnx.data"}
    padding = {"zz-padding": bytes(len(device.files["model.onnx.data"]))}  # the listed size
    members = [member(n, len(d)) for n, d in sorted({**others, **padding}.items())]
    members.insert(2, link)  # where the data file would be
    device.cdn.craft(
        2,
        tar_of(members, {**others, **padding}),
        based_on=device.v1,
        files=listing_of(device.files),
    )
    device.assert_still_on_v1(device.attack(), "not a regular file")


def test_oversized_member_is_refused_before_it_is_read(device: Device) -> None:
    big = {**device.files, "tokenizer.json": device.files["tokenizer.json"] + bytes(1 << 20)}
    listing = listing_of(device.files)  # says tokenizer.json is its real, small size
    device.cdn.craft(2, pack_files(big), based_on=device.v1, files=listing)
    device.assert_still_on_v1(device.attack(), "declares")


def test_decompression_bomb_is_refused(device: Device) -> None:
    raw = pack_files(device.files)
    bomb = compress_blob(raw + bytes(64 << 20))  # 64 MiB of zeros: a few KiB compressed
    device.cdn.craft(2, raw, based_on=device.v1, blob=bomb, raw_size=len(raw))
    device.assert_still_on_v1(device.attack(), "expands to more than")


def test_package_declaring_more_than_the_device_takes_is_refused_before_download(
    device: Device,
) -> None:
    raw = pack_files(device.files)
    device.cdn.craft(2, raw, based_on=device.v1, raw_size=len(raw) * 4)
    device.updater._fetcher.cdn.settings = DownloadSettings(max_raw_bytes=len(raw) * 2)
    device.assert_still_on_v1(device.attack(), "this device takes at most")


def test_wrong_signature_is_refused(device: Device) -> None:
    raw = pack_files(device.files)
    device.cdn.craft(2, raw, based_on=device.v1, key=SigningKey.generate())
    device.assert_still_on_v1(device.attack(), "manifest refused")


def test_package_failing_its_smoke_generation_is_never_served(device: Device) -> None:
    smoke = dict(device.v1.signed["signed"]["smoke_test"])
    smoke["output_ids"] = [(t + 1) % 300 for t in smoke["output_ids"]]  # not what it generates
    device.cdn.craft(2, pack_files(device.files), based_on=device.v1, smoke_test=smoke)
    device.assert_still_on_v1(device.attack(), "smoke test")  # and v2's folder removed


def test_package_needing_a_newer_runtime_than_the_device_has_is_refused(device: Device) -> None:
    requires = {**device.v1.signed["signed"]["requires"], "min_version": "99.0"}
    device.cdn.craft(2, pack_files(device.files), based_on=device.v1, requires=requires)
    device.assert_still_on_v1(device.attack(), "needs onnxruntime-genai >= 99.0")


def test_a_member_changed_on_disk_after_install_is_not_served_at_restart(device: Device) -> None:
    second = read_directory(device.store_dir / MODEL / "1" / "package", max_bytes=1 << 30)
    device.cdn.craft(2, pack_files(second), based_on=device.v1, files=listing_of(second))
    status = device.attack()
    assert status.state is UpdateState.INSTALLED, status
    tampered = device.store_dir / MODEL / "2" / "package" / "tokenizer.json"
    tampered.write_bytes(tampered.read_bytes().replace(b"{", b"{ ", 1))
    runtime = ModelUpdater.bootstrap_language(device.store_dir, [device.cdn.key.public_key], MODEL)
    assert runtime is not None and runtime.version == "1"  # v2 refused, the previous serves


def run_device(device: Device, tmp_path: Path, block_at: str | None) -> Any:
    events, marker = tmp_path / "events.jsonl", tmp_path / f"at-{block_at}"
    config = {
        "store_dir": str(device.store_dir),
        "model": MODEL,
        "device": "phone-1",
        "public_key": device.cdn.key.public_key.to_text(),
        "cdn_url": device.cdn.url,
        "prompt": PROMPT,
        "events": str(events),
        "marker": str(marker),
        "block_at": block_at,
    }
    with (tmp_path / f"device-{block_at}.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests._updating_llm_device", json.dumps(config)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, events, marker


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_install_step_restarts_on_the_old_package(
    device: Device, tiny_language_models: Any, tmp_path: Path, step: str
) -> None:
    device.cdn.publish(tiny_language_models.hub_model)  # a real v2
    with EdgeAgent(None, device_id="ref", language_model=tiny_language_models.hub_model) as ref:
        v2_text = greedy_text(ref)
    device.cdn.assign("phone-1", 2)
    process, events, marker = run_device(device, tmp_path, block_at=step)
    try:
        wait_until(lambda: marker.exists() or process.poll() is not None, 60, f"step {step}")
        assert marker.exists(), (tmp_path / f"device-{step}.log").read_text()[-3000:]
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    assert DeviceModelStore(device.store_dir).pointer(MODEL).version == 1  # type: ignore[union-attr]

    events.unlink()
    process, events, _ = run_device(device, tmp_path, block_at=None)
    try:
        process.wait(90)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
    log = (tmp_path / "device-None.log").read_text()[-3000:]
    booted, updated = read_events(events)
    assert booted == {"event": "booted", "version": "1", "text": device.text}, log
    assert updated["state"] == "installed" and updated["version"] == "2", (updated, log)
    assert updated["text"] == v2_text
    left = {p.name for p in (device.store_dir / MODEL).iterdir()}
    assert left == {"1", "2", "current.json"}, left  # no half-written leftovers


def test_unpack_refuses_each_hostile_archive_with_a_package_error() -> None:
    """The pure check behind the tests above, with archives no publisher would sign."""
    files = {"a.json": b"{}", "b.bin": b"\x00" * 10}
    listing = PackageListing.of(files)
    good = pack_files(files)
    assert unpack_package(good, listing) == files
    hostile = {
        "trailing data": good + bytes(10240),
        "not tar": b"hello" * 300,
        "hard link": tar_of(
            [member("a.json", 0, tarfile.LNKTYPE, linkname="b.bin"), member("b.bin", 10)], files
        ),
        "absolute path": tar_of(
            [member("/a.json", 2), member("b.bin", 10)], {"/a.json": b"{}", **files}
        ),
        "device node": tar_of([member("a.json", 0, tarfile.CHRTYPE), member("b.bin", 10)], files),
        "duplicate": tar_of([member("a.json", 2), member("a.json", 2), member("b.bin", 10)], files),
        "missing": tar_of([member("b.bin", 10)], files),
        "directory": tar_of([member("a.json", 0, tarfile.DIRTYPE), member("b.bin", 10)], files),
    }
    for what, raw in hostile.items():
        with pytest.raises(PackageError):
            unpack_package(raw, listing)
            pytest.fail(f"{what} was accepted")
    with pytest.raises(PackageError):
        pack_files({"../x": b""})
    assert issubclass(PackageError, ValueError)
