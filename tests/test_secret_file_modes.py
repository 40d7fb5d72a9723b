"""Every secret file Tandem writes is 0600, even under the most permissive umask.

The signing key (``tandem keys generate``), the API key file and the
Mosquitto password/ACL files all go through ``shared.atomic_write_bytes``
with ``mode=0o600``; under ``umask 000`` a write that forgot the mode would
leave them world-readable (0666), so these tests fail for it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.server import ApiKeyFile, generate_api_key
from tandem.broker import write_private_file

from ._cli import tandem


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("permissive_umask")
def test_a_generated_signing_key_is_0600_and_its_public_half_is_not_secret(
    tmp_path: Path,
) -> None:
    result = tandem("keys", "generate", "--out", str(tmp_path / "keys"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _mode(tmp_path / "keys" / "publisher.key") == 0o600
    assert _mode(tmp_path / "keys" / "publisher.pub") == 0o666  # as open() makes it: public


@pytest.mark.usefixtures("permissive_umask")
def test_a_replaced_signing_key_is_0600(tmp_path: Path) -> None:
    for _ in range(2):
        result = tandem("keys", "generate", "--out", str(tmp_path), "--force", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert _mode(tmp_path / "publisher.key") == 0o600


@pytest.mark.usefixtures("permissive_umask")
def test_the_api_key_file_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "api-keys.json"
    _, key = generate_api_key(["infer"], name="fleet")
    ApiKeyFile(path).add(key)
    assert _mode(path) == 0o600


@pytest.mark.usefixtures("permissive_umask")
def test_a_mosquitto_password_file_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    write_private_file(path, "device-1:$7$...\n")
    assert _mode(path) == 0o600
