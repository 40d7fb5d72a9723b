"""JSON request bodies whose big ``data`` arrays never become Python objects.

A JSON tensor of n numbers costs about 40 bytes a number as Python objects
(a float and a list slot, and a list per nested level), ten times what the
tensor itself takes, and a hostile body (nested lists, short strings, a
count that does not match the shape) costs more. ``parse_request`` parses
the request's structure with orjson but cuts every large ``"data": [...]``
array out first, leaving a ``NumberSpan`` (the array's place in the body) in
its stead. A span becomes a numpy array once its tensor's datatype and shape
are known (``NumberSpan.to_array``), ``CHUNK_BYTES`` of text at a time, or is
refused: decoding a request takes its body plus its tensors, never ten times
that, whatever the body holds.

``to_array`` is exact. Numbers: the text must be only numbers, commas,
brackets and whitespace, with no empty slot; its skeleton (brackets and
commas) must be a flat list of ``prod(shape)`` elements or lists nested
exactly as ``shape``; integers must have no fraction or exponent and fit
their datatype (integers of 19 digits or more are read exactly, a chunk at a
time). BOOL: ``true``/``false`` only, read the same way. A span that fails a
check raises the codec's error (``InvalidRequestError`` for data that does
not fit its datatype or shape, ``BadRequestError`` for text that is not
JSON) counted from the text, without parsing it. Only a BYTES span that
passes every check is parsed the ordinary way (``slow()``): its strings are
the tensor's elements. NaN and Infinity are not JSON and pass neither way.

What is left once the spans are cut (names, shapes, parameters, small
arrays) is parsed by orjson; it may be at most ``structure_limit(limits)``
bytes, and a large ``data`` array anywhere but an input's ``data`` is
refused, so no part of a body becomes many Python objects. A placeholder
carries a random token per request, so a client cannot plant one.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from shared import Limits

from .._errors import BadRequestError, InvalidRequestError

__all__ = [
    "CHUNK_BYTES",
    "MIN_SPAN_BYTES",
    "NumberSpan",
    "loads",
    "parse_request",
    "structure_limit",
]

MIN_SPAN_BYTES = 4096  # smaller arrays are parsed the ordinary way: nothing to save
CHUNK_BYTES = 1 << 20
_DATA_KEY = re.compile(rb'"data"\s*:\s*\[')
_NUMBER_TEXT = re.compile(rb"[\[\]0-9eE+\-.,\s]*")
# Text up to the next bracket outside a string (possessive: no backtracking).
_NO_BRACKETS = re.compile(rb'[^"\[\]]*+(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"[^"\[\]]*+)*+', re.DOTALL)
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_WHOLE_TOKENS = re.compile(rb'[^"]*+(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"[^"]*+)*+', re.DOTALL)
_SUB_BYTES = 64 * 1024
_LONG_INTEGER = re.compile(rb"\d{19,}")
_TOO_LONG_INTEGER = re.compile(rb"[1-9]\d{20,}")  # 10**20 and more: beyond every datatype
_DIGITS = re.compile(rb"\d")
_WHITESPACE = b" \t\r\n"
_NOT_SKELETON = b"0123456789+-.eE" + _WHITESPACE
_SKELETON_DROP = _NOT_SKELETON + b'"truefals'
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")
_EMPTY_SLOT = (b",,", b"[,", b",]", b"[]")

Buffer = bytes | bytearray


def loads(raw: Buffer | memoryview) -> Any:
    """orjson's ``loads`` when installed (strict: no NaN), else the standard library's."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a hub dependency
        import json

        return json.loads(bytes(raw))
    return orjson.loads(raw)


def structure_limit(limits: Limits) -> int:
    """Bytes of JSON a request may hold outside its large ``data`` arrays."""
    return limits.max_header_bytes + limits.max_tensors * MIN_SPAN_BYTES


@dataclass(frozen=True)
class NumberSpan:
    """A ``data`` array at ``body[start:end]``, not parsed yet; ``plain``: only number text."""

    body: Buffer
    start: int
    end: int
    plain: bool = True
    opens: int = -1  # its "[" (counted when the span was found); -1: not counted yet

    def slow(self) -> Any:
        """The array parsed the ordinary way (Python lists)."""
        return loads(memoryview(self.body)[self.start : self.end])

    def to_array(
        self, name: str, datatype: str, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray | None:
        """The data as a ``dtype`` array of ``shape``; None (BYTES only): parse ``slow()``.

        Raises ``InvalidRequestError`` or ``BadRequestError`` when the data does not fit.
        """
        if not self.plain:
            return self._not_plain(name, datatype, shape)
        if datatype in ("BOOL", "BYTES") and _DIGITS.search(self.body, self.start, self.end):
            raise InvalidRequestError(f"input {name!r}: {datatype} data must be {_kind(datatype)}")
        if dtype.kind in "iu" and any(
            self.body.find(c, self.start, self.end) >= 0 for c in (b".", b"e", b"E")
        ):
            raise InvalidRequestError(f"input {name!r}: {datatype} data must be integers")
        return self._numbers(name, datatype, dtype, shape)

    def _nested(self) -> bool:
        return self.body.find(b"[", self.start + 1, self.end) >= 0

    def _numbers(
        self, name: str, datatype: str, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray:
        """One pass: each chunk's numbers, and (nested) its skeleton; checked as they come."""
        integer = dtype.kind in "iu"
        count = math.prod(shape)
        parse_as = np.dtype(np.uint64 if dtype.kind == "u" else np.int64 if integer else np.float64)
        blank = parse_as.type(0 if integer else -1)  # what numpy makes of a blank slot
        nested = self._nested()
        commas = self.body.count(b",", self.start, self.end)
        if nested:  # a skeleton of the wrong length, or a flat array of the wrong count: refused
            opens = self.opens if self.opens >= 0 else self.body.count(b"[", self.start, self.end)
            fits = 2 * opens + commas == _skeleton_length(shape)
        else:
            fits = commas + 1 == count or commas == count == 0
        if not fits:
            self._refuse(name, shape, count, nested)
        out = np.empty(count, dtype=dtype)
        skeletons: list[bytes] = []
        filled = 0
        for chunk in self._chunks():
            values = _parse_chunk(chunk, parse_as, integer, name, datatype)
            if filled + values.size > count:
                break
            edge = chunk[:1] == b"," or chunk[-1:] == b","  # cut at ",,"
            if edge or not values.size or (values == blank).any():  # a blank slot, maybe
                _check_skeleton(iter([chunk]), name, shape, nested, slots_only=True)
            if integer and not _fits(values, dtype):
                raise InvalidRequestError(f"input {name!r}: a value does not fit {datatype}")
            if nested:
                skeletons.append(chunk.translate(None, _SKELETON_DROP))
            with np.errstate(over="ignore"):  # floats beyond FP16/FP32's range become inf
                out[filled : filled + values.size] = values
            filled += values.size
        else:
            if filled == count and (not nested or _same_skeleton(skeletons, shape)):
                return out.reshape(shape)
        del skeletons, out
        self._refuse(name, shape, count, nested)

    def _refuse(self, name: str, shape: tuple[int, ...], count: int, nested: bool) -> NoReturn:
        """Say why the data does not fit (a pass over the text, on this path only)."""
        _check_skeleton(self._chunks(), name, shape, nested)
        numbers = _DIGITS.search(self.body, self.start, self.end) is not None
        has = self.body.count(b",", self.start, self.end) + 1 if numbers else 0
        raise InvalidRequestError(_count_message(name, shape, count, has))

    def _not_plain(self, name: str, datatype: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """Data with strings, literals or objects: refused unless BOOL or BYTES of the shape."""
        if datatype == "BOOL":
            return self._bools(name, shape)
        if datatype != "BYTES":
            raise InvalidRequestError(f"input {name!r}: {datatype} data must be {_kind(datatype)}")
        squeezed = _without_strings(self.body, self.start, self.end)
        residue = squeezed.translate(None, b"[]," + _WHITESPACE)
        if residue.count(b'"') != len(residue):
            raise InvalidRequestError(f"input {name!r}: BYTES data must be {_kind(datatype)}")
        del residue
        nested = squeezed.find(b"[", 1) >= 0
        slots = squeezed.count(b'"')
        _check_skeleton(_pieces(squeezed), name, shape, nested, slots=slots)
        return None

    def _bools(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """``true``/``false`` only, read a chunk at a time as 1/0."""
        if any(self.body.find(c, self.start, self.end) >= 0 for c in (b'"', b"{", b"n")):
            raise InvalidRequestError(f"input {name!r}: BOOL data must be {_kind('BOOL')}")
        _check_skeleton(self._chunks(), name, shape, self._nested())
        count = math.prod(shape)
        out = np.empty(count, dtype=np.bool_)
        filled = 0
        for chunk in self._chunks():
            if chunk.translate(None, _BOOL_TEXT):
                raise InvalidRequestError(f"input {name!r}: BOOL data must be {_kind('BOOL')}")
            text = chunk.replace(b"true", b"1").replace(b"false", b"0")
            values = _parse_chunk(text, np.dtype(np.uint8), False, name, "BOOL")
            if filled + values.size > count or (values.size and values.max() > 1):
                break
            out[filled : filled + values.size] = values
            filled += values.size
        if filled != count:
            has = self.body.count(b",", self.start, self.end) + 1
            raise InvalidRequestError(_count_message(name, shape, count, has))
        return out.reshape(shape)

    def _chunks(self) -> Iterator[bytes]:
        """The span cut at commas into pieces of about ``CHUNK_BYTES`` (the commas dropped)."""
        body, position, end = self.body, self.start, self.end
        while position < end:
            cut = end
            if end - position > CHUNK_BYTES:
                cut = body.find(b",", position + CHUNK_BYTES, end)
                cut = end if cut < 0 else cut
            yield bytes(body[position:cut])
            position = cut + 1


_KIND = {"BOOL": "true or false", "BYTES": "strings in JSON"}
_BOOL_TEXT = b"[],truefals" + _WHITESPACE


def _kind(datatype: str) -> str:
    """What ``datatype``'s data must be, as the codec says it."""
    return _KIND.get(datatype, "integers" if datatype[0] in "IU" else "numbers")


def _without_strings(body: Buffer, start: int, end: int) -> bytes:
    """``body[start:end]`` with each string cut to ``"``, ``_SUB_BYTES`` at a time.

    (``re.sub`` holds each piece it cuts as an object until it joins them: a small window.)
    """
    pieces: list[bytes] = []
    position = start
    while position < end:
        whole = _WHOLE_TOKENS.match(body, position, min(end, position + _SUB_BYTES))
        assert whole is not None
        stop = whole.end()
        if stop == position:  # a string longer than the window
            string = _STRING.match(body, position, end)
            stop = end if string is None else string.end()
        pieces.append(_STRING.sub(b'"', body[position:stop]))
        position = stop
    return b"".join(pieces)


def _pieces(text: bytes) -> Iterator[bytes]:
    """``text`` cut at commas into pieces of about ``CHUNK_BYTES`` (the commas dropped)."""
    return NumberSpan(text, 0, len(text))._chunks()


def _count_message(name: str, shape: tuple[int, ...], count: int, has: int) -> str:
    return f"input {name!r}: shape {list(shape)} holds {count} elements but 'data' has {has}"


def _check_skeleton(
    chunks: Iterator[bytes],
    name: str,
    shape: tuple[int, ...],
    nested: bool,
    *,
    slots: int | None = None,
    slots_only: bool = False,
) -> None:
    """Refuse empty slots, a nesting other than ``shape``'s, and (flat) a count other than its.

    ``slots``: the elements of a flat array when known (strings); else its commas plus one.
    ``slots_only``: only look for empty slots (in some of the chunks).
    """
    skeletons: list[bytes] = []
    commas = 0
    elements = False
    count = math.prod(shape)
    for chunk in chunks:
        squeezed = chunk.translate(None, _WHITESPACE)
        # Chunks are cut at commas: one that is empty or starts or ends with one had two.
        empty = not squeezed or squeezed[:1] == b"," or squeezed[-1:] == b","
        # [[], []] are the empty rows of a 0-element shape (and [] its empty array).
        slot = any(e in squeezed for e in _EMPTY_SLOT) and (count or not nested)
        if (empty or slot) and squeezed != b"[]":
            raise BadRequestError(
                f"the request is not valid JSON: input {name!r}'s 'data' has an empty slot"
            )
        if slots_only:
            continue
        if nested:
            skeletons.append(chunk.translate(None, _SKELETON_DROP))
        else:
            commas += chunk.count(b",") + 1
            elements = elements or bool(squeezed.strip(b"[]"))
    if slots_only:
        return
    if nested:
        if not _same_skeleton(skeletons, shape):
            raise InvalidRequestError(
                f"input {name!r}: nested 'data' does not match shape {list(shape)}"
            )
        return
    has = slots if slots is not None else (commas if elements else 0)
    if has != count:
        raise InvalidRequestError(_count_message(name, shape, count, has))


def _same_skeleton(skeletons: list[bytes], shape: tuple[int, ...]) -> bool:
    """Whether the pieces (cut at commas) are the brackets and commas of ``shape``."""
    if sum(map(len, skeletons)) + len(skeletons) - 1 != _skeleton_length(shape):
        return False
    return b",".join(skeletons) == _skeleton(shape)


def _parse_chunk(
    chunk: bytes, parse_as: np.dtype[Any], integer: bool, name: str, datatype: str
) -> np.ndarray:
    """The numbers of a chunk of checked text (brackets, commas, numbers)."""
    text = chunk.translate(_BRACKETS_TO_SPACES)
    if not text.strip():  # numpy reads blank text as -1
        return np.empty(0, dtype=parse_as)
    if integer and _LONG_INTEGER.search(text):  # numpy saturates: read these exactly
        if _TOO_LONG_INTEGER.search(text):
            raise InvalidRequestError(f"input {name!r}: a value does not fit {datatype}")
        try:
            exact = [int(v) for v in text.split(b",")]
            return np.array(exact, dtype=parse_as)
        except (OverflowError, ValueError):
            raise InvalidRequestError(f"input {name!r}: a value does not fit {datatype}") from None
    try:
        values = np.fromstring(text, dtype=parse_as, sep=",")
    except ValueError:  # text that is not a number where one belongs
        raise BadRequestError(
            f"the request is not valid JSON: input {name!r}'s 'data' holds text that is not "
            "a number"
        ) from None
    if not integer and not np.isfinite(values).all():  # 1e999: JSON has no infinity
        raise InvalidRequestError(f"input {name!r}: a number is beyond the range of a double")
    return values


def parse_request(body: Buffer, end: int | None = None, *, limits: Limits | None = None) -> Any:
    """The document in ``body[:end]``, each large ``inputs[i].data`` left as a ``NumberSpan``.

    Raises ``BadRequestError`` when what is left outside the spans passes
    ``structure_limit(limits)`` or a large ``data`` array is not an input's.
    """
    end = len(body) if end is None else end
    limits = limits or Limits()
    spans = _spans(body, end)
    structure = end - sum(e - s for s, e, _ in spans)
    if structure > structure_limit(limits):
        raise BadRequestError(
            f"the request holds {structure} bytes of JSON outside its inputs' 'data' arrays; "
            f"the limit is {structure_limit(limits)} (or the JSON is malformed)"
        )
    view = memoryview(body)[:end]
    if not spans:
        return loads(body if end == len(body) else view)
    token = secrets.token_hex(8)
    parts: list[bytes] = []
    previous = 0
    for index, (start, stop, _) in enumerate(spans):
        parts.append(bytes(view[previous:start]))
        parts.append(f'"tandem-number-span:{token}:{index}"'.encode())
        previous = stop
    parts.append(bytes(view[previous:]))
    document = loads(b"".join(parts))
    placeholders = {
        f"tandem-number-span:{token}:{i}": NumberSpan(body, s, e, opens >= 0, opens)
        for i, (s, e, opens) in enumerate(spans)
    }
    if not _restore(document, placeholders):
        raise BadRequestError(
            f"a 'data' array of {MIN_SPAN_BYTES} bytes or more is taken only as an input's data"
        )
    return document


def _spans(body: Buffer, end: int) -> list[tuple[int, int, int]]:
    """(start, end, its "[" count) of each large data array; the count -1: not number text."""
    spans: list[tuple[int, int, int]] = []
    position = 0
    while (key := _DATA_KEY.search(body, position, end)) is not None:
        start = key.end() - 1
        guess = _NUMBER_TEXT.match(body, start, end)
        assert guess is not None  # the pattern matches the empty string at worst
        stop = body.rfind(b"]", start, guess.end()) + 1
        opens = body.count(b"[", start, stop) if stop > start else -1
        plain = opens >= 0 and opens == body.count(b"]", start, stop)
        if not plain:  # not only number text: find where the array ends, strings skipped
            stop = _close(body, start, end)
        if stop - start >= MIN_SPAN_BYTES:
            spans.append((start, stop, opens if plain else -1))
            position = stop
        else:
            position = key.end()
    return spans


def _close(body: Buffer, start: int, end: int) -> int:
    """The end of the array opened at ``body[start]`` (strings skipped); -1 if it has none."""
    depth = 0
    position = start
    while position < end:
        match = _NO_BRACKETS.match(body, position, end)
        assert match is not None
        position = match.end()
        if position >= end:
            return -1
        bracket = body[position]
        if bracket == ord("["):
            depth += 1
        elif bracket == ord("]"):
            depth -= 1
        else:  # an unterminated string
            return -1
        position += 1
        if depth == 0:
            return position
    return -1


def _restore(document: Any, placeholders: dict[str, NumberSpan]) -> bool:
    """Put each span where its placeholder is; False if one is anywhere but an input's data."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    found = 0
    for item in inputs if isinstance(inputs, list) else ():
        data = item.get("data") if isinstance(item, dict) else None
        if isinstance(data, str) and data in placeholders:
            item["data"] = placeholders[data]
            found += 1
    return found == len(placeholders)


def _skeleton_length(shape: tuple[int, ...]) -> int:
    """``len(_skeleton(shape))``, without building it."""
    if not shape:
        return 0
    if shape[0] == 0:
        return 2
    if len(shape) == 1:
        return shape[0] + 1
    return 2 + shape[0] - 1 + shape[0] * _skeleton_length(shape[1:])


def _skeleton(shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of a JSON array nested as ``shape``."""
    if not shape:
        return b""
    if shape[0] == 0:
        return b"[]"
    if len(shape) == 1:
        return b"[" + b"," * (shape[0] - 1) + b"]"
    return b"[" + b",".join([_skeleton(shape[1:])] * shape[0]) + b"]"


def _fits(values: np.ndarray, dtype: np.dtype[Any]) -> bool:
    if not values.size:
        return True
    info = np.iinfo(dtype)
    return bool(values.min() >= info.min and values.max() <= info.max)
