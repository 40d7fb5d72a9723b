"""The field checks and frame helpers the text and speculative wires share (``_frame_fields``)."""

from __future__ import annotations

import numpy as np
import pytest

from shared import ErrorCode, FrameError, LimitExceededError, Limits
from shared._envelope import split_frame
from shared._frame_fields import (
    IDS,
    MAX_ID,
    MAX_TOKEN_ID,
    check_extra,
    check_id,
    check_ids,
    check_max_tokens,
    check_name,
    error_of,
    ids_of,
    is_int,
    kind_and_extra,
    pack_message,
)

KNOWN = {"a": frozenset({"kind", "id"}), "b": frozenset({"kind"})}


def test_is_int_refuses_bools_and_floats() -> None:
    assert is_int(0) and is_int(-3)
    assert not is_int(True) and not is_int(1.0) and not is_int("1")


@pytest.mark.parametrize("value", ["", "x" * (MAX_ID + 1), "a\nb", 7, None])
def test_check_id_refuses_what_is_not_a_short_printable_id(value: object) -> None:
    with pytest.raises(FrameError, match=r"^session must be 1-128 printable"):
        check_id(value, "session")


def test_check_id_names_the_id_by_default_and_takes_a_good_one() -> None:
    check_id("x" * MAX_ID)
    with pytest.raises(FrameError, match=r"^id must be"):
        check_id("")


def test_check_name_takes_names_only() -> None:
    check_name("tiny-1.0_a", "model")
    with pytest.raises(FrameError, match=r"^model must be a name"):
        check_name("a/b", "model")


def test_check_ids_takes_sequences_and_arrays_of_ids_in_range() -> None:
    assert check_ids([1, 2], "ids") == (1, 2)
    assert check_ids(np.array([3, MAX_TOKEN_ID]), "ids") == (3, MAX_TOKEN_ID)
    for bad in ([-1], [MAX_TOKEN_ID + 1], [True], [1.0]):
        with pytest.raises(FrameError, match=r"^ids: token id"):
            check_ids(bad, "ids")
    with pytest.raises(FrameError, match="must be a sequence"):
        check_ids("12", "ids")


def test_check_extra_wants_a_dict_with_string_keys() -> None:
    check_extra({"k": 1})
    for bad in ([], {1: 2}):
        with pytest.raises(FrameError, match="extra must be a dict"):
            check_extra(bad)


def test_check_max_tokens_refuses_over_the_limit_only() -> None:
    limits = Limits()
    check_max_tokens(limits.max_output_tokens, limits)
    check_max_tokens("junk", limits)  # left to the message's constructor
    with pytest.raises(LimitExceededError, match=r"^max_tokens"):
        check_max_tokens(limits.max_output_tokens + 1, limits)


def test_a_packed_message_keeps_unknown_extra_fields_and_not_known_ones() -> None:
    ids = np.asarray([5, 6], dtype=IDS).tobytes()
    frame = pack_message({"kind": "a", "id": "r"}, {"id": "spoof", "x": 1}, KNOWN, [ids])
    header, payload = split_frame(frame, Limits())
    assert header == {"kind": "a", "id": "r", "x": 1}
    kind, extra = kind_and_extra(header, KNOWN)
    assert (kind, extra) == ("a", {"x": 1})
    assert ids_of(payload) == (5, 6)


def test_an_unknown_kind_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="kind must be one of"):
        kind_and_extra({"kind": "c"}, KNOWN)


def test_a_negative_id_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="negative"):
        ids_of(memoryview(np.asarray([1, -1], dtype=IDS).tobytes()))


def test_error_of_reads_the_code_and_message() -> None:
    assert error_of({}) == (ErrorCode.OK, "")
    code, message = error_of({"error": {"code": "too_large", "message": 3}})
    assert (code, message) == (ErrorCode.TOO_LARGE, "3")
    with pytest.raises(FrameError, match="error must be an object"):
        error_of({"error": "oops"})
