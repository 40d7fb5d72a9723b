"""The speculative-decoding wire: round trips, validation, limits before slicing."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from shared import (
    MAX_DRAFTS,
    ErrorCode,
    FrameError,
    LimitExceededError,
    Limits,
    TextSampling,
    Topics,
    VerifyClose,
    VerifyFinish,
    VerifyRequest,
    VerifyResult,
    decode_verify_message,
    encode_verify_message,
)


def request(**kw: Any) -> VerifyRequest:
    fields: dict[str, Any] = {
        "request_id": "r1", "model": "tiny", "session": "s1", "round": 1, "base": 0,
        "committed": (1, 2, 3), "drafts": (4, 5), "max_tokens": 9,
    }  # fmt: skip
    return VerifyRequest(**{**fields, **kw})


def raw(header: dict[str, Any], payload: bytes = b"") -> bytes:
    body = json.dumps(header).encode()
    return struct.pack("<4sBBHI", b"TNDM", 1, 0, 0, len(body)) + body + payload


@pytest.mark.parametrize(
    "message",
    [
        request(),
        request(base=7, committed=(), drafts=(), device_id="d-1", timeout_ms=5.0,
                sampling=TextSampling(temperature=0.7, seed=3), draft_dists=b"\x00\x01"),
        VerifyClose(request_id="c1", session="s1", device_id="d-1"),
        VerifyResult(request_id="r1", session="s1", round=2, finish=VerifyFinish.MORE,
                     accepted=3, tokens=(9,), committed=12, hub="hub-1"),
        VerifyResult(request_id="r1", session="s1", round=2, finish=VerifyFinish.ERROR,
                     error=ErrorCode.INVALID_INPUT, error_message="no"),
    ],
)  # fmt: skip
def test_every_message_survives_the_wire(message: Any) -> None:
    assert decode_verify_message(encode_verify_message(message)) == message


def test_constructors_refuse_what_the_protocol_does_not_allow() -> None:
    with pytest.raises(LimitExceededError):
        request(drafts=tuple(range(MAX_DRAFTS + 1)))
    with pytest.raises(FrameError, match="first round"):
        request(committed=())
    with pytest.raises(FrameError, match="token id"):
        request(drafts=(-1,))
    with pytest.raises(FrameError, match="error code exactly"):
        VerifyResult(request_id="r", session="s", round=0, finish=VerifyFinish.ERROR)
    with pytest.raises(FrameError, match="carries the hub's token"):
        VerifyResult(request_id="r", session="s", round=0, finish="more")
    with pytest.raises(FrameError, match="at most one hub token"):
        VerifyResult(request_id="r", session="s", round=0, finish="more", tokens=(1, 2))


def test_sizes_are_checked_against_the_limits_and_the_payload_before_slicing() -> None:
    head = {"kind": "verify", "id": "r", "model": "m", "session": "s", "round": 0, "base": 0,
            "max_tokens": 4}  # fmt: skip
    ids = np.arange(3, dtype="<i4").tobytes()
    with pytest.raises(LimitExceededError):
        decode_verify_message(raw({**head, "committed_count": 1, "draft_count": 17}, ids))
    with pytest.raises(LimitExceededError):
        decode_verify_message(raw({**head, "committed_count": 2, "draft_count": 1}, ids),
                              Limits(max_token_ids=2))  # fmt: skip
    with pytest.raises(FrameError, match="payload has"):
        decode_verify_message(raw({**head, "committed_count": 5, "draft_count": 0}, ids))
    with pytest.raises(LimitExceededError):
        decode_verify_message(raw({**head, "committed_count": 3, "draft_count": 0,
                                   "dist_bytes": 10**9}, ids))  # fmt: skip
    with pytest.raises(FrameError, match="negative"):
        bad = np.asarray([1, -5, 2], dtype="<i4").tobytes()
        decode_verify_message(raw({**head, "committed_count": 3, "draft_count": 0}, bad))
    with pytest.raises(FrameError, match="kind"):
        decode_verify_message(raw({"kind": "nope"}))


def test_verify_topics_name_one_device_and_parse_back() -> None:
    t = Topics()
    assert t.device_verify("d1", "tiny") == "tandem/v1/dev/d1/verify/tiny"
    assert t.device_verify("d1", "tiny", "hub-2") == "tandem/v1/dev/d1/verify/tiny/hub-2"
    assert t.verified("d1") == "tandem/v1/dev/d1/verified"
    assert t.device_verify_filter("hubs") == "$share/hubs/tandem/v1/dev/+/verify/+"
    assert t.hub_verify_filter("hub-2") == "tandem/v1/dev/+/verify/+/hub-2"
    where = t.parse_verify_topic("tandem/v1/dev/d1/verify/tiny/hub-2")
    assert where is not None and (where.device, where.model, where.hub) == ("d1", "tiny", "hub-2")
    assert t.parse_verify_topic("tandem/v1/dev/d1/generate/tiny") is None
    assert t.parse_verify_topic("tandem/v1/dev/+/verify/tiny") is None


def test_a_budget_too_large_for_a_float_is_a_frame_error() -> None:
    # An int past float range made math.isfinite raise OverflowError (not a FrameError).
    with pytest.raises(FrameError, match="timeout_ms"):
        request(timeout_ms=10**400)
