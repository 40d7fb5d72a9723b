"""Who may do what on the CDN: the admin and read tokens, and API keys with scopes.

Routes and what they accept (``Authorization: Bearer <token or key>``)::

    GET /healthz                                  open
    reads (models, manifests, blobs, assignments) open, unless a read token or API keys are
                                                  set: then the read token, the admin token,
                                                  or a key with models:read
    PUT blobs, POST and DELETE versions           the admin token, or a key with models:publish
    PUT assignments, rollouts, devices            the admin token, or a key with rollout:admin

Text starting ``tdm_`` is judged as an API key; anything else as a token,
compared in constant time. Answers: 401 with ``WWW-Authenticate: Bearer``
for no or malformed credentials and for an unknown or revoked key; 403 for
a wrong token, for a key without the scope, and when the admin API is off
(no admin token and no keys); 429 with ``Retry-After`` when a key's rate is
spent. The key decision is ``shared.ApiKeyGuard``; ``CdnAuth`` is the
mapping, pure; ``Guards`` turns it into the FastAPI dependencies the routes
declare (reading the request's ``Authorization`` header is all they do).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request

from shared import InvalidApiKeyError, RateLimitedError, ScopeError
from shared.server import ApiKeyGuard, looks_like_api_key

from .._errors import AuthDenied

__all__ = ["ADMIN_SCOPES", "AuthDenied", "CdnAuth", "Guards"]

ADMIN_SCOPES = frozenset({"models:publish", "rollout:admin"})
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _same(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


class CdnAuth:
    """The CDN's access rules over its tokens and an optional ``ApiKeyGuard``."""

    def __init__(
        self,
        *,
        admin_token: str | None,
        read_token: str | None = None,
        api_keys: ApiKeyGuard | None = None,
    ) -> None:
        self.admin_token = admin_token
        self.read_token = read_token
        self.api_keys = api_keys

    def require_read(self, authorization: str | None) -> None:
        if self.read_token is None and self.api_keys is None:
            return
        token = _bearer(authorization)
        if _same(token, self.read_token) or _same(token, self.admin_token):
            return
        if self._as_key(token, "models:read"):
            return
        raise AuthDenied(403, "wrong read token")

    def require_admin(self, authorization: str | None, scope: str) -> None:
        """The admin token, or a key with ``scope`` (one of ``ADMIN_SCOPES``)."""
        if scope not in ADMIN_SCOPES:
            raise ValueError(f"not an admin scope: {scope!r}")
        if self.admin_token is None and self.api_keys is None:
            raise AuthDenied(403, "the admin API is off: start the server with an admin token")
        token = _bearer(authorization)
        if _same(token, self.admin_token):
            return
        if self._as_key(token, scope):
            return
        raise AuthDenied(403, "wrong admin token")

    def _as_key(self, token: str, scope: str) -> bool:
        """True when ``token`` is a key allowed ``scope``; False when it is not a key at all."""
        if self.api_keys is None:
            return False
        if not looks_like_api_key(token):
            if self.admin_token is None and self.read_token is None:
                raise AuthDenied(401, "malformed API key: expected tdm_<id>_<secret>", _CHALLENGE)
            return False
        try:
            self.api_keys.check(token, [scope])
        except InvalidApiKeyError as e:
            raise AuthDenied(401, str(e), _CHALLENGE) from e
        except ScopeError as e:
            raise AuthDenied(403, str(e)) from e
        except RateLimitedError as e:
            raise AuthDenied(429, str(e), {"Retry-After": e.retry_after_header}) from e
        return True


def _bearer(header: str | None) -> str:
    if header is None:
        raise AuthDenied(401, "missing Authorization: Bearer <token>", _CHALLENGE)
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise AuthDenied(401, "malformed Authorization header: use 'Bearer <token>'", _CHALLENGE)
    return token


@dataclass(frozen=True)
class Guards:
    """The dependencies of each kind of route: ``dependencies=guards.read`` and so on."""

    read: list[Any]
    publish: list[Any]  # models:publish
    rollout: list[Any]  # rollout:admin

    @classmethod
    def of(cls, auth: CdnAuth) -> Guards:
        return cls(
            read=_guard(auth.require_read),
            publish=_guard(lambda header: auth.require_admin(header, "models:publish")),
            rollout=_guard(lambda header: auth.require_admin(header, "rollout:admin")),
        )


def _guard(check: Callable[[str | None], None]) -> list[Any]:
    def dependency(request: Request) -> None:
        check(request.headers.get("authorization"))  # AuthDenied: answered by its status

    return [Depends(dependency)]
