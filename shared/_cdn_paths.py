"""The model CDN's HTTP URL layout: written once, used by the server, devices and the CLI.

Every path hangs under ``/v1``::

    /v1/models                                         names of the published models
    /v1/models/{name}/versions                         versions of one model
    /v1/models/{name}/manifest                         latest signed manifest
    /v1/models/{name}/versions/{version}/manifest      one signed manifest
    /v1/models/{name}/versions/{version}               one version (DELETE)
    /v1/blobs/{digest}                                 a blob, content-addressed (sha256:...)
    /v1/devices                                        devices the CDN has heard from
    /v1/devices/{device}                               one device
    /v1/devices/{device}/assignments/{model}           a device's signed assignment
    /v1/rollouts                                       staged rollouts
    /v1/rollouts/{rollout_id}                          one rollout
    /v1/rollouts/{rollout_id}/{command}                pause | resume | abort | rollback | skip-gate

``CdnPaths(base)`` builds concrete URLs (``base`` is ``""`` for paths, or a
server's origin such as ``https://cdn.example``); ``CdnPaths.ROUTES`` holds the
same paths as templates, with ``{placeholders}``, for the server's routes.
Names are checked (``validate_name``) and digests matched (``DIGEST_PATTERN``)
before they become part of a URL, so nothing a peer sends can add a path level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import quote

from ._errors import ConfigError
from ._topics import validate_name

__all__ = ["DIGEST_PATTERN", "CdnPaths"]

DIGEST_PATTERN = re.compile(r"sha256:([0-9a-f]{64})")
"""A blob's name: ``sha256:`` and 64 lowercase hex digits (group 1: the hex)."""

_ROLLOUT_COMMANDS = frozenset({"pause", "resume", "abort", "rollback", "skip-gate"})
_MAX_ROLLOUT_ID = 128


@dataclass(frozen=True)
class CdnPaths:
    """Builds the CDN's URLs under ``base`` (no trailing slash; ``""`` for bare paths)."""

    base: str = ""

    ROUTES: ClassVar[dict[str, str]] = {
        "models": "/v1/models",
        "versions": "/v1/models/{name}/versions",
        "latest_manifest": "/v1/models/{name}/manifest",
        "manifest": "/v1/models/{name}/versions/{version}/manifest",
        "version": "/v1/models/{name}/versions/{version}",
        "blob": "/v1/blobs/{digest}",
        "devices": "/v1/devices",
        "device": "/v1/devices/{device}",
        "assignment": "/v1/devices/{device}/assignments/{model}",
        "rollouts": "/v1/rollouts",
        "rollout": "/v1/rollouts/{rollout_id}",
        "rollout_command": "/v1/rollouts/{rollout_id}/{command}",
        "root": "/v1/roots/{version}.root.json",
        "fleet_labels": "/v1/fleet/labels",  # POST: the operator's labels of devices
        # the fleet console (model_cdn/console/console.js writes the same paths)
        "console": "/console",
        "console_page": "/console/",
        "console_asset": "/console/{asset}",
        "console_whoami": "/console/api/whoami",
        "console_overview": "/console/api/overview",
        "console_devices": "/console/api/devices",
        "console_rollout": "/console/api/rollouts/{rollout_id}",
        "console_model": "/console/api/models/{name}",
        "console_command": "/console/api/rollouts/{rollout_id}/{command}",
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", self.base.rstrip("/"))

    def models(self) -> str:
        return f"{self.base}/v1/models"

    def versions(self, name: str) -> str:
        return f"{self.base}/v1/models/{validate_name(name, 'model name')}/versions"

    def manifest(self, name: str, version: int | None = None) -> str:
        """The signed manifest of ``name@version``; the latest one when ``version`` is None."""
        model = validate_name(name, "model name")
        if version is None:
            return f"{self.base}/v1/models/{model}/manifest"
        return f"{self.base}/v1/models/{model}/versions/{_version(version)}/manifest"

    def version(self, name: str, version: int) -> str:
        return f"{self.base}/v1/models/{validate_name(name, 'model name')}/versions/" + str(
            _version(version)
        )

    def blob(self, digest: str) -> str:
        if not isinstance(digest, str) or not DIGEST_PATTERN.fullmatch(digest):
            raise ConfigError(f"invalid blob digest {digest!r:.80}: expected sha256:<64 hex>")
        return f"{self.base}/v1/blobs/{digest}"

    def devices(self) -> str:
        return f"{self.base}/v1/devices"

    def fleet_labels(self) -> str:
        return f"{self.base}{self.ROUTES['fleet_labels']}"

    def device(self, device: str) -> str:
        return f"{self.base}/v1/devices/{validate_name(device, 'device id')}"

    def assignment(self, device: str, model: str) -> str:
        return (
            f"{self.base}/v1/devices/{validate_name(device, 'device id')}"
            f"/assignments/{validate_name(model, 'model name')}"
        )

    def root(self, version: int) -> str:
        """Root metadata ``version`` (``shared.RootMetadata``), as devices walk the chain."""
        return f"{self.base}/v1/roots/{_version(version)}.root.json"

    def rollouts(self) -> str:
        return f"{self.base}/v1/rollouts"

    def rollout(self, rollout_id: str) -> str:
        return f"{self.base}/v1/rollouts/{_rollout_id(rollout_id)}"

    def rollout_command(self, rollout_id: str, command: str) -> str:
        if command not in _ROLLOUT_COMMANDS:
            raise ConfigError(
                f"unknown rollout command {command!r:.40}; use one of "
                + ", ".join(sorted(_ROLLOUT_COMMANDS))
            )
        return f"{self.rollout(rollout_id)}/{command}"


def _version(version: object) -> int:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"a model version is an integer >= 1, got {version!r:.40}")
    return version


def _rollout_id(rollout_id: object) -> str:
    if (
        not isinstance(rollout_id, str)
        or not 0 < len(rollout_id) <= _MAX_ROLLOUT_ID
        or not rollout_id.isprintable()
    ):
        raise ConfigError(f"invalid rollout id {rollout_id!r:.80}")
    return quote(rollout_id, safe="")
