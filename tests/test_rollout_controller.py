"""The rollout controller over a real SQLite registry, with the clock in the test's hands.

Devices are played by feeding the controller the same typed messages the
fleet link parses off MQTT (``DeviceReport`` heartbeats, ``UpdateStatus``
reports); ``step()`` does what the worker thread does. Every assignment the
controller publishes is verified with the device-side check
(``verify_assignment``). The MQTT and HTTP path end to end is in
tests/test_rollout_fleet.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model_cdn import (
    AssignmentSender,
    ModelNotFoundError,
    RolloutConflictError,
    RolloutRequestError,
    open_registry,
)
from model_cdn.rollout import RolloutStateError
from model_cdn.rollout._controller import RolloutController
from shared import (
    DeviceReport,
    SigningKey,
    UpdateState,
    UpdateStatus,
    format_time,
    verify_assignment,
)

from ._cdn import NOW, RecordingLink, make_manifest_doc

MODEL = "mnist"


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    """The controller, its registry and what it published, plus devices to play."""

    def __init__(self, path: Path, devices: int = 20, *, labels: dict[str, str] | None = None):
        self.path, self.key, self.clock = path, SigningKey.generate(), Clock()
        self.registry = open_registry(path / "registry.db")
        for v in (1, 2, 3):
            self.registry.add_version(make_manifest_doc(self.key, MODEL, v))
        self.link = RecordingLink()
        self.controller = self._controller()
        self.running: dict[str, int] = {}
        inventory = {}  # the operator's labels: what a rollout targets
        for i in range(devices):
            inventory[f"dev-{i:03d}"] = labels or {"site": "a" if i % 2 else "b"}
            self.heartbeat(f"dev-{i:03d}", 1, labels=inventory[f"dev-{i:03d}"])
        self.controller.step()
        self.controller.set_labels(inventory)

    def _controller(self) -> RolloutController:
        sender = AssignmentSender(self.link, key=self.key)
        return RolloutController(self.registry, sender, clock=self.clock)

    def restart(self) -> None:
        self.controller.stop()
        self.registry.close()
        self.registry = open_registry(self.path / "registry.db")
        self.controller = self._controller()
        self.controller.start()  # re-publishes; the worker runs until stop()
        self.controller.stop()

    def heartbeat(
        self,
        device: str,
        version: int,
        *,
        labels: dict[str, str] | None = None,
        requests: int = 0,
        agreed_share: float = 0.97,
    ) -> None:
        self.running[device] = version
        compared = requests // 5
        self.controller.submit(
            DeviceReport(
                device=device,
                at=self.clock.now,
                labels=labels or {"site": "a"},
                model=MODEL,
                version=version,
                requests=requests,
                offloads=compared,
                agreement_samples=compared,
                agreed=round(compared * agreed_share),
                p99_ms=5.0,
            )
        )

    def report(self, device: str, version: int, state: str = "installed") -> None:
        installed = state == "installed"
        if installed:
            self.running[device] = version
        self.controller.submit(
            UpdateStatus(
                device=device,
                model=MODEL,
                version=version,
                state=UpdateState(state),
                at=format_time(NOW),
                running_version=version if installed else self.running.get(device),
            )
        )

    def take(self) -> list[tuple[str, int, bool]]:
        """(device, version, rollback) of every assignment published since the last call."""
        out = []
        for device, doc, wait_s in self.link.sent:
            a = verify_assignment(doc, [self.key.public_key])
            assert a.device == device and a.model == MODEL
            assert wait_s is None  # the controller never stalls on the broker
            assert self.registry.get_assignment(device, MODEL) is not None
            out.append((device, a.version, a.rollback))
        self.link.clear()
        return out

    def install_all(
        self, assignments: list[tuple[str, int, bool]], fail: frozenset[str] = frozenset()
    ) -> None:
        for device, version, _rb in assignments:
            self.report(device, version, "failed" if device in fail else "installed")

    def advance(self, seconds: float) -> dict[str, Any]:
        self.clock.now += seconds
        self.controller.step()
        return self.status()

    def status(self) -> dict[str, Any]:
        [latest] = self.controller.rollouts()[:1]
        return latest

    def start(self, **body: Any) -> dict[str, Any]:
        body = {"model": MODEL, "version": 2, "waves": "10%,50%,100%", "soak_s": 60, **body}
        return self.controller.create(body)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_waves_progress_and_complete(fleet: Fleet) -> None:
    status = fleet.start()
    assert (status["state"], status["wave"], status["previous_version"]) == ("running", 0, 1)
    assert [w["planned"] for w in status["waves"]] == [2, 8, 10]
    seen: list[str] = []
    for wave in range(3):
        sent = fleet.take()
        assert len(sent) == status["waves"][wave]["planned"]
        assert all(v == 2 and not rb for _d, v, rb in sent)
        seen += [d for d, _v, _rb in sent]
        fleet.install_all(sent)
        assert fleet.advance(1)["wave"] == wave  # soaking: no next wave yet
        status = fleet.advance(60)
    assert status["state"] == "completed"
    assert status["counts"]["installed"] == 20
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 20  # each device once
    # devices can also poll what they were sent
    assert fleet.registry.get_assignment("dev-000", MODEL) is not None


def test_failures_halt_the_wave_even_when_two_waves_report_at_once(fleet: Fleet) -> None:
    fleet.start(max_failure_rate=0.1, waves="2,4,100%", soak_s=0)
    first = fleet.take()
    fleet.install_all(first)
    fleet.advance(1)
    second = fleet.take()
    assert len(second) == 2
    # wave 1's late duplicate and wave 2's failures arrive in one batch
    fleet.install_all(first)
    fleet.install_all(second, fail=frozenset({second[0][0]}))
    status = fleet.advance(0)
    assert status["state"] == "halted", status
    assert "failure rate 1/4" in status["reason"]
    assert fleet.advance(600)["wave"] == 1 and fleet.take() == []  # halted never advances


def test_agreement_drop_on_the_new_version_halts(fleet: Fleet) -> None:
    fleet.start(
        max_agreement_drop=0.05, min_health_samples=100, waves="50%,100%", soak_s=10, looks=1
    )
    sent = fleet.take()
    fleet.install_all(sent)
    new = {d for d, _v, _rb in sent}
    for requests in (1000, 2000):  # control devices count from their first heartbeat
        for device, version in fleet.running.items():
            bad = device in new
            fleet.heartbeat(device, version, requests=requests, agreed_share=0.6 if bad else 0.97)
        fleet.advance(1)
    status = fleet.advance(9)
    assert status["state"] == "halted", (status["waiting"], status["gates"])
    assert "health gate: agreement drop" in status["reason"]
    [judgement] = status["gates"]["judgements"]
    assert judgement["new"]["estimate"] == pytest.approx(0.6, abs=0.01)
    assert judgement["control"]["devices"] == len(new) == 10
    assert fleet.take() == []


def test_a_heartbeats_labels_do_not_move_a_device_into_a_target(fleet: Fleet) -> None:
    fleet.heartbeat("dev-000", 1, labels={"site": "a"})  # the operator said site b
    fleet.controller.step()
    record = fleet.controller.device("dev-000")
    assert record is not None and record.labels == {"site": "b"}
    status = fleet.start(target={"site": "a"}, waves="100%")
    assert status["counts"]["total"] == 10
    assert "dev-000" not in {d for d, _v, _rb in fleet.take()}


def test_pause_holds_new_devices_and_resume_sends_them(fleet: Fleet) -> None:
    status = fleet.start(waves="50%,100%", soak_s=0)
    rid = status["id"]
    fleet.install_all(fleet.take())
    assert fleet.controller.command(rid, "pause")["state"] == "paused"
    fleet.heartbeat("late-1", 1)  # joins the current wave, queued while paused
    assert fleet.advance(10)["counts"]["queued"] == 1 and fleet.take() == []
    assert fleet.controller.command(rid, "resume")["state"] == "running"
    assert fleet.take() == [("late-1", 2, False)]
    assert fleet.controller.command(rid, "abort")["state"] == "aborted"
    with pytest.raises(RolloutStateError, match="cannot pause a rollout that is aborted"):
        fleet.controller.command(rid, "pause")


def test_rollback_sends_every_device_back_and_is_tracked(fleet: Fleet) -> None:
    rid = fleet.start(waves="50%,100%", soak_s=0, max_failure_rate=0.0)["id"]
    sent = fleet.take()
    fleet.install_all(sent[:-1])
    fleet.report(sent[-1][0], 2, "failed")
    assert fleet.advance(1)["state"] == "halted"
    status = fleet.controller.command(rid, "rollback")
    assert status["state"] == "rolling_back"
    back = fleet.take()
    assert sorted(back) == sorted((d, 1, True) for d, _v, _rb in sent)
    for device, _v, _rb in back[:-1]:
        fleet.report(device, 1)
    assert fleet.advance(1)["state"] == "rolling_back"  # one device has not come back yet
    fleet.heartbeat(back[-1][0], 1)  # its heartbeat shows the previous version: back
    assert fleet.advance(1)["state"] == "rolled_back"


def test_a_restarted_controller_resumes_where_it_was(fleet: Fleet) -> None:
    rid = fleet.start(waves="10%,50%,100%", soak_s=30)["id"]
    first = fleet.take()
    fleet.install_all(first)
    fleet.advance(31)
    second = fleet.take()
    fleet.install_all(second[:3])
    fleet.controller.step()
    fleet.restart()
    # the devices that had not reported get their assignment again on start
    assert sorted(d for d, _v, _rb in fleet.take()) == sorted(d for d, _v, _rb in second[3:])
    status = fleet.controller.get(rid)
    assert (status["state"], status["wave"], status["counts"]["installed"]) == ("running", 1, 5)
    fleet.install_all(second[3:])
    status = fleet.advance(31)
    third = fleet.take()
    assert len(third) == 10 and status["wave"] == 2
    fleet.install_all(third)
    assert fleet.advance(31)["state"] == "completed"


def test_a_heartbeat_on_the_new_version_counts_as_installed(fleet: Fleet) -> None:
    fleet.start(waves="100%", soak_s=0)
    for device, version, _rb in fleet.take():
        fleet.heartbeat(device, version)  # status reports lost; heartbeats tell the truth
    assert fleet.advance(1)["state"] == "completed"


def test_devices_timing_out_count_as_failures(fleet: Fleet) -> None:
    fleet.start(waves="100%", soak_s=0, device_timeout_s=300, max_failure_rate=0.5)
    sent = fleet.take()
    fleet.install_all(sent[:15])
    status = fleet.advance(301)
    assert status["counts"]["timed_out"] == 5 and status["state"] == "completed"


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({"model": "nope"}, ModelNotFoundError, "nope"),
        ({"version": 9}, ModelNotFoundError, "9"),
        ({"waves": "5%,,100%"}, RolloutRequestError, "wave"),
        ({"waves": "50%,10%"}, RolloutRequestError, "increase"),
        ({"waves": "1%,100%"}, RolloutRequestError, "would hold 0 devices"),
        ({"target": {"site": "mars"}}, RolloutRequestError, "no device matches"),
        ({"max_failure_rate": 2}, RolloutRequestError, "max_failure_rate"),
        ({"colour": "red"}, RolloutRequestError, "unknown field"),
        ({"version": 1, "previous_version": None}, RolloutRequestError, "no version below"),
    ],
)
def test_bad_requests_change_nothing(
    fleet: Fleet, body: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fleet.start(**body)
    assert fleet.controller.rollouts() == [] and fleet.registry.list_rollouts() == []
    assert fleet.take() == []


def test_one_active_rollout_per_model(fleet: Fleet) -> None:
    rid = fleet.start()["id"]
    with pytest.raises(RolloutConflictError, match=rid):
        fleet.start(version=3)
    fleet.controller.command(rid, "abort")
    assert fleet.start(version=3)["state"] == "running"


def test_abort_withdraws_unreported_assignments(fleet: Fleet) -> None:
    rid = fleet.start(waves="100%")["id"]
    sent = fleet.take()
    fleet.install_all(sent[:5])
    status = fleet.controller.command(rid, "abort")
    assert status["state"] == "aborted" and status["counts"]["cancelled"] == 15
    withdrawn = fleet.take()
    assert sorted(withdrawn) == sorted((d, 1, True) for d, _v, _rb in sent[5:])


# ------------------------------------------- issue 21: the version devices actually run


def _roll_v2_out_and_back(fleet: Fleet) -> None:
    """Roll v2 out to site a, then roll it back: every device reports v1 again."""
    rid = fleet.start(target={"site": "a"}, waves="100%", soak_s=0)["id"]
    fleet.install_all(fleet.take())
    assert fleet.advance(1)["state"] == "completed"
    assert fleet.controller.command(rid, "rollback")["state"] == "rolling_back"
    for device, version, rollback in fleet.take():
        assert (version, rollback) == (1, True)
        fleet.report(device, 1)
    assert fleet.advance(1)["state"] == "rolled_back"


def _traffic(fleet: Fleet, requests: int, bad: frozenset[str] = frozenset()) -> None:
    for device, version in fleet.running.items():
        fleet.heartbeat(device, version, requests=requests, agreed_share=0.6 if bad else 0.97)


def test_after_a_rolled_back_version_the_next_rollout_compares_with_and_returns_to_v1(
    fleet: Fleet,
) -> None:
    # issue 21: v2 out, v2 rolled back (all on v1), then v3: it recorded previous_version=2,
    # its control cohort had 0 devices reporting, it halted after its looks, and rollback
    # sent devices to v2 while saying they were back on the previous version.
    _roll_v2_out_and_back(fleet)
    status = fleet.start(
        version=3,
        target={"site": "a"},
        waves="50%,100%",
        soak_s=10,
        looks=1,
        max_agreement_drop=0.05,
        min_health_samples=100,
    )
    assert status["previous_version"] == 1, status["previous_version"]
    sent = fleet.take()
    assert {v for _d, v, _rb in sent} == {3} and len(sent) == 5
    fleet.install_all(sent)
    for requests in (1000, 2000):
        _traffic(fleet, requests)
        fleet.advance(1)
    gates = fleet.status()["gates"]
    [judgement] = gates["judgements"]
    assert judgement["control"]["devices"] == 5 and gates["mismatched_reports"] == 0, gates
    status = fleet.advance(9)  # the look: agreement within the margin, the next wave starts
    assert (status["state"], status["wave"]) == ("running", 1), status["reason"]
    wave2 = fleet.take()
    fleet.install_all(wave2)
    fleet.advance(1)
    status = fleet.controller.command(status["id"], "rollback")
    back = fleet.take()
    assert sorted(back) == sorted((d, 1, True) for d, _v, _rb in sent + wave2)
    assert status["previous_versions"] == {"1": 10}
    for device, _v, _rb in back:
        fleet.report(device, 1)
    status = fleet.advance(1)
    assert status["state"] == "rolled_back"
    assert status["reason"] == "every device is back on the version it ran before (10 on version 1)"


def test_devices_on_different_versions_each_go_back_to_their_own(fleet: Fleet) -> None:
    rid = fleet.start(target={"site": "a"}, waves="100%", soak_s=0)["id"]
    fleet.install_all(fleet.take())
    assert fleet.advance(1)["state"] == "completed"  # site a runs v2, site b v1
    on_v2 = {d for d, v in fleet.running.items() if v == 2}
    assert len(on_v2) == 10
    status = fleet.start(version=3, waves="100%", soak_s=0)  # every device
    assert status["id"] != rid and status["previous_version"] == 2  # a tie: the higher
    fleet.install_all(fleet.take())
    fleet.advance(1)
    status = fleet.controller.command(status["id"], "rollback")
    assert status["previous_versions"] == {"1": 10, "2": 10}
    back = fleet.take()
    assert sorted(back) == sorted((d, 2 if d in on_v2 else 1, True) for d in fleet.running)
    for device, version, _rb in back:
        if version == 1:  # not the baseline (2): its report was lost, its heartbeat shows it back
            fleet.heartbeat(device, 1)
        else:
            fleet.report(device, version)
    status = fleet.advance(1)
    assert status["reason"] == (
        "every device is back on the version it ran before (10 on version 1, 10 on version 2)"
    )


def test_abort_withdraws_each_assignment_back_to_the_devices_own_version(fleet: Fleet) -> None:
    fleet.start(target={"site": "a"}, waves="100%", soak_s=0)
    fleet.install_all(fleet.take())
    assert fleet.advance(1)["state"] == "completed"  # site a on v2, site b on v1
    rid = fleet.start(version=3, waves="100%", soak_s=0)["id"]
    sent = fleet.take()
    assert fleet.controller.command(rid, "abort")["state"] == "aborted"
    withdrawn = fleet.take()
    ran = dict(fleet.running)  # what each device runs: v3 was never installed
    assert sorted(withdrawn) == sorted((d, ran[d], True) for d, _v, _rb in sent)
    assert {v for _d, v, _rb in withdrawn} == {1, 2}
