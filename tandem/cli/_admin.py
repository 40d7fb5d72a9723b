"""What the commands that talk to the CDN's admin API share (``tandem rollout``,
``tandem fleet list/show``, ``tandem models publish/assign --cdn``).

The ``--cdn``, ``--token`` and ``--ca`` options, the client
(``model_cdn.AdminClient``) with one-line errors (exit 1 when the CDN
refused or could not be reached, 2 when the command line was wrong), and
the checks of what the operator types: labels,
durations, percentages, ``MODEL@VERSION``, ids. Each check fails with one
line naming the option, before any request is made.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from model_cdn import AdminApiError, AdminClient
from model_cdn.admin_client import DEFAULT_CDN_URL

from ._common import fail

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "DEFAULT_CDN",
    "CaOption",
    "CdnOption",
    "JsonOption",
    "TokenOption",
    "admin_call",
    "admin_client",
    "admin_errors",
    "ago_text",
    "check_id",
    "parse_duration",
    "parse_fraction",
    "parse_labels",
    "parse_model_at_version",
    "parse_ratio",
    "plain_console",
    "print_json",
]

T = TypeVar("T")

_MODEL_AT_VERSION = re.compile(r"([^@]+)@([1-9][0-9]{0,17})")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# -- options and the client ----------------------------------------------------

CdnOption = Annotated[
    str,
    typer.Option("--cdn", envvar="TANDEM_CDN_URL", help="The CDN's URL (http:// or https://)."),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TANDEM_CDN_ADMIN_TOKEN",
        help="The CDN's admin token, or an API key with the rollout:admin scope.",
        show_default=False,
    ),
]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca",
        help="PEM CA to trust for an https:// CDN (default: the system's).",
        show_default=False,
    ),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the CDN's JSON answer instead (for scripts).")
]
DEFAULT_CDN = DEFAULT_CDN_URL


def admin_client(command: str, cdn: str, token: str | None, ca: Path | None) -> AdminClient:
    try:
        return AdminClient(cdn, token=token or None, ca=ca)
    except ValueError as e:
        fail(command, str(e), 2)


@contextmanager
def admin_errors(command: str) -> Iterator[None]:
    """A refusal or an unreachable CDN becomes one line and exit code 1."""
    try:
        yield
    except AdminApiError as e:
        message = str(e)
        if e.status == 401:
            message += " (pass --token or set TANDEM_CDN_ADMIN_TOKEN)"
        fail(command, message)


def admin_call(command: str, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)``; a refusal or an unreachable CDN becomes one line and exit code 1."""
    with admin_errors(command):
        try:
            return call(*args)
        except ValueError as e:
            fail(command, str(e), 2)


def parse_labels(values: Iterable[str], option: str, command: str) -> dict[str, str]:
    """``["site=a", "hw=npu"]`` -> ``{"site": "a", "hw": "npu"}``; a bad one exits 2."""
    labels: dict[str, str] = {}
    for text in values:
        name, sep, value = text.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            fail(command, f"{option} takes LABEL=VALUE (e.g. site=factory-a), got {text!r}", 2)
        if len(name) > 128 or len(value) > 128:
            fail(command, f"{option} {text[:40]!r}…: label names and values are ≤ 128 chars", 2)
        if labels.get(name, value) != value:
            fail(command, f"{option} gives label {name!r} two values", 2)
        labels[name] = value
    return labels


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def ago_text(when: object, now: float | None = None) -> str:
    """Epoch seconds for a person: ``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``."""
    if not isinstance(when, int | float) or isinstance(when, bool):
        return "—"
    age = (time.time() if now is None else now) - when
    if age < 1:
        return "just now"
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60)):
        if age >= seconds:
            return f"{int(age // seconds)} {unit} ago"
    return f"{int(age)} s ago"


# -- what the operator types ---------------------------------------------------


def parse_duration(text: str, option: str, command: str, *, positive: bool = False) -> float:
    """``90s``, ``10m``, ``1h30m`` or plain seconds (``600``, ``0.5``) -> seconds."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if _NUMBER.fullmatch(value):
        seconds = float(value)
    elif match is not None and value:
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    else:
        fail(
            command,
            f"{option} takes a duration such as 90s, 10m, 1h30m or plain seconds, got {text!r}",
            2,
        )
    if not math.isfinite(seconds) or (positive and seconds <= 0):
        fail(command, f"{option} must be more than 0 seconds, got {text!r}", 2)
    return seconds


def parse_fraction(text: str, option: str, command: str) -> float:
    """``2%`` or ``0.02`` -> 0.02; anything outside [0, 1] exits 2."""
    value = text.strip()
    number = value[:-1].strip() if value.endswith("%") else value
    if not _NUMBER.fullmatch(number):
        fail(
            command,
            f"{option} takes a percentage such as 2% or a fraction such as 0.02, got {text!r}",
            2,
        )
    fraction = float(number) / (100 if value.endswith("%") else 1)
    if not 0 <= fraction <= 1:
        fail(
            command, f"{option} must be between 0% and 100% (a fraction in [0, 1]), got {text!r}", 2
        )
    return fraction


def parse_ratio(text: str, option: str, command: str) -> float:
    """``1.2`` or ``1.2x`` (new / old, at least 1)."""
    value = text.strip().lower().removesuffix("x")
    if not _NUMBER.fullmatch(value) or float(value) < 1:
        fail(command, f"{option} takes a ratio of at least 1 such as 1.2, got {text!r}", 2)
    return float(value)


def parse_model_at_version(text: str, command: str) -> tuple[str, int]:
    from shared import NAME_PATTERN

    match = _MODEL_AT_VERSION.fullmatch(text.strip())
    if match is None:
        fail(command, f"write what to roll out as MODEL@VERSION (e.g. mnist@3), got {text!r}", 2)
    if not NAME_PATTERN.fullmatch(match.group(1)):
        fail(
            command,
            f"invalid model name {match.group(1)!r:.80}: use 1-128 characters from "
            "A-Z a-z 0-9 . _ -, starting with a letter or digit",
            2,
        )
    return match.group(1), int(match.group(2))


def check_id(rollout_id: str, command: str) -> str:
    if not _ID.fullmatch(rollout_id):
        fail(command, f"{rollout_id[:80]!r} is not a rollout id (like ro-1a2b3c4d5e6f)", 2)
    return rollout_id


def plain_console() -> Console:
    """A console that shows text as it is: a label like ``[red]`` or ``:x:`` is not markup."""
    from rich.console import Console

    return Console(markup=False, emoji=False)
