"""Site gateways' files (``tandem.broker._bridge``): the bridge section, the site's and
the cloud's credential files, ``tandem fleet provision --gateway``, and a report that the
uplink delivers twice. ``test_site_gateway.py`` starts brokers from these files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from model_cdn.fleet import FleetView
from model_cdn.registry import Registry
from shared import ConfigError, DeviceReport, Topics
from tandem.broker import (
    BridgeOptions,
    BrokerFiles,
    provision_dynsec,
    provision_gateway,
    provision_users,
)
from tandem.broker._acl import split_acl_blocks
from tandem.broker._bridge import render_bridge_config
from tandem.broker._dynsec import dynsec_password_matches

from ._cli import one_error_line, tandem

TOPICS = Topics()
SITE = "plant-a"


def bridge_topics(text: str) -> set[tuple[str, str, int]]:
    """The ``topic`` lines of a bridge section: (topic, direction, QoS)."""
    found = re.findall(r"^topic (\S+) (in|out) ([012])$", text, flags=re.MULTILINE)
    return {(t, d, int(q)) for t, d, q in found}


def option(text: str, name: str) -> str:
    values = re.findall(rf"^{name} (.+)$", text, flags=re.MULTILINE)
    assert len(values) == 1, (name, values)
    return str(values[0])


# -- what the bridge forwards ---------------------------------------------------------


@pytest.mark.parametrize("legacy", [True, False])
def test_bridge_forwards_requests_and_reports_out_and_each_devices_replies_and_assignments_in(
    legacy: bool,
) -> None:
    text = render_bridge_config(
        SITE,
        ["cam-02", "cam-01"],
        cloud_url="mqtt://cloud.example:1883",
        password="pw",
        legacy_topics=legacy,
    )
    p = TOPICS.prefix
    first_layout = {(f"{p}/infer/+", "out", 0)} if legacy else set()
    assert bridge_topics(text) == first_layout | {
        (f"{p}/dev/+/infer/+", "out", 0),
        (f"{p}/dev/+/status", "out", 2),
        (f"{p}/dev/+/telemetry", "out", 2),
        (f"{p}/dev/+/generate/+", "out", 1),
        (f"{p}/dev/+/generate/+/+", "out", 1),  # sticky turns, for one hub replica
        (f"{p}/dev/+/cancel", "out", 1),
        (f"{p}/dev/+/verify/+", "out", 1),  # speculative rounds
        (f"{p}/dev/+/verify/+/+", "out", 1),
        (f"{p}/dev/cam-01/reply", "in", 0),
        (f"{p}/dev/cam-01/text", "in", 1),
        (f"{p}/dev/cam-01/verified", "in", 1),
        (f"{p}/dev/cam-01/assign", "in", 1),
        (f"{p}/dev/cam-02/reply", "in", 0),
        (f"{p}/dev/cam-02/text", "in", 1),
        (f"{p}/dev/cam-02/verified", "in", 1),
        (f"{p}/dev/cam-02/assign", "in", 1),
    }
    # A persistent session on both ends, under one stable name: what queues reports.
    assert option(text, "cleansession") == option(text, "local_cleansession") == "false"
    assert option(text, "remote_clientid") == option(text, "remote_username")
    assert option(text, "remote_clientid") == f"tandem-gateway-{SITE}"
    assert option(text, "address") == "cloud.example:1883"
    assert option(text, "notifications_local_only") == "true"
    assert "bridge_cafile" not in text and "bridge_capath" not in text


def test_bridge_to_an_mqtts_cloud_verifies_it_with_the_ca_given_or_the_systems(
    tmp_path: Path,
) -> None:
    ca = tmp_path / "cloud-ca.pem"
    own = render_bridge_config(
        SITE,
        ["cam-01"],
        cloud_url="mqtts://cloud.example",
        password="pw",
        options=BridgeOptions(cafile=ca),
    )
    assert option(own, "bridge_cafile") == str(ca)
    assert option(own, "address") == "cloud.example:8883"
    assert option(own, "bridge_insecure") == "false"
    system = render_bridge_config(
        SITE, ["cam-01"], cloud_url="mqtts://cloud.example", password="pw"
    )
    assert "bridge_capath" in system and "bridge_cafile" not in system
    with pytest.raises(ConfigError, match="mqtts"):
        render_bridge_config(
            SITE,
            ["cam-01"],
            cloud_url="mqtt://cloud.example",
            password="pw",
            options=BridgeOptions(cafile=ca),
        )


@pytest.mark.parametrize(
    ("site", "devices", "url", "needle"),
    [
        ("plant/a", ["cam-01"], "mqtt://cloud:1883", "site name"),
        ("x" * 120, ["cam-01"], "mqtt://cloud:1883", "too long"),
        (SITE, ["tandem-gateway-other"], "mqtt://cloud:1883", "namespace"),
        (SITE, ["cam+1"], "mqtt://cloud:1883", "device id"),
        (SITE, [], "mqtt://cloud:1883", "at least one device"),
        (SITE, ["cam-01"], "mqtt://gw:secret@cloud:1883", "credentials"),
        (SITE, ["cam-01"], "ws://cloud:1883", "scheme"),
    ],
)
def test_names_and_urls_that_could_misroute_a_site_are_refused(
    site: str, devices: list[str], url: str, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        render_bridge_config(site, devices, cloud_url=url, password="pw")


# -- provisioning: the site's files, the cloud's files, the bridge ---------------------


@dataclass
class Provisioned:
    cloud: Path  # the cloud broker's plugin file
    site: Path  # the site broker's plugin file
    bridge: Path
    passwords: dict[str, str]  # services on the cloud, devices on the site


def provision(
    tmp_path: Path,
    cloud_url: str,
    devices: list[str],
    options: BridgeOptions | None = None,
) -> Provisioned:
    out = Provisioned(
        tmp_path / "cloud-dynsec.json", tmp_path / "site-dynsec.json", tmp_path / "bridge.conf", {}
    )
    out.passwords.update(provision_dynsec(["hub", "cdn"], dynsec_file=out.cloud).passwords)
    done = provision_gateway(
        SITE,
        devices,
        cloud_url=cloud_url,
        bridge_file=out.bridge,
        site_files=BrokerFiles(dynsec_file=out.site),
        cloud_files=BrokerFiles(dynsec_file=out.cloud),
        options=options,
    )
    out.passwords.update(done.devices.passwords)
    return out


def clients_and_roles(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    config = json.loads(path.read_text())
    return (
        {c["username"]: c for c in config["clients"]},
        {r["rolename"]: r for r in config["roles"]},
    )


def test_adding_a_device_to_a_site_keeps_the_others_and_every_other_cloud_user(
    tmp_path: Path,
) -> None:
    url = "mqtt://cloud.example:1883"
    first = provision(tmp_path, url, ["cam-01", "cam-02"])
    other = provision_gateway(  # a second site on the same cloud broker
        "plant-b",
        ["cam-09"],
        cloud_url=url,
        bridge_file=tmp_path / "bridge-b.conf",
        site_files=BrokerFiles(dynsec_file=tmp_path / "site-b.json"),
        cloud_files=BrokerFiles(dynsec_file=first.cloud),
    )
    clients_before, roles_before = clients_and_roles(first.cloud)
    more = provision_gateway(
        SITE,
        ["cam-03"],
        cloud_url=url,
        bridge_file=first.bridge,
        site_files=BrokerFiles(dynsec_file=first.site),
        cloud_files=BrokerFiles(dynsec_file=first.cloud),
    )
    assert more.site_devices == ["cam-01", "cam-02", "cam-03"]
    assert {t for t, d, _ in bridge_topics(first.bridge.read_text()) if d == "in"} == {
        f"{TOPICS.prefix}/dev/{d}/{leaf}"
        for d in more.site_devices
        for leaf in ("reply", "text", "verified", "assign")
    }
    site_clients, _ = clients_and_roles(first.site)
    assert dynsec_password_matches(site_clients["cam-01"], first.passwords["cam-01"])  # kept
    assert dynsec_password_matches(site_clients["cam-03"], more.devices.passwords["cam-03"])
    clients, roles = clients_and_roles(first.cloud)
    gateway = f"tandem-gateway-{SITE}"
    assert dynsec_password_matches(
        clients[gateway], option(first.bridge.read_text(), "remote_password")
    )
    assert clients[gateway]["clientid"] == gateway  # one connection, bound to its name
    for name in ("hub", "cdn", other.gateway):
        assert clients[name] == clients_before[name]
    assert roles["tandem-gateway-plant-b"] == roles_before["tandem-gateway-plant-b"]
    rights = {(a["acltype"], a["topic"]) for a in roles[gateway]["acls"]}
    assert ("publishClientSend", f"{TOPICS.prefix}/dev/cam-03/telemetry") in rights
    assert ("publishClientSend", f"{TOPICS.prefix}/dev/cam-03/generate/+") in rights
    assert ("publishClientSend", f"{TOPICS.prefix}/dev/cam-03/generate/+/+") in rights
    assert ("publishClientReceive", f"{TOPICS.prefix}/dev/cam-03/text") in rights
    assert not any("cam-09" in topic for _, topic in rights)  # plant-b's device


def test_provisioning_devices_on_the_cloud_broker_keeps_the_gateways(tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.json"
    provision_gateway(
        SITE,
        ["cam-01"],
        cloud_url="mqtt://cloud:1883",
        bridge_file=tmp_path / "bridge.conf",
        site_files=BrokerFiles(dynsec_file=tmp_path / "site.json"),
        cloud_files=BrokerFiles(dynsec_file=cloud),
    )
    before = clients_and_roles(cloud)
    provision_dynsec(["hub", "cdn", "direct-cam"], dynsec_file=cloud)
    clients, roles = clients_and_roles(cloud)
    gateway = f"tandem-gateway-{SITE}"
    assert clients[gateway] == before[0][gateway] and roles[gateway] == before[1][gateway]
    assert "tandem-device-direct-cam" in roles


def test_plain_files_keep_each_gateways_block_through_every_rewrite(tmp_path: Path) -> None:
    passwd, acl = tmp_path / "cloud.passwd", tmp_path / "cloud.acl"
    cloud = BrokerFiles(passwd_file=passwd, acl_file=acl)

    def gateway(site: str, devices: list[str]) -> None:
        provision_gateway(
            site,
            devices,
            cloud_url="mqtt://cloud:1883",
            bridge_file=tmp_path / f"{site}.conf",
            site_files=BrokerFiles(
                passwd_file=tmp_path / f"{site}.passwd", acl_file=tmp_path / f"{site}.acl"
            ),
            cloud_files=cloud,
        )

    provision_users(["hub", "cdn"], passwd_file=passwd, acl_file=acl)
    gateway("plant-a", ["cam-01"])
    gateway("plant-b", ["cam-02"])
    gateway("plant-a", ["cam-03"])  # plant-a again: its block replaced, not doubled
    provision_users(["direct-cam"], passwd_file=passwd, acl_file=acl)  # rewrites the ACL
    rest, blocks = split_acl_blocks(acl.read_text())
    assert list(blocks) == ["tandem-gateway-plant-a", "tandem-gateway-plant-b"]
    assert "cam-01/telemetry" in blocks["tandem-gateway-plant-a"]
    assert "cam-03/telemetry" in blocks["tandem-gateway-plant-a"]
    assert "cam-02" not in blocks["tandem-gateway-plant-a"]
    assert "user hub" in rest and "cam-0" not in rest
    users = [line.split(":")[0] for line in passwd.read_text().splitlines()]
    assert sorted(users) == sorted(
        ["hub", "cdn", "tandem-gateway-plant-a", "tandem-gateway-plant-b", "direct-cam"]
    )
    site_acl = (tmp_path / "plant-a.acl").read_text()
    assert f"pattern write {TOPICS.prefix}/infer/+" not in site_acl  # first layout: opt-in


@pytest.mark.parametrize(
    "text",
    [
        "# BEGIN tandem-gateway-a\nuser x\n",
        "# BEGIN a\n# BEGIN b\n# END b\n# END a\n",
        "# BEGIN a\n# END a\n# BEGIN a\n# END a\n",
    ],
)
def test_a_broken_acl_block_is_refused_not_dropped(text: str) -> None:
    with pytest.raises(ConfigError):
        split_acl_blocks(text)


def test_nothing_is_written_when_a_file_cannot_be_read(tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.json"
    cloud.write_text("{not json")
    with pytest.raises(ConfigError, match="not a dynamic-security"):
        provision_gateway(
            SITE,
            ["cam-01"],
            cloud_url="mqtt://cloud:1883",
            bridge_file=tmp_path / "bridge.conf",
            site_files=BrokerFiles(dynsec_file=tmp_path / "site.json"),
            cloud_files=BrokerFiles(dynsec_file=cloud),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cloud.json"]


# -- a report delivered twice ---------------------------------------------------------


def test_a_report_the_uplink_delivered_twice_is_one_registry_row_with_the_same_counters(
    registry: Registry,
) -> None:
    """Devices publish reports at QoS 1, so the bridge forwards them at QoS 1: one in
    flight when the uplink died is sent again after the restore, and the cloud may take
    it twice (docs/site-gateways.md). A report is a snapshot (counters since the version
    started serving), so applying it again changes no count, only when it was last heard."""

    def report(at: float, requests: int) -> DeviceReport:
        return DeviceReport(
            device="cam-01", at=at, model="linear", version=1, requests=requests, offloads=3
        )

    first, second = report(100.0, 40), report(130.0, 55)
    once, twice = FleetView(), FleetView()
    for view, arrivals in ((once, [first, second]), (twice, [first, second, second])):
        for k, r in enumerate(arrivals):
            view.observe_report(r, 1000.0 + k)
    registry.upsert_devices(once.take_dirty())
    row_once = registry.get_device("cam-01")
    registry.upsert_devices(twice.take_dirty())
    rows = registry.list_devices()
    assert [r.device for r in rows] == ["cam-01"]
    assert rows[0].telemetry is not None and row_once.telemetry is not None
    assert rows[0].telemetry["at"] == row_once.telemetry["at"] == second.at
    counters = ("requests", "errors", "offloads", "agreement_samples", "agreed")
    assert {c: rows[0].telemetry[c] for c in counters} == {
        c: row_once.telemetry[c] for c in counters
    }
    assert rows[0].models == row_once.models and rows[0].first_seen == row_once.first_seen
    assert rows[0].last_seen == 1002.0  # heard again: only the time moves


# -- the command line ------------------------------------------------------------------


def test_cli_writes_the_site_the_cloud_and_the_bridge_and_prints_only_device_passwords(
    tmp_path: Path,
) -> None:
    result = tandem(
        "fleet", "provision", "cam-01", "cam-02", "--gateway", SITE,
        "--dynsec-file", "site.json", "--bridge-file", "bridge.conf",
        "--cloud-broker", "mqtts://cloud.example:8883", "--bridge-cafile", "/etc/ca.pem",
        "--cloud-dynsec-file", "cloud.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    printed = dict(line.split(" ") for line in result.stdout.splitlines())
    assert sorted(printed) == ["cam-01", "cam-02"]  # the gateway's password is in its file
    bridge = (tmp_path / "bridge.conf").read_text()
    assert option(bridge, "bridge_cafile") == "/etc/ca.pem"
    assert "tandem-gateway-plant-a" in result.stderr and "bridge.conf" in result.stderr
    for name in ("site.json", "bridge.conf", "cloud.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dynsec-file", "s.json", "--bridge-file", "b.conf"], "need --gateway"),
        (["--dynsec-file", "s.json", "--gateway", SITE], "--cloud-broker and --bridge-file"),
        (
            ["--dynsec-file", "s.json", "--gateway", SITE, "--cloud-broker", "mqtt://c",
             "--bridge-file", "b.conf"],
            "--cloud-dynsec-file",
        ),
        (
            ["--dynsec-file", "s.json", "--gateway", SITE, "--cloud-broker", "mqtt://c",
             "--bridge-file", "s.json", "--cloud-dynsec-file", "c.json"],
            "must all differ",
        ),
        (
            ["--dynsec-file", "s.json", "--gateway", "a/b", "--cloud-broker", "mqtt://c",
             "--bridge-file", "b.conf", "--cloud-dynsec-file", "c.json"],
            "site name",
        ),
    ],
)  # fmt: skip
def test_cli_gateway_mistakes_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    result = tandem("fleet", "provision", "cam-01", *args, cwd=tmp_path)
    one_error_line(result, 2, needle)
    assert list(tmp_path.iterdir()) == []
