"""API keys on the hub's HTTP API: which scope each route needs, and the answers when refused.

Routes and the scopes they need (a key with any one of them passes)::

    GET  /v2, /v2/health/live, /v2/health/ready       open (load balancer and k8s probes)
    GET  /v2/models/{name}[/versions/{v}][/ready]     models:read or infer
    POST /v2/models/{name}[/versions/{v}]/infer       infer
    GET  /v2/models[/{name}[/versions/{v}]]/stats     rollout:admin (Triton's statistics)
    *    /v2/repository/...                           rollout:admin (index, load, unload)
    GET  /metrics                                     open: not a /v2 route; serve the hub
                                                      on a private network or put a proxy
                                                      in front that keeps /metrics inside

Keys go in ``Authorization: Bearer tdm_<id>_<secret>``. Refusals are the app's
error shape, ``{"error": "..."}``: 401 with ``WWW-Authenticate: Bearer`` for
no, malformed, unknown or revoked key; 403 for a key without the scope; 429
with ``Retry-After`` (whole seconds, ≥ 1) when the key's rate is spent. The
decision itself is ``shared.ApiKeyGuard``; this module only maps routes to
scopes and errors to statuses.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Request
from starlette.exceptions import HTTPException

from shared import InvalidApiKeyError, RateLimitedError, ScopeError
from shared.server import ApiKeyGuard

__all__ = ["api_key_auth", "scopes_for"]

_OPEN = frozenset({"/v2", "/v2/", "/v2/health/live", "/v2/health/ready"})
_ADMIN = frozenset({"rollout:admin"})  # the one admin scope: what a hub serves, how it did
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def scopes_for(method: str, path: str) -> frozenset[str] | None:
    """The scopes of which a key needs one for ``method path``; None when the route is open."""
    if path in _OPEN:
        return None
    if path.startswith("/v2/repository/") or path.endswith("/stats"):
        return _ADMIN
    if method == "POST" and path.endswith("/infer"):
        return frozenset({"infer"})
    return frozenset({"models:read", "infer"})


def api_key_auth(guard: ApiKeyGuard) -> Any:
    """A FastAPI dependency for ``create_app(hub, dependencies=[...])`` enforcing ``guard``."""

    async def require_api_key(request: Request) -> None:
        # The route's template, not the URL: right under a root_path, and no path tricks.
        route = request.scope.get("route")
        scopes = scopes_for(request.method, getattr(route, "path", request.url.path))
        if scopes is None:
            return
        header = request.headers.get("authorization")
        if header is None:
            raise HTTPException(401, "missing Authorization: Bearer <API key>", _CHALLENGE)
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            raise HTTPException(
                401, "malformed Authorization header: use 'Bearer <API key>'", _CHALLENGE
            )
        try:
            key = guard.check(token, scopes)
        except InvalidApiKeyError as e:
            raise HTTPException(401, str(e), _CHALLENGE) from e
        except ScopeError as e:
            raise HTTPException(403, str(e)) from e
        except RateLimitedError as e:
            raise HTTPException(429, str(e), {"Retry-After": e.retry_after_header}) from e
        request.state.api_key_id = key.id

    return Depends(require_api_key)
