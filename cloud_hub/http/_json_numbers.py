"""JSON request bodies whose big numeric ``data`` arrays go straight into numpy.

A JSON tensor of n numbers costs about 40 bytes a number as Python objects
(a float and a list slot, and a list per nested level), ten times what the
tensor itself takes. ``parse_request`` parses the request's structure with
orjson but cuts every large ``"data": [...]`` array of numbers out first,
leaving a ``NumberSpan`` (the array's place in the body) in its stead. A
span becomes a numpy array once its tensor's datatype and shape are known
(``NumberSpan.to_array``), ``CHUNK_BYTES`` of text at a time, so decoding a
request takes its body plus its tensors, not ten times that.

The fast path is exact or it stands aside (returns None): the text must be
only numbers, commas, brackets and whitespace; its skeleton (brackets and
commas) must be a flat list of ``prod(shape)`` elements or lists nested
exactly as ``shape``; integers must have no fraction or exponent and fit
their datatype. Anything else (BOOL and BYTES tensors, a number that is not
JSON, a wrong nesting, an integer out of range) is parsed the ordinary way
(``slow()``), which accepts it or produces the codec's precise error. NaN
and Infinity are not JSON and pass neither way. A placeholder carries a
random token per request, so a client cannot plant one.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["CHUNK_BYTES", "MIN_SPAN_BYTES", "NumberSpan", "loads", "parse_request"]

MIN_SPAN_BYTES = 4096  # smaller arrays are parsed the ordinary way: nothing to save
CHUNK_BYTES = 1 << 20
_DATA_KEY = re.compile(rb'"data"\s*:\s*\[')
_NUMBER_TEXT = re.compile(rb"[\[\]0-9eE+\-.,\s]*")
_LONG_INTEGER = re.compile(rb"\d{19,}")
_NOT_SKELETON = b"0123456789+-.eE \t\r\n"
_BRACKETS_TO_SPACES = bytes.maketrans(b"[]", b"  ")

Buffer = bytes | bytearray


def loads(raw: Buffer | memoryview) -> Any:
    """orjson's ``loads`` when installed (strict: no NaN), else the standard library's."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a hub dependency
        import json

        return json.loads(bytes(raw))
    return orjson.loads(raw)


@dataclass(frozen=True)
class NumberSpan:
    """A ``[...]`` of numbers at ``body[start:end]``, not parsed yet."""

    body: Buffer
    start: int
    end: int

    def slow(self) -> Any:
        """The array parsed the ordinary way (Python lists)."""
        return loads(memoryview(self.body)[self.start : self.end])

    def to_array(
        self, datatype: str, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray | None:
        """The numbers as a ``dtype`` array of ``shape``; None: parse ``slow()`` instead."""
        if datatype in ("BOOL", "BYTES"):
            return None
        integer = dtype.kind in "iu"
        if integer and self._has_fraction_or_long_integer():
            return None
        count = math.prod(shape)
        parse_as = np.dtype(np.uint64 if dtype.kind == "u" else np.int64 if integer else np.float64)
        out = np.empty(count, dtype=dtype)
        nested = self.body.find(b"[", self.start + 1, self.end) >= 0
        # Nested arrays: their brackets and commas, to compare with the shape's. A flat one
        # has one bracket at each end (``_spans`` balanced them), and numpy refuses an empty
        # slot or two numbers in one, so its count of numbers is its count of slots.
        skeletons: list[bytes] = []
        filled = 0
        for chunk in self._chunks():
            if nested:
                skeletons.append(chunk.translate(None, _NOT_SKELETON))
            try:
                text = chunk.translate(_BRACKETS_TO_SPACES)
                values = np.fromstring(text, dtype=parse_as, sep=",")
            except ValueError:  # text that is not a number where one belongs
                return None
            if filled + values.size > count or (integer and not _fits(values, dtype)):
                return None
            with np.errstate(over="ignore"):  # floats beyond FP16/FP32's range become inf
                out[filled : filled + values.size] = values
            filled += values.size
        if filled != count:
            return None
        if nested and b",".join(skeletons) != _skeleton(shape):
            return None
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

    def _has_fraction_or_long_integer(self) -> bool:
        body, start, end = self.body, self.start, self.end
        return (
            any(body.find(c, start, end) >= 0 for c in (b".", b"e", b"E"))
            or _LONG_INTEGER.search(body, start, end) is not None
        )


def parse_request(body: Buffer) -> Any:
    """The request document, each large numeric ``inputs[i].data`` left as a ``NumberSpan``."""
    spans = _spans(body)
    if not spans:
        return loads(body)
    token = secrets.token_hex(8)
    view = memoryview(body)
    parts: list[bytes] = []
    previous = 0
    for index, (start, end) in enumerate(spans):
        parts.append(bytes(view[previous:start]))
        parts.append(f'"tandem-number-span:{token}:{index}"'.encode())
        previous = end
    parts.append(bytes(view[previous:]))
    document = loads(b"".join(parts))
    placeholders = {
        f"tandem-number-span:{token}:{i}": NumberSpan(body, s, e) for i, (s, e) in enumerate(spans)
    }
    if not _restore(document, placeholders):
        return loads(body)  # a span was not an input's data: no shortcuts
    return document


def _spans(body: Buffer) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    position = 0
    while (key := _DATA_KEY.search(body, position)) is not None:
        start = key.end() - 1
        guess = _NUMBER_TEXT.match(body, start)
        assert guess is not None  # the pattern matches the empty string at worst
        end = body.rfind(b"]", start, guess.end()) + 1
        if end - start >= MIN_SPAN_BYTES and body.count(b"[", start, end) == body.count(
            b"]", start, end
        ):
            spans.append((start, end))
            position = end
        else:
            position = key.end()
    return spans


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
