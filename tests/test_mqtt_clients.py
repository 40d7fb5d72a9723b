"""Every MQTT client of ours goes through one session interface (``shared.MqttSession``).

Connecting, reconnecting, re-subscribing and failing pending work live in one
place (the interface, ``shared/_mqtt_session.py``; its implementations
``shared/_paho_session.py`` and the hub's awscrt twin
``cloud_hub/mqtt/_crt_session.py``), so no product module may build an MQTT client
of its own: only ``shared/_mqtt*.py``, ``shared/_paho_session.py``,
``cloud_hub/mqtt/_crt_session.py`` and
``tandem/simulator/`` (which drives a thousand simulated devices' clients on
one thread by design, with paho's external-loop API) create a paho-mqtt or
awscrt client or call ``shared.create_client``. Tests and ``bench/`` (whose
baselines measure a bare paho client on purpose) are not product code.

The check reads each module's syntax tree: a call of ``create_client``, or of a
``Client`` in a module that imports paho-mqtt or awscrt.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("shared", "edge_agent", "cloud_hub", "model_cdn", "tandem", "examples")
ALLOWED = (
    "shared/_mqtt",
    "shared/_paho_session.py",
    "cloud_hub/mqtt/_crt_session.py",
    "tandem/simulator/",
)


def imports_a_client_library(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        if any(name.startswith(("paho.mqtt", "awscrt")) for name in names):
            return True
    return False


def client_constructions(tree: ast.AST) -> list[int]:
    """Line numbers of calls that build an MQTT client."""
    clients = imports_a_client_library(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name == "create_client" or (clients and name == "Client"):
            lines.append(node.lineno)
    return lines


def product_modules() -> list[Path]:
    return sorted(path for top in PRODUCT for path in (ROOT / top).rglob("*.py"))


def test_only_the_session_modules_and_the_simulator_build_mqtt_clients() -> None:
    found: dict[str, list[int]] = {}
    for path in product_modules():
        relative = path.relative_to(ROOT).as_posix()
        lines = client_constructions(ast.parse(path.read_text(), filename=relative))
        if lines and not relative.startswith(ALLOWED):
            found[relative] = lines
    assert not found, f"MQTT clients built outside shared.MqttSession: {found}"


def test_the_check_sees_the_clients_the_allowed_modules_build() -> None:
    """A positive control: the scan finds the clients that do exist."""
    seen = set()
    for path in product_modules():
        relative = path.relative_to(ROOT).as_posix()
        if client_constructions(ast.parse(path.read_text())):
            seen.add(relative)
    assert {
        "shared/_mqtt.py",
        "shared/_paho_session.py",
        "cloud_hub/mqtt/_crt_session.py",
    } <= seen
    assert any(name.startswith("tandem/simulator/") for name in seen)


def test_a_module_that_builds_its_own_client_is_found() -> None:
    direct = "import paho.mqtt.client as mqtt\nc = mqtt.Client(client_id='x')\n"
    helper = "from shared import create_client\nc = create_client(settings, 'x')\n"
    unrelated = "from httpx import Client\nc = Client()\n"
    assert client_constructions(ast.parse(direct)) == [2]
    assert client_constructions(ast.parse(helper)) == [2]
    assert client_constructions(ast.parse(unrelated)) == []
