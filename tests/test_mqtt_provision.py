"""``tandem fleet provision`` offline: password hashes, merges, the ACL text, private
files and the command line (the broker attacks are in ``test_mqtt_acl.py``)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shared import ConfigError
from tandem.broker import mosquitto_password_hash, write_private_file
from tandem.broker._acl import (
    check_device_names,
    merge_password_file,
    password_file_users,
    password_line,
    render_acl_file,
    verify_mosquitto_password,
)

from ._cli import tandem_env

P = "tandem/v1"
QUIET_S = 0.4  # after a positive control, this long without a message means "not delivered"
WAIT_S = 5.0  # bound on waiting for something that should happen


def tandem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = tandem_env()
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_password_hash_round_trips_and_rejects_a_wrong_password() -> None:
    h = mosquitto_password_hash("pw", salt=b"0123456789ab")
    assert h.startswith("$7$101$") and h == mosquitto_password_hash("pw", salt=b"0123456789ab")
    assert verify_mosquitto_password(h, "pw")
    assert not verify_mosquitto_password(h, "pW")
    assert not verify_mosquitto_password("$6$x$y", "pw")


def test_merge_adds_and_rotates_without_dropping_others_and_is_idempotent() -> None:
    text = "# fleet\nalpha:$7$1$AA==$AA==\n\nbeta:$7$1$BB==$BB==\n"
    rotated = password_line("alpha", "new", salt=b"s" * 12)
    added = password_line("gamma", "g", salt=b"t" * 12)
    merged = merge_password_file(text, [rotated, added])
    assert merged == f"# fleet\n{rotated}\nbeta:$7$1$BB==$BB==\n{added}"
    assert merge_password_file(merged, [rotated, added]) == merged
    assert password_file_users(merged) == ["alpha", "beta", "gamma"]


@pytest.mark.parametrize("text", ["no-colon-here\n", "a:$7$1$A$A\na:$7$1$B$B\n", ":hash\n"])
def test_malformed_password_file_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        merge_password_file(text, [])


def test_a_device_may_not_take_a_service_users_name() -> None:
    with pytest.raises(ConfigError, match="hub"):
        check_device_names(["cam-1", "hub"], hub_user="hub", cdn_user="cdn")
    with pytest.raises(ConfigError):
        check_device_names(["cam/1"], hub_user="hub", cdn_user="cdn")
    with pytest.raises(ConfigError):
        render_acl_file("x/+/y")
    with pytest.raises(ConfigError):
        render_acl_file(hub_user="svc", cdn_user="svc")


def test_acl_uses_the_prefix_and_user_names() -> None:
    acl = render_acl_file("acme/v2", hub_user="hubs", cdn_user="rollout")
    assert "pattern read acme/v2/dev/%u/reply\n" in acl
    assert "user hubs\ntopic read acme/v2/dev/+/infer/+\n" in acl
    assert "pattern write acme/v2/dev/%u/infer/+\n" in acl
    assert "pattern write acme/v2/dev/%u/generate/+\n" in acl
    assert "pattern write acme/v2/dev/%u/generate/+/+\n" in acl  # sticky turns
    assert "topic read acme/v2/dev/+/generate/+/+\n" in acl
    assert "pattern read acme/v2/dev/%u/text\n" in acl
    assert "topic read acme/v2/dev/+/cancel\n" in acl
    assert "pattern write acme/v2/dev/%u/verify/+\n" in acl  # speculative rounds
    assert "pattern read acme/v2/dev/%u/verified\n" in acl
    assert "topic read acme/v2/dev/+/verify/+/+\ntopic write acme/v2/dev/+/reply\n" in acl
    assert "topic write acme/v2/dev/+/verified\n" in acl
    assert "user rollout\ntopic write acme/v2/dev/+/assign\n" in acl
    assert "tandem/v1" not in acl


def test_private_files_are_written_whole_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("old")
    path.chmod(0o644)
    write_private_file(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary left behind


def test_cli_prints_passwords_once_and_writes_private_files(tmp_path: Path) -> None:
    result = tandem(
        "fleet", "provision", "cam-1", "--passwd-file", "p", "--acl-file", "a", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    user, password = result.stdout.split()
    assert user == "cam-1" and len(password) >= 40
    line = (tmp_path / "p").read_text()
    assert verify_mosquitto_password(line.strip().split(":", 1)[1], password)
    for name in ("p", "a"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["hub", "x/y"], 2, "invalid device id"),
        (["cam-1", "cam-1"], 2, "twice"),
        (["cam-1", "--prefix", "a/#"], 2, "prefix"),
        (["cam-1", "--hub-user", "cdn"], 2, "different"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    result = tandem(
        "fleet", "provision", *args, "--passwd-file", "p", "--acl-file", "a", cwd=tmp_path
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("tandem fleet provision:"), lines
    assert needle in lines[0]
    assert not (tmp_path / "p").exists()


def test_cli_help_has_an_example_and_the_reload_note(tmp_path: Path) -> None:
    result = tandem("fleet", "provision", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "tandem fleet provision hub cdn" in result.stdout
    assert "kill -HUP" in result.stdout


def test_provisioning_legacy_topics_says_it_is_unsafe(tmp_path: Path) -> None:
    args = ("fleet", "provision", "dev-a", "--dynsec-file", "d.json", "--password-out", "pw")
    quiet = tandem(*args, cwd=tmp_path)
    assert quiet.returncode == 0 and "legacy" not in quiet.stderr
    warned = tandem(*args, "--legacy-topics", cwd=tmp_path)
    assert warned.returncode == 0
    assert "warning: --legacy-topics" in warned.stderr and "another device" in warned.stderr
