"""The Mosquitto dynamic-security file that ``tandem fleet provision --dynsec-file`` writes:
what it keeps, how it hashes, which names it refuses, and the roles it renders.

The broker tests that start Mosquitto from this file, named after the attacks
they stage, live in ``test_mqtt_acl.py`` (each runs on the plugin and on the
plain files).
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from shared import ConfigError
from tandem.broker import provision_dynsec, render_dynsec_config
from tandem.broker._dynsec import dynsec_password_matches

from ._needs import need
from .test_mqtt_acl import tandem


def test_dynsec_file_keeps_what_it_does_not_manage_and_hashes_as_the_plugin(
    tmp_path: Path,
) -> None:
    need(None if shutil.which("mosquitto_ctrl") else "needs mosquitto_ctrl (Mosquitto 2)")
    path = tmp_path / "dynsec.json"
    subprocess.run(
        ["mosquitto_ctrl", "dynsec", "init", str(path), "admin", "admin-pw"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    admin = json.loads(path.read_text())["clients"][0]
    assert dynsec_password_matches(admin, "admin-pw")  # our check agrees with the plugin's hash
    assert not dynsec_password_matches(admin, "admin-PW")
    first = provision_dynsec(["hub", "cam-1"], dynsec_file=path)
    second = provision_dynsec(["cam-2"], dynsec_file=path)
    config = json.loads(path.read_text())
    clients = {c["username"]: c for c in config["clients"]}
    assert clients["admin"] == admin  # the plugin's own admin client is untouched
    assert "admin" in {r["rolename"] for r in config["roles"]}
    assert dynsec_password_matches(clients["cam-1"], first.passwords["cam-1"])  # kept
    assert dynsec_password_matches(clients["cam-2"], second.passwords["cam-2"])
    assert clients["cam-1"]["clientid"] == "cam-1" and "clientid" not in clients["hub"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ConfigError, match="not ours"):
        provision_dynsec(["admin"], dynsec_file=path)  # not a name to take over


@pytest.mark.parametrize(
    ("devices", "needle"),
    [
        (["tandem-hub-1"], "client ids use"),
        (["cam/1"], "invalid"),
        (["hub", "cdn", "cdn"], "twice"),
    ],
)
def test_dynsec_names_that_could_take_a_services_place_are_refused(
    tmp_path: Path, devices: list[str], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        provision_dynsec(devices, dynsec_file=tmp_path / "dynsec.json")
    assert not (tmp_path / "dynsec.json").exists()


def test_dynsec_roles_use_the_prefix_group_and_legacy_choice() -> None:
    clients = {"hub": {}, "cam-1": {}}
    config = render_dynsec_config(clients, prefix="acme/v2", share_group="edge-hubs")
    roles = {r["rolename"]: r["acls"] for r in config["roles"]}
    hub = {(a["acltype"], a["topic"]) for a in roles["tandem-hub"]}
    assert ("subscribePattern", "$share/edge-hubs/acme/v2/dev/+/infer/+") in hub
    assert ("subscribePattern", "$share/edge-hubs/acme/v2/dev/+/generate/+") in hub
    assert ("subscribePattern", "$share/edge-hubs/acme/v2/dev/+/generate/+/+") in hub
    assert ("publishClientReceive", "acme/v2/dev/+/generate/+/+") in hub
    assert ("subscribePattern", "acme/v2/dev/+/cancel") in hub  # not shared
    assert ("subscribePattern", "$share/edge-hubs/acme/v2/dev/+/cancel") not in hub
    assert ("publishClientSend", "acme/v2/dev/+/text") in hub
    device = {(a["acltype"], a["topic"]) for a in roles["tandem-device-cam-1"]}
    assert ("publishClientSend", "acme/v2/dev/cam-1/infer/+") in device
    assert ("publishClientSend", "acme/v2/dev/cam-1/generate/+") in device
    assert ("publishClientSend", "acme/v2/dev/cam-1/generate/+/+") in device
    assert ("publishClientSend", "acme/v2/dev/cam-1/cancel") in device
    assert ("publishClientReceive", "acme/v2/dev/cam-1/text") in device
    assert ("publishClientSend", "acme/v2/dev/cam-1/text") not in device
    assert ("publishClientSend", "acme/v2/infer/+") not in device  # the first layout: opt-in
    migrating = render_dynsec_config(clients, legacy_topics=True, bind_client_ids=False)
    device = {a["topic"] for r in migrating["roles"] for a in r["acls"] if "cam-1" in r["rolename"]}
    assert "tandem/v1/infer/+" in device
    strict = render_dynsec_config(clients, bind_client_ids=False)
    assert all("clientid" not in c for c in strict["clients"])
    assert config["defaultACLAccess"] == {
        "publishClientSend": False,
        "publishClientReceive": False,
        "subscribe": False,
        "unsubscribe": True,
    }


@pytest.mark.parametrize(
    "files",
    [
        [],
        ["--dynsec-file", "d.json", "--passwd-file", "p", "--acl-file", "a"],
        ["--passwd-file", "p"],
    ],
    ids=["none", "both", "half"],
)
def test_cli_needs_one_configuration(tmp_path: Path, files: list[str]) -> None:
    result = tandem("fleet", "provision", "cam-1", *files, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--dynsec-file, or --passwd-file with --acl-file" in result.stderr
    assert list(tmp_path.iterdir()) == []
