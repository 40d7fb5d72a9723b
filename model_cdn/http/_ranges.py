"""HTTP conditional and range requests on immutable blobs, decided without I/O.

Blobs never change, so the rules are short:

- ``If-None-Match`` naming the blob's ETag (weak or strong, or ``*``) -> 304.
- ``If-Range`` that is not exactly the ETag (a date, another or a weak tag)
  -> ignore ``Range``: the whole blob, 200.
- ``Range: bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` (one range) -> 206;
  ``b`` past the end is clamped, ``-n`` longer than the blob is the whole blob.
- A first byte at or past the end (``-0`` included, every range of an
  empty blob, and a first byte of any number of digits: ``bytes=<huge>-``
  is a valid range no blob can satisfy) -> 416 with ``Content-Range: bytes */size``.
  A last byte or suffix of any length is clamped to the blob.
- Anything else (another unit, several ranges, ``b < a``, junk) -> ignore
  ``Range``, 200, as RFC 9110 section 14.2 allows. Several ranges are ignored
  rather than answered as ``multipart/byteranges``: downloaders resume with
  one range, and one rule serves both the file and the streamed path.

These match Starlette's ``FileResponse`` with ``max_ranges = 1`` for every
request they honour, so the server can let ``FileResponse`` send local files
and hand it no ``Range`` header when the plan is "whole blob".

``RangeNotSatisfiableError`` (a ``model_cdn.HttpError``) carries the 416 and
its ``Content-Range: bytes */size`` header, so the blob route lets it through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._errors import RangeNotSatisfiableError

__all__ = ["ByteRange", "RangeNotSatisfiableError", "etag_matches", "plan_range"]

_SPEC = re.compile(r"\s*([0-9]*)\s*-\s*([0-9]*)\s*")
_MAX_DIGITS = 19  # beyond int64: compared by length, never converted (no giant ints)
_FAR = 10**_MAX_DIGITS  # stands for any offset of more digits: past every blob


@dataclass(frozen=True)
class ByteRange:
    start: int  # first byte
    end: int  # one past the last byte

    @property
    def length(self) -> int:
        return self.end - self.start

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.end - 1}/{size}"


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (weak comparison, as RFC 9110 asks)."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    tags = (t.strip().removeprefix("W/") for t in if_none_match.split(","))
    return etag.removeprefix("W/") in tags


def plan_range(
    range_header: str | None, if_range: str | None, etag: str, size: int
) -> ByteRange | None:
    """The one byte range to send, or None for the whole blob (see the module docstring)."""
    if range_header is None:
        return None
    if if_range is not None and if_range.strip() != etag:
        return None
    unit, sep, spec = range_header.partition("=")
    if not sep or unit.strip().lower() != "bytes" or "," in spec:
        return None
    match = _SPEC.fullmatch(spec)
    if match is None:
        return None
    first, last = match.groups()
    if not (first or last):
        return None
    if not first:  # a suffix: the last n bytes
        start, end = max(size - _offset(last), 0), size
    else:
        start = _offset(first)
        if last and _offset(last) < start:
            return None
        end = min(_offset(last) + 1, size) if last else size
    if start >= size:
        raise RangeNotSatisfiableError(size)
    return ByteRange(start, end)


def _offset(digits: str) -> int:
    """A byte offset; one of more than 19 digits is past every blob (``_FAR``)."""
    digits = digits.lstrip("0") or "0"
    return _FAR if len(digits) > _MAX_DIGITS else int(digits)
