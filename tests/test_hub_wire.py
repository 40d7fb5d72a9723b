from __future__ import annotations

import json
import struct

from cloud_hub.mqtt._wire import salvage_target
from shared import FORMAT_MAJOR, MAGIC, Limits, Topics


def _frame(header: str) -> bytes:
    raw = header.encode()
    return struct.pack("<4sBBHI", MAGIC, FORMAT_MAJOR, 0, 0, len(raw)) + raw + b"\xff"


def test_huge_integer_timeout_does_not_escape_as_overflow() -> None:
    header = (
        '{"kind":"request","id":"r1","model":"m","reply_to":"tandem/v1/dev/d/reply",'
        '"timeout_ms":' + "9" * 400 + ',"tensors":[{"name":"x"}]}'
    )
    target = salvage_target(
        _frame(header), limits=Limits(), topics=Topics(), topic_model="m", received=10.0
    )
    assert target is not None
    assert target.request_id == "r1" and target.deadline is None


def test_usable_timeout_sets_the_deadline_from_receipt() -> None:
    header = json.dumps(
        {
            "kind": "request",
            "id": "r2",
            "model": "m",
            "reply_to": "tandem/v1/dev/d/reply",
            "timeout_ms": 250,
            "tensors": 5,
        }
    )
    target = salvage_target(
        _frame(header), limits=Limits(), topics=Topics(), topic_model="m", received=10.0
    )
    assert target is not None and target.deadline == 10.25
