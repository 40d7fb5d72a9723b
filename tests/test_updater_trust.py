"""The updater's trust rules on their own: pure, no network, no disk."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from edge_agent import DowngradeError, UntrustedUpdateError
from edge_agent.updater import TrustRecord, UpdateTrust
from shared import SigningKey, format_time, sign_document

KEY = SigningKey.generate()
NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


def assignment(
    version: int, *, rollback: bool = False, issued: timedelta = timedelta(0), **over: Any
) -> bytes:
    signed = {
        "type": "assignment",
        "spec_version": "1.0",
        "device": "cam-7",
        "model": "mnist",
        "version": version,
        "rollback": rollback,
        "issued_at": format_time(NOW + issued),
        "expires_at": format_time(NOW + issued + timedelta(days=1)),
        **over,
    }
    return json.dumps(sign_document(signed, KEY)).encode()


def manifest(name: str, version: int) -> bytes:
    signed = {
        "type": "manifest",
        "spec_version": "1.0",
        "name": name,
        "version": version,
        "format": "onnx",
        "blob": {"digest": "sha256:" + "ab" * 32, "size": 10, "raw_size": 20},
        "published_at": format_time(NOW - timedelta(days=1)),
        "expires_at": format_time(NOW + timedelta(days=1)),
    }
    return json.dumps(sign_document(signed, KEY)).encode()


def trust(highest: int = 0, last: timedelta | None = None) -> UpdateTrust:
    record = TrustRecord(highest, format_time(NOW + last) if last is not None else None)
    return UpdateTrust([KEY.public_key], device_id="cam-7", model="mnist", record=record)


def test_accepts_a_signed_current_assignment_and_its_manifest() -> None:
    t = trust(highest=2)
    accepted = t.accept_assignment(assignment(3), now=NOW)
    assert accepted.version == 3
    assert t.accept_manifest(manifest("mnist", 3), accepted, now=NOW).version == 3


def test_lower_version_needs_a_signed_rollback() -> None:
    with pytest.raises(DowngradeError, match="below the highest accepted 3"):
        trust(highest=3).accept_assignment(assignment(2), now=NOW)
    assert trust(highest=3).accept_assignment(assignment(2, rollback=True), now=NOW).version == 2


def test_an_assignment_issued_before_the_last_accepted_is_a_replay() -> None:
    with pytest.raises(DowngradeError, match="a replay"):
        trust(highest=3, last=timedelta(0)).accept_assignment(
            assignment(2, rollback=True, issued=-timedelta(minutes=1)), now=NOW
        )
    assert trust(highest=3, last=timedelta(0)).accept_assignment(assignment(3), now=NOW)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"device": "cam-8"}, "for device 'cam-8'"),
        ({"model": "other"}, "for model 'other'"),
        ({"model": "../../etc"}, "not a valid name"),
    ],
)
def test_assignment_for_someone_else_is_refused(over: dict[str, Any], match: str) -> None:
    with pytest.raises(UntrustedUpdateError, match=match):
        trust().accept_assignment(assignment(1, **over), now=NOW)


def test_expired_assignment_is_refused() -> None:
    with pytest.raises(UntrustedUpdateError, match="expired"):
        trust().accept_assignment(assignment(1), now=NOW + timedelta(days=2))


def test_manifest_must_be_the_assigned_name_and_version() -> None:
    t = trust()
    accepted = t.accept_assignment(assignment(3), now=NOW)
    for name, version in (("mnist", 2), ("other", 3)):
        with pytest.raises(UntrustedUpdateError, match="the assignment asks for mnist@3"):
            t.accept_manifest(manifest(name, version), accepted, now=NOW)


def test_after_commit_only_raises_the_bar() -> None:
    t = trust(highest=3, last=timedelta(0))
    rollback = t.accept_assignment(assignment(2, rollback=True, issued=timedelta(hours=1)), now=NOW)
    record = t.after_commit(rollback)
    assert record == TrustRecord(3, format_time(NOW + timedelta(hours=1)))
    assert t.record.highest_accepted == 3  # unchanged until the caller has persisted it


def test_a_device_must_pin_a_key() -> None:
    with pytest.raises(ValueError, match="pin at least one publisher key"):
        UpdateTrust([], device_id="cam-7", model="mnist")
