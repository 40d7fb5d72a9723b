"""The rollout and fleet admin API on a real uvicorn server: status codes, auth, bodies.

The controller runs for real over a SQLite registry; devices are played by
feeding it the typed heartbeats the fleet link would parse off MQTT (the
MQTT path end to end is tests/test_rollout_fleet.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import AssignmentSender, LocalBlobStore, create_app, open_registry
from model_cdn.rollout._controller import RolloutController
from shared import DeviceReport, SigningKey, UpdateState, UpdateStatus, format_time
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key

from ._cdn import NOW, RecordingLink, make_manifest_doc, serve_in_thread

ADMIN = {"Authorization": "Bearer admin-secret"}
MODEL = "mnist"


@dataclass
class Api:
    client: httpx.Client
    controller: RolloutController
    link: RecordingLink
    keys_file: Path

    def key(self, *scopes: str) -> dict[str, str]:
        text, key = generate_api_key(scopes)
        ApiKeyFile(self.keys_file).add(key)
        return {"Authorization": f"Bearer {text}"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    key = SigningKey.generate()
    registry = open_registry(tmp_path / "registry.db")
    for v in (1, 2):
        registry.add_version(make_manifest_doc(key, MODEL, v))
    link = RecordingLink()
    controller = RolloutController(registry, AssignmentSender(link, key=key), tick_s=0.05)
    for i in range(10):
        controller.submit(
            DeviceReport(
                device=f"cam-{i}",
                at=0.0,
                labels={"site": "a" if i < 6 else "b", "hw": "npu"},
                capabilities={"runtime": "onnxruntime"},
                model=MODEL,
                version=1,
            )
        )
    controller.step()
    controller.set_labels(
        {f"cam-{i}": {"site": "a" if i < 6 else "b", "hw": "npu"} for i in range(10)}
    )
    keys_file = tmp_path / "keys.json"
    ApiKeyFile(keys_file).add(generate_api_key(["models:read"])[1])
    app = create_app(
        registry=registry,
        store=LocalBlobStore(tmp_path / "blobs"),
        admin_token="admin-secret",
        api_keys=ApiKeyGuard.from_file(keys_file),
        controller=controller,
    )
    with ExitStack() as stack:
        stack.callback(registry.close)
        controller.start()
        stack.callback(controller.stop)
        url = stack.enter_context(serve_in_thread(app))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=30, headers=ADMIN))
        yield Api(client, controller, link, keys_file)


def start_body(**overrides: Any) -> dict[str, Any]:
    return {"model": MODEL, "version": 2, "waves": "20%,100%", "soak_s": 0, **overrides}


def test_start_status_commands_and_list(api: Api) -> None:
    created = api.client.post("/v1/rollouts", json=start_body(target={"site": "a"}))
    assert created.status_code == 201, created.text
    status = created.json()
    rid = status["id"]
    assert status["state"] == "running" and status["counts"]["total"] == 1
    assert [w["planned"] for w in status["waves"]] == [1, 5]  # per wave
    assert {d for d, _doc in api.link.published} <= {f"cam-{i}" for i in range(6)}
    assert api.client.get(f"/v1/rollouts/{rid}").json()["id"] == rid
    paused = api.client.post(f"/v1/rollouts/{rid}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert api.client.post(f"/v1/rollouts/{rid}/resume").json()["state"] == "running"
    assert api.client.post(f"/v1/rollouts/{rid}/abort").json()["state"] == "aborted"
    again = api.client.post(f"/v1/rollouts/{rid}/pause")
    assert again.status_code == 409 and "aborted" in again.json()["error"]
    listed = api.client.get("/v1/rollouts").json()["rollouts"]
    assert [r["id"] for r in listed] == [rid]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (start_body(model="nope"), 404, "nope"),
        (start_body(version=7), 404, "7"),
        (start_body(waves="5%,,100%"), 400, "wave"),
        (start_body(waves="4%,100%"), 400, "would hold 0 devices"),
        (start_body(target={"site": "mars"}), 400, "no device matches"),
        (start_body(waves=None), 400, "waves"),
        ({"model": MODEL}, 400, "version"),
        (start_body(soak_s="soon"), 400, "soak_s"),
    ],
)
def test_bad_starts_are_clear_and_change_nothing(
    api: Api, body: dict[str, Any], status: int, words: str
) -> None:
    body = {k: v for k, v in body.items() if v is not None}
    response = api.client.post("/v1/rollouts", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert api.client.get("/v1/rollouts").json() == {"rollouts": []}
    assert api.link.published == []


def test_not_json_unknown_ids_and_commands(api: Api) -> None:
    assert api.client.post("/v1/rollouts", content=b"{nope").status_code == 400
    assert api.client.post("/v1/rollouts", json=[1, 2]).status_code == 400
    assert api.client.get("/v1/rollouts/ro-000000000000").status_code == 404
    rid = api.client.post("/v1/rollouts", json=start_body()).json()["id"]
    assert api.client.post(f"/v1/rollouts/{rid}/explode").status_code == 404
    conflict = api.client.post("/v1/rollouts", json=start_body())
    assert conflict.status_code == 409 and rid in conflict.json()["error"]


def test_devices_are_listed_filtered_and_shown(api: Api) -> None:
    devices = api.client.get("/v1/devices").json()["devices"]
    assert [d["device"] for d in devices] == [f"cam-{i}" for i in range(10)]
    assert devices[0]["models"] == {MODEL: 1} and devices[0]["online"] is True
    site_b = api.client.get("/v1/devices", params={"label": "site=b"}).json()["devices"]
    assert len(site_b) == 4
    on_v2 = api.client.get("/v1/devices", params={"model": MODEL, "version": 2}).json()
    assert on_v2 == {"devices": []}
    one = api.client.get("/v1/devices/cam-3").json()
    assert one["labels"] == {"site": "a", "hw": "npu"}
    assert one["telemetry"]["capabilities"] == {"runtime": "onnxruntime"}
    assert api.client.get("/v1/devices/cam-99").status_code == 404
    assert api.client.get("/v1/devices", params={"label": "site"}).status_code == 400
    assert api.client.get("/v1/devices", params={"version": 2}).status_code == 400


def test_every_route_needs_rollout_admin(api: Api) -> None:
    reader, roller = api.key("models:read"), api.key("rollout:admin")
    for method, path in (
        ("GET", "/v1/rollouts"),
        ("POST", "/v1/rollouts"),
        ("GET", "/v1/devices"),
        ("GET", "/v1/devices/cam-1"),
    ):
        anonymous = api.client.request(method, path, headers={"Authorization": ""})
        assert anonymous.status_code == 401, (method, path)
        denied = api.client.request(method, path, headers=reader, json=start_body())
        assert denied.status_code == 403, (method, path)
    allowed = api.client.post("/v1/rollouts", json=start_body(), headers=roller)
    assert allowed.status_code == 201, allowed.text


def test_without_a_controller_rollouts_are_off_and_devices_come_from_the_registry(
    tmp_path: Path,
) -> None:
    registry = open_registry(tmp_path / "registry.db")
    app = create_app(
        registry=registry, store=LocalBlobStore(tmp_path / "blobs"), admin_token="admin-secret"
    )
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN) as client:
        off = client.post("/v1/rollouts", json=start_body())
        assert off.status_code == 503 and "--sign-key" in off.json()["error"]
        assert client.get("/v1/devices").json() == {"devices": []}
    registry.close()


def test_metrics_show_rollout_progress_and_the_fleet(api: Api) -> None:
    rid = api.client.post("/v1/rollouts", json=start_body()).json()["id"]
    text = api.client.get("/metrics").text
    assigned = f'rollout="{rid}",state="running",status="assigned",version="2"'
    assert f'tandem_cdn_rollout_devices{{model="mnist",{assigned}}} 2.0' in text
    assert 'tandem_cdn_fleet_devices{online="true"} 10.0' in text
    assert f'tandem_cdn_rollout_failure_rate{{model="mnist",rollout="{rid}"' in text


# ------------------------------------------------------- issue 21: gates and plans


def test_skip_gate_needs_confirm_and_a_reason_and_is_recorded_with_who(api: Api) -> None:
    rid = api.client.post("/v1/rollouts", json=start_body()).json()["id"]
    path = f"/v1/rollouts/{rid}/skip-gate"
    unconfirmed = api.client.post(path, json={"reason": "known drop"})
    assert unconfirmed.status_code == 400 and '"confirm": true' in unconfirmed.json()["error"]
    assert api.client.post(path, json={"confirm": "yes", "reason": "x"}).status_code == 400
    no_reason = api.client.post(path, json={"confirm": True, "reason": " "})
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["error"]
    assert api.client.post(path).status_code in (400, 415)  # no body at all
    reader, roller = api.key("models:read"), api.key("rollout:admin")
    body = {"confirm": True, "reason": "known label fix"}
    assert api.client.post(path, json=body, headers=reader).status_code == 403
    history = api.client.get(f"/v1/rollouts/{rid}").json()["history"]
    assert [e["action"] for e in history] == ["start"]  # nothing skipped by the refusals
    done = api.client.post(path, json=body, headers=roller)
    assert done.status_code == 200, done.text
    status = done.json()
    key_id = roller["Authorization"].split("_")[1]
    assert status["reason"] == f"gate of wave 1 skipped by key {key_id}: known label fix"
    skip = status["history"][-1]
    assert (skip["action"], skip["by"], skip["reason"], skip["wave"]) == (
        "skip-gate",
        f"key {key_id}",
        "known label fix",
        0,
    )
    api.client.post(f"/v1/rollouts/{rid}/pause")
    assert api.client.get(f"/v1/rollouts/{rid}").json()["history"][-1]["by"] == "admin token"


def test_resume_after_pause_does_not_let_an_unjudged_wave_go_on(api: Api) -> None:
    # issue 21: pause then resume accepted the wave's inconclusive health and the next
    # wave started within 2 s
    body = start_body(max_agreement_drop=0.02, min_health_samples=10**6, max_soak_s=3600)
    status = api.client.post("/v1/rollouts", json=body).json()
    rid = status["id"]
    for device, _doc in api.link.published:
        api.controller.submit(
            UpdateStatus(
                device=device,
                model=MODEL,
                version=2,
                state=UpdateState.INSTALLED,
                at=format_time(NOW),
                running_version=2,
            )
        )
    api.controller.wait_idle()
    assert api.client.post(f"/v1/rollouts/{rid}/pause").json()["state"] == "paused"
    resumed = api.client.post(f"/v1/rollouts/{rid}/resume").json()
    assert resumed["state"] == "running" and resumed["gates"]["state"] != "waived"
    for _ in range(3):
        api.controller.step()  # ticks: the wave's installs are in, the soak (0 s) is over
    status = api.client.get(f"/v1/rollouts/{rid}").json()
    assert status["wave"] == 0 and status["counts"]["installed"] == 2, status
    assert any("health inconclusive" in w for w in status["waiting"]), status["waiting"]


def test_dry_run_answers_the_plan_and_starts_nothing(api: Api) -> None:
    body = start_body(max_agreement_drop=0.02, waves="4,100%", dry_run=True)
    answer = api.client.post("/v1/rollouts", json=body)
    assert answer.status_code == 200, answer.text
    plan = answer.json()["plan"]
    assert [(w["devices"], w["controls"]) for w in plan["waves"]] == [(4, 4), (10, 0)]
    assert plan["waves"][0]["failures_to_halt"] == 1
    assert any(
        line.startswith("wave 1: 4 devices vs 4 controls") for line in answer.json()["plan_text"]
    )
    assert api.client.get("/v1/rollouts").json() == {"rollouts": []}
    assert api.link.published == []
    bad = api.client.post("/v1/rollouts", json=start_body(dry_run="yes"))
    assert bad.status_code == 400 and "dry_run" in bad.json()["error"]


def test_a_plan_that_cannot_decide_is_refused_unless_accepted(api: Api) -> None:
    body = start_body(max_agreement_drop=0.02, waves="1,100%")  # 1 device vs 1 control
    refused = api.client.post("/v1/rollouts", json=body)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "cannot reach a decision" in error and "1 devices vs 1 controls" in error
    assert "--accept-inconclusive" in error
    assert api.client.get("/v1/rollouts").json() == {"rollouts": []}
    accepted = api.client.post("/v1/rollouts", json={**body, "accept_inconclusive": True})
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["plan"]["undecidable"] == [1]
