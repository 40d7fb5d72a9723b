"""A simulated device is built from the edge SDK's own pieces: pure checks, no network.

Its trust decisions are ``edge_agent.updater.UpdateTrust``'s (the same
refusals, for the same reasons, as a real device's updater given the same
documents in the same order) and its telemetry is an ``AgentMetrics``
snapshot, as a real agent's ``TelemetryReporter`` publishes it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from edge_agent import AgentMetrics, UntrustedUpdateError
from edge_agent.updater import TrustRecord, UpdateTrust
from model_cdn import make_assignment
from shared import DeviceReport, SigningKey, UpdateState, format_time, sign_document
from tandem.simulator import SimulatorConfig
from tandem.simulator._device import SimulatedDevice, draw_traits

KEY = SigningKey.generate()
STRANGER = SigningKey.generate()
DEVICE, MODEL = "sim-0001", "mnist"


def device(**options: Any) -> SimulatedDevice:
    config = SimulatorConfig(devices=1, trusted_keys=(KEY.public_key,), model=MODEL, **options)
    return SimulatedDevice(
        DEVICE, config=config, labels={}, traits=draw_traits(config)[0], now=time.time()
    )


def signed(version: int, **over: Any) -> bytes:
    doc = make_assignment(KEY, device=DEVICE, model=MODEL, version=version)
    return json.dumps(doc).encode() if not over else _resigned(doc, **over)


def _resigned(doc: dict[str, Any], *, key: SigningKey = KEY, **fields: Any) -> bytes:
    return json.dumps(sign_document({**doc["signed"], **fields}, key)).encode()


def test_a_simulated_device_refuses_what_the_updater_refuses_and_says_why() -> None:
    sim = device(initial_version=1)
    real = UpdateTrust([KEY.public_key], device_id=DEVICE, model=MODEL, record=TrustRecord(1))
    now = datetime.now(UTC).replace(microsecond=0)
    later = format_time(now + timedelta(minutes=5))
    first = signed(3)
    base = json.loads(first)
    tampered = json.loads(first)
    tampered["signed"]["version"] = 4  # altered after signing
    documents = [
        _resigned(base, device="sim-0002"),
        _resigned(base, model="other"),
        _resigned(base, key=STRANGER),
        json.dumps(tampered).encode(),
        _resigned(
            base,
            issued_at=format_time(now - timedelta(days=2)),
            expires_at=format_time(now - timedelta(days=1)),
        ),
        first,  # accepted: installs version 3
        _resigned(base, version=2, issued_at=later),  # below 3, no rollback
        _resigned(base, version=4, issued_at=format_time(now - timedelta(hours=1))),  # a replay
        _resigned(base, version=2, rollback=True, issued_at=later),  # accepted: a rollback
    ]
    outcomes = []
    for raw in documents:
        decision = sim.on_assignment(raw, time.time())
        try:
            accepted = real.accept_assignment(raw)
        except UntrustedUpdateError as e:
            assert decision.install is None and decision.report is not None
            assert decision.report.state is UpdateState.FAILED
            assert decision.report.reason == str(e)
            outcomes.append("refused")
            continue
        assert decision.install is not None and decision.install.version == accepted.version
        sim.download_finished(None, time.time())
        installed = sim.install_finished(time.time())
        assert installed.state in (UpdateState.INSTALLED, UpdateState.ROLLED_BACK)
        real.record = real.after_commit(accepted)  # what the real updater does on commit
        outcomes.append("installed")
    assert outcomes.count("installed") == 2 and sim.running_version == 2
    assert outcomes.count("refused") == len(documents) - 2


def test_a_manifest_for_another_version_is_refused_as_the_updater_refuses_it() -> None:
    sim = device()
    decision = sim.on_assignment(signed(2), time.time())
    assert decision.install is not None
    now = datetime.now(UTC).replace(microsecond=0)
    manifest = sign_document(
        {
            "type": "manifest",
            "spec_version": "1.0",
            "name": MODEL,
            "version": 3,
            "format": "onnx",
            "blob": {"digest": "sha256:" + "ab" * 32, "size": 10, "raw_size": 20},
            "published_at": format_time(now),
            "expires_at": format_time(now + timedelta(days=1)),
        },
        KEY,
    )
    raw = json.dumps(manifest).encode()
    real = UpdateTrust([KEY.public_key], device_id=DEVICE, model=MODEL)
    try:
        real.accept_manifest(raw, decision.install)
    except UntrustedUpdateError as e:
        expected = str(e)
    else:
        raise AssertionError("the updater accepted a manifest for another version")
    try:
        sim.accept_manifest(raw, decision.install)
    except Exception as e:
        assert str(e) == expected
    else:
        raise AssertionError("the simulated device accepted a manifest for another version")


def test_telemetry_is_an_agent_snapshot_whose_version_counters_restart_on_install() -> None:
    sim = device(requests_per_s=(50.0, 50.0))
    start = time.time()
    before = sim.telemetry(start + 10)
    assert isinstance(before, AgentMetrics)
    payload = before.to_json()
    assert AgentMetrics.from_dict(json.loads(payload)) == before  # what a real agent sends
    report = DeviceReport.from_json(payload)
    assert report.version == 1 and report.requests > 0
    decision = sim.on_assignment(signed(2), start + 10)
    assert decision.install is not None
    sim.download_finished(None, start + 10)
    sim.install_finished(start + 10)
    after = sim.telemetry(start + 11)
    report_after = DeviceReport.from_json(after.to_json())
    assert report_after.version == 2
    assert report_after.requests < report.requests  # since version 2 started serving
    assert after.requests == before.requests + report_after.requests  # the agent's own total
    assert after.serving.since is not None and after.serving.since > start
