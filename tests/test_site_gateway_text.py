"""Text turns through a site gateway: a device on the site broker, the hub on the cloud one.

Both brokers are real Mosquittos with the dynamic-security plugin, provisioned by
``tandem fleet provision`` as an operator would; the bridge is Mosquitto's own.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from cloud_hub import Hub
from edge_agent import CloudTextSettings, EdgeAgent, FinishReason, Source
from shared import MqttSettings
from tandem.demo.language import build_language_models, greedy_generate

from ._brokers import free_port
from ._cli import tandem
from ._language import tiny_recipe
from ._site_net import GatewayBroker
from .test_site_gateway import cloud_broker, needs_plugin
from .test_site_gateway_files import SITE

PROMPT = "def f(x):"


def test_a_site_device_s_cloud_only_turn_streams_through_the_bridge(tmp_path: Path) -> None:
    plugin = needs_plugin()
    built = build_language_models(tmp_path / "lm-cache", recipe=tiny_recipe(context=128))
    repo = tmp_path / "repo"
    shutil.copytree(built.hub_model, repo / "tiny" / "1")
    (repo / "tiny" / "config.json").write_text(json.dumps({"platform": "onnxruntime_genai"}))
    cloud_port, site_port = free_port(), free_port()
    assert tandem(
        "fleet", "provision", "hub", "cdn", "--dynsec-file", "cloud.json",
        "--password-out", "services.txt", cwd=tmp_path,
    ).returncode == 0  # fmt: skip
    result = tandem(
        "fleet", "provision", "cam-01", "--gateway", SITE,
        "--dynsec-file", "site.json", "--bridge-file", "bridge.conf",
        "--cloud-broker", f"mqtt://127.0.0.1:{cloud_port}", "--cloud-dynsec-file", "cloud.json",
        "--password-out", "devices.txt", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    pw = dict(
        line.split(" ")
        for name in ("services.txt", "devices.txt")
        for line in (tmp_path / name).read_text().splitlines()
    )
    with ExitStack() as stack:
        cloud = cloud_broker(tmp_path, cloud_port, tmp_path / "cloud.json").start()
        stack.callback(cloud.stop)
        hub_url = f"mqtt://hub:{pw['hub']}@127.0.0.1:{cloud_port}"
        stack.enter_context(Hub(repo, mqtt=MqttSettings.from_url(hub_url)))
        gateway = GatewayBroker(
            tmp_path, address="127.0.0.1", port=site_port, plugin=plugin,
            dynsec_file=tmp_path / "site.json", bridge_file=tmp_path / "bridge.conf",
        ).start()  # fmt: skip
        stack.callback(gateway.stop)
        settings = MqttSettings(
            host=gateway.address, port=gateway.port, username="cam-01", password=pw["cam-01"]
        )
        agent = EdgeAgent(
            None, device_id="cam-01", broker=settings, language_model=built.device_model,
            cloud_language_model="tiny", cloud_text=CloudTextSettings(first_chunk_s=2.0),
        )  # fmt: skip
        stack.enter_context(agent)
        end = time.monotonic() + 30  # the bridge comes up by itself
        while True:
            record = agent.generate(PROMPT, max_tokens=24, preset="cloud_only").final()
            if record.finish_reason is not FinishReason.ERROR:
                break
            if time.monotonic() > end:
                pytest.fail(f"no turn through the bridge within 30 s: {record.error}")
            time.sleep(0.2)
        stream = agent.generate(PROMPT, max_tokens=24, preset="cloud_only")
        chunks = list(stream)
    assert {c.source for c in chunks} == {Source.CLOUD}
    assert stream.result is not None and not stream.result.degraded
    assert "".join(c.text for c in chunks) == greedy_generate(built.hub_model, PROMPT, 24).text
