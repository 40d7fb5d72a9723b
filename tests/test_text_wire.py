"""The text-generation wire (``shared._text_wire``): round trips and refusals, without I/O."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import (
    ErrorCode,
    FrameError,
    GenerateCancel,
    GenerateChunk,
    GenerateFinal,
    GenerateRequest,
    LimitExceededError,
    Limits,
    TextSampling,
    Topics,
    UnsupportedVersionError,
    decode_text_message,
    encode_text_message,
)

ids = st.lists(st.integers(0, 2**31 - 1), max_size=40).map(tuple)
names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)


def _frame(header: dict[str, object], payload: bytes = b"", major: int = 1) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<4sBBHI", b"TNDM", major, 0, 0, len(raw)) + raw + payload


@given(
    request_id=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    model=names,
    prompt=texts.filter(bool) | st.none(),
    prompt_ids=ids.filter(bool),
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0.01, 5.0) | st.none(),
    conversation=st.none()
    | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
    turn=st.none() | st.integers(0, 1000),
    share=st.booleans(),
)
def test_a_request_round_trips(
    request_id: str, model: str, prompt: str | None, prompt_ids: tuple[int, ...],
    max_tokens: int, temperature: float | None, conversation: str | None, turn: int | None,
    share: bool,
) -> None:  # fmt: skip
    request = GenerateRequest(
        request_id=request_id, model=model, max_tokens=max_tokens, prompt=prompt,
        prompt_ids=prompt_ids if prompt is None or len(prompt_ids) % 2 else None,
        sampling=TextSampling(temperature=temperature, top_p=0.9 if temperature else None),
        device_id="dev-1", timeout_ms=1500.0, sent_at_ms=1.7e12, conversation=conversation,
        turn=turn, share=share, extra={"future": [1, "x"]},
    )  # fmt: skip
    assert decode_text_message(encode_text_message(request)) == request


@given(seq=st.integers(0, 10**6), text=texts, token_ids=ids)
def test_a_chunk_round_trips_with_its_text_and_ids(
    seq: int, text: str, token_ids: tuple[int, ...]
) -> None:
    chunk = GenerateChunk(request_id="r1", seq=seq, text=text, token_ids=token_ids)
    back = decode_text_message(encode_text_message(chunk))
    assert back == chunk and back.tokens == len(token_ids)  # type: ignore[union-attr]


def test_a_chunk_may_count_tokens_without_sending_their_ids() -> None:
    chunk = GenerateChunk(request_id="r1", seq=0, text="é", tokens=2)
    assert decode_text_message(encode_text_message(chunk)) == chunk
    with pytest.raises(FrameError, match="tokens is 3"):
        GenerateChunk(request_id="r1", seq=0, text="x", token_ids=(1,), tokens=3)


@pytest.mark.parametrize(
    "final",
    [
        GenerateFinal(
            request_id="r",
            seq=3,
            finish="stop",
            prompt_tokens=5,
            completion_tokens=9,
            cached_tokens=2,
            model_version="1",
        ),
        GenerateFinal(
            request_id="r",
            seq=0,
            finish="error",
            error=ErrorCode.UNKNOWN_MODEL,
            error_message="no such model",
        ),
        GenerateCancel(request_id="r", device_id="d"),
    ],
)
def test_finals_and_cancels_round_trip(final: GenerateFinal | GenerateCancel) -> None:
    assert decode_text_message(encode_text_message(final)) == final


def test_a_final_has_an_error_code_exactly_when_it_failed() -> None:
    with pytest.raises(FrameError, match="exactly when"):
        GenerateFinal(request_id="r", seq=0, finish="error")
    with pytest.raises(FrameError, match="exactly when"):
        GenerateFinal(request_id="r", seq=0, finish="stop", error=ErrorCode.INTERNAL)
    with pytest.raises(FrameError, match="finish reason"):
        GenerateFinal(request_id="r", seq=0, finish="done")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": None}, "needs a prompt"),
        ({"prompt": "a\ud800b"}, "lone surrogate"),
        ({"prompt": b"bytes"}, "must be text"),
        ({"prompt_ids": ()}, "empty"),
        ({"prompt_ids": (1, -2)}, "token id -2"),
        ({"prompt_ids": (1, True)}, "token id True"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"timeout_ms": float("nan")}, "timeout_ms"),
        ({"model": "a/b"}, "model"),
        ({"sampling": TextSampling()}, None),
    ],
)
def test_bad_requests_are_refused_in_the_constructor(
    kwargs: dict[str, object], needle: str | None
) -> None:
    base: dict[str, object] = {"request_id": "r", "model": "m", "max_tokens": 4, "prompt": "hi"}
    if needle is None:
        GenerateRequest(**{**base, **kwargs})  # type: ignore[arg-type]
        return
    with pytest.raises(FrameError, match=needle):
        GenerateRequest(**{**base, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sampling", "needle"),
    [
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": 0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"seed": -1}, "seed"),
    ],
)
def test_nan_style_sampling_is_refused(sampling: dict[str, float], needle: str) -> None:
    with pytest.raises(FrameError, match=needle):
        TextSampling(**sampling)


def test_sizes_are_checked_against_the_limits_before_the_payload_is_read() -> None:
    header = {"kind": "generate", "id": "r", "model": "m", "max_tokens": 2}
    # Declared sizes above the limits: refused though no such payload follows.
    with pytest.raises(LimitExceededError, match="text of"):
        decode_text_message(_frame({**header, "text_bytes": 10**9}), Limits(max_text_bytes=100))
    with pytest.raises(LimitExceededError, match="token ids"):
        decode_text_message(_frame({**header, "token_count": 10**9}), Limits(max_token_ids=100))
    with pytest.raises(LimitExceededError, match="max_tokens"):
        decode_text_message(
            _frame({**header, "max_tokens": 10**7, "text_bytes": 1}, b"x"),
            Limits(max_output_tokens=1000),
        )
    with pytest.raises(FrameError, match="payload has"):
        decode_text_message(_frame({**header, "text_bytes": 5}, b"abc"))


@pytest.mark.parametrize(
    ("frame", "error", "needle"),
    [
        (
            _frame(
                {"kind": "generate", "id": "r", "model": "m", "max_tokens": 2, "text_bytes": 2},
                b"\xc3(",
            ),
            FrameError,
            "UTF-8",
        ),
        (
            _frame(
                {"kind": "generate", "id": "r", "model": "m", "max_tokens": 2, "text_bytes": 3},
                b"\xed\xa0\x80",
            ),
            FrameError,
            "UTF-8",
        ),  # an encoded lone surrogate
        (
            _frame(
                {
                    "kind": "generate",
                    "id": "r",
                    "model": "m",
                    "max_tokens": 2,
                    "text_bytes": 0,
                    "token_count": 1,
                },
                struct.pack("<i", -5),
            ),
            FrameError,
            "negative",
        ),
        (
            _frame({"kind": "generate", "id": "r", "model": "m", "max_tokens": 2, "text_bytes": 0}),
            FrameError,
            "empty",
        ),
        (_frame({"kind": "request", "id": "r"}), FrameError, "kind"),
        (_frame({"kind": "chunk", "id": "r", "seq": -1, "text_bytes": 0}), FrameError, "seq"),
        (
            _frame({"kind": "final", "id": "r", "seq": 0, "finish": "stop", "usage": [1]}),
            FrameError,
            "usage",
        ),
        (
            _frame(
                {
                    "kind": "generate",
                    "id": "r",
                    "model": "m",
                    "max_tokens": 2,
                    "sampling": {"temperature": 1, "beam": 4},
                    "text_bytes": 1,
                },
                b"x",
            ),
            FrameError,
            "sampling",
        ),
        (_frame({"kind": "cancel", "id": "r"}, major=2), UnsupportedVersionError, "format 2"),
        (b"junk", FrameError, "shorter"),
    ],
)
def test_junk_frames_get_typed_errors(frame: bytes, error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        decode_text_message(frame)


def test_unknown_header_fields_are_kept_and_written_back() -> None:
    frame = _frame({"kind": "cancel", "id": "r", "device": "d", "hint": {"a": 1}})
    cancel = decode_text_message(frame)
    assert cancel.extra == {"hint": {"a": 1}}
    assert decode_text_message(encode_text_message(cancel)) == cancel


def test_text_topics_are_the_device_s_own_and_parse_back() -> None:
    topics = Topics("acme/v2")
    assert topics.device_generate("cam-1", "llm") == "acme/v2/dev/cam-1/generate/llm"
    assert topics.device_generate_filter("hubs") == "$share/hubs/acme/v2/dev/+/generate/+"
    assert topics.text("cam-1") == "acme/v2/dev/cam-1/text"
    assert topics.cancel_filter() == "acme/v2/dev/+/cancel"
    parsed = topics.parse_text_topic("acme/v2/dev/cam-1/generate/llm")
    assert parsed is not None and (parsed.device, parsed.model) == ("cam-1", "llm")
    parsed = topics.parse_text_topic(topics.cancel("cam-1"))
    assert parsed is not None and (parsed.device, parsed.model) == ("cam-1", "")
    for topic in ("acme/v2/dev/cam-1/infer/llm", "acme/v2/dev/+/generate/x", "acme/v2/dev/a/text"):
        assert topics.parse_text_topic(topic) is None


@given(hub=names)
def test_chunks_and_finals_name_the_hub_replica_that_sent_them(hub: str) -> None:
    chunk = GenerateChunk(request_id="r", seq=0, text="x", token_ids=(7,), hub=hub)
    final = GenerateFinal(request_id="r", seq=1, finish="stop", cached_tokens=3, hub=hub)
    for message in (chunk, final):
        back = decode_text_message(encode_text_message(message))
        assert back == message and back.hub == hub  # type: ignore[union-attr]


def test_frames_without_a_hub_still_decode_and_a_bad_hub_is_refused() -> None:
    old = _frame({"kind": "final", "id": "r", "seq": 0, "finish": "stop"})  # an earlier hub
    final = decode_text_message(old)
    assert isinstance(final, GenerateFinal) and final.hub is None and final.extra == {}
    for bad in ("a/b", "+", "", 7):
        with pytest.raises(FrameError, match="hub"):
            decode_text_message(_frame({"kind": "final", "id": "r", "seq": 0, "finish": "stop",
                                        "hub": bad}))  # fmt: skip
        with pytest.raises(FrameError, match="hub"):
            GenerateChunk(request_id="r", seq=0, text="", hub=bad)  # type: ignore[arg-type]
