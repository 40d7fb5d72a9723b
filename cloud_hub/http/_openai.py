"""OpenAI-compatible routes for the hub's language models (the embedded plane's ``Hub``).

::

    GET  /v1/models             [models:read or generate]  the language models served
    POST /v1/completions        [generate]  {"model", "prompt", "max_tokens", "stream", ...}
    POST /v1/chat/completions   [generate]  {"model", "messages", "max_tokens", "stream", ...}

With ``"stream": true`` the answer is server-sent events, one OpenAI chunk
per ``data:`` line as the engine produces text (the text of every token that
arrived since the last chunk; after the first, chunks are at least
``SSE_INTERVAL_S`` apart, and a client that falls behind gets fewer, larger
chunks), the last one carrying
``finish_reason`` (then a usage chunk if ``stream_options.include_usage``),
then ``data: [DONE]``. A client that disconnects mid-stream cancels its turn
in the engine, which frees the slot at once.

A client names its conversation with the ``X-Tandem-Conversation`` header
(any id of its own, 1-128 visible ASCII characters; the ``openai`` client
sends it with ``extra_headers`` or ``default_headers``): the hub keeps that
conversation's KV cache after the turn, and a next turn whose prompt repeats
the history (token by token) prefills only the rest; ``usage`` reports the
reused tokens as ``prompt_tokens_details.cached_tokens``. Ids are scoped by
API key: one key never reaches another's conversation.

Errors are OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``: 400 for a bad body (a field's type, ``max_tokens`` out of range,
a prompt over the model's limit), 404 for an unknown model, 401/403 for
keys, 429 with ``Retry-After`` when a key's requests or its tokens are
spent, 503 with ``Retry-After`` when the model's queue is full.

Rate limits in tokens (``TokenBudget``), as vLLM-style gateways and TGI
count them: each key (or everyone, without API keys) has a bucket of
``burst`` tokens refilled at ``per_s``; a request is admitted while the
bucket is not empty, and its prompt and completion tokens are taken when it
ends (the bucket may go below zero: the next requests wait for the refill).
The key's own request rate (``ApiKey.rate``) counts too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from shared import InvalidApiKeyError, RateLimitedError, ScopeError
from shared.server import ApiKeyGuard

from .._errors import HubError, InvalidRequestError
from ..language import LanguageModels, TurnUpdate
from ._errors import describe, status_of
from ._openai_bodies import (
    GenerateBody,
    chunk,
    completion_response,
    error_body,
    new_id,
    parse_body,
)

__all__ = ["MAX_BODY_BYTES", "TokenBudget", "openai_router"]

MAX_BODY_BYTES = 1024 * 1024
_ENCODE_INLINE_CHARS = 4096
_FINISH = {"stop": "stop", "length": "length"}
CONVERSATION_HEADER = "x-tandem-conversation"
# A streamed answer's chunks after the first are at least this far apart; the text that
# arrives meanwhile goes in the next one (one SSE event per token costs more, in the
# server and its client, than a decoding step of a small model; see bench hub-generate).
SSE_INTERVAL_S = 0.02
_CONVERSATION_CHARS = 128


class TokenBudget:
    """A token bucket per key counted in model tokens; thread-safe. See the module docstring."""

    def __init__(
        self, per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not per_s > 0 or burst < 1:
            raise ValueError("per_s must be > 0 and burst >= 1")
        self.per_s, self.burst, self._clock = per_s, burst, clock
        self._level: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _refilled(self, key: str) -> float:
        level, at = self._level.get(key, (float(self.burst), self._clock()))
        now = self._clock()
        level = min(float(self.burst), level + (now - at) * self.per_s)
        self._level[key] = (level, now)
        return level

    def admit(self, key: str) -> float:
        """0.0 if ``key`` may start a request now, else the seconds until it may."""
        with self._lock:
            level = self._refilled(key)
        return 0.0 if level > 0 else (1.0 - level) / self.per_s

    def charge(self, key: str, tokens: int) -> None:
        with self._lock:
            level = self._refilled(key)
            self._level[key] = (level - tokens, self._clock())


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if status == 503:
        headers.setdefault("Retry-After", "1")
    return JSONResponse(error_body(message, status), status_code=status, headers=headers)


def openai_router(
    models: LanguageModels,
    *,
    api_keys: ApiKeyGuard | None = None,
    token_budget: TokenBudget | None = None,
) -> APIRouter:
    """The ``/v1`` routes over ``models`` (a hub's ``hub.language``)."""
    api = _OpenAiApi(models, api_keys, token_budget)
    router = APIRouter(prefix="/v1")
    router.add_api_route("/models", api.list_models, methods=["GET"])
    router.add_api_route("/completions", api.completions, methods=["POST"])
    router.add_api_route("/chat/completions", api.chat_completions, methods=["POST"])
    return router


class _OpenAiApi:
    def __init__(
        self, models: LanguageModels, guard: ApiKeyGuard | None, budget: TokenBudget | None
    ) -> None:
        self.models, self.guard, self.budget = models, guard, budget

    def _key(self, request: Request, scopes: frozenset[str]) -> str | JSONResponse:
        """The caller's key id (``"anonymous"`` without API keys), or the refusal."""
        if self.guard is None:
            return "anonymous"
        challenge = {"WWW-Authenticate": "Bearer"}
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            return _error(401, "missing or malformed Authorization: Bearer <API key>", challenge)
        try:
            return self.guard.check(token, scopes).id
        except InvalidApiKeyError as e:
            return _error(401, str(e), challenge)
        except ScopeError as e:
            return _error(403, str(e))
        except RateLimitedError as e:
            return _error(429, str(e), {"Retry-After": e.retry_after_header})

    def _admit(self, request: Request) -> str | JSONResponse:
        key = self._key(request, frozenset({"generate"}))
        if isinstance(key, str) and self.budget is not None:
            wait = self.budget.admit(key)
            if wait > 0:
                retry = str(max(1, int(wait + 0.999)))
                return _error(
                    429, f"the token budget of key {key} is spent; retry in {retry} s",
                    {"Retry-After": retry},
                )  # fmt: skip
        return key

    async def list_models(self, request: Request) -> Response:
        key = self._key(request, frozenset({"models:read", "generate"}))
        if not isinstance(key, str):
            return key
        data = [
            {"id": m.name, "object": "model", "created": m.created, "owned_by": "tandem"}
            for m in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        key = self._admit(request)
        if not isinstance(key, str):
            return key
        try:
            raw = await _read(request)
            if raw is None:
                return _error(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
            body = parse_body(raw, chat=chat)
            engine = self.models.get(body.model).engine
            if isinstance(body.prompt, list):
                ids: Any = body.prompt
            elif len(body.prompt) <= _ENCODE_INLINE_CHARS:
                ids = engine.encode(body.prompt)
            else:  # a long text: tokenize off the event loop
                ids = await run_in_threadpool(engine.encode, body.prompt)
            max_tokens = body.max_tokens
            if max_tokens is None:
                max_tokens = engine.default_max_tokens(len(ids))
            conversation = _conversation(request, key)
            stream = _Stream(asyncio.get_running_loop())
            turn = engine.submit(
                ids, max_tokens=max_tokens, sink=stream.put, sampling=body.sampling,
                conversation=conversation,
            )  # fmt: skip
        except HubError as e:
            status, _, message = describe(e)
            return _error(status, message)
        rid = new_id(chat)
        if body.stream:
            events = self._events(request, body, rid, stream, turn.cancel, key)
            return StreamingResponse(events, media_type="text/event-stream")
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, turn.cancel))
        try:
            parts, last = await stream.collect()
        finally:
            watcher.cancel()
            turn.cancel()  # no-op when finished; frees the slot if this task was cancelled
        self._charge(key, last)
        if last.finish not in _FINISH:
            status = status_of(last.code) if last.finish == "error" else 503
            return _error(status, last.error or "turn cancelled")
        content = completion_response(
            body, rid, "".join(parts), _FINISH[last.finish or "stop"],
            last.prompt_tokens, last.completion_tokens, last.cached_prompt_tokens,
        )  # fmt: skip
        return JSONResponse(content)

    async def _events(
        self,
        request: Request,
        body: GenerateBody,
        rid: str,
        stream: _Stream,
        cancel: Callable[[], None],
        key: str,
    ) -> AsyncIterator[str]:
        last: TurnUpdate | None = None
        # Starlette notices a gone client only when a send fails (ASGI 2.4): watch for it
        # while the engine works, so that the turn is cancelled at once, not at its next token.
        watcher = asyncio.ensure_future(_cancel_on_disconnect(request, cancel))
        try:
            first = True
            while True:
                text, update = await stream.coalesced()
                last = update
                if text or first:
                    yield chunk(body, rid, text, None, first=first)
                    first = False
                if update.finish is not None:
                    break
                if text:  # the next chunk takes what arrives meanwhile (not the first one)
                    await asyncio.sleep(SSE_INTERVAL_S)
            finish = _FINISH.get(update.finish or "", "stop")
            if update.finish == "error":
                failed = error_body(update.error or "failed", status_of(update.code))
                yield f"data: {json.dumps(failed)}\n\n"
            else:
                yield chunk(body, rid, None, finish)
                if body.include_usage:
                    usage_of = (
                        update.prompt_tokens, update.completion_tokens,
                        update.cached_prompt_tokens,
                    )  # fmt: skip
                    yield chunk(body, rid, None, None, usage_of=usage_of)
            yield "data: [DONE]\n\n"
        finally:  # done, or the client went away (the task is cancelled): free the slot
            watcher.cancel()
            cancel()
            self._charge(key, last)

    def _charge(self, key: str, last: TurnUpdate | None) -> None:
        if self.budget is not None and last is not None:
            self.budget.charge(key, last.prompt_tokens + last.completion_tokens)


class _Stream:
    """Updates from the engine thread into the event loop, in order.

    The engine thread appends; the loop is woken once for everything that
    arrived since it last looked (not once per token: at 16 streams the
    per-token wake-ups cost the engine thread the interpreter lock).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: collections.deque[TurnUpdate] = collections.deque()
        self._scheduled = False
        self._woken = asyncio.Event()

    def put(self, update: TurnUpdate) -> None:  # the engine thread (or a canceller's)
        with self._lock:
            self._pending.append(update)
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self._loop.call_soon_threadsafe(self._woken.set)

    async def _take(self) -> list[TurnUpdate]:
        """Every update here now, at least one (waiting for it)."""
        while True:
            with self._lock:
                self._scheduled = False
                if self._pending:
                    updates = list(self._pending)
                    self._pending.clear()
                    return updates
            self._woken.clear()  # a put after the check schedules a set that runs after this
            await self._woken.wait()

    async def coalesced(self) -> tuple[str, TurnUpdate]:
        """The text of every update already here (at least one), and the last of them.

        A client or a loop that falls behind gets fewer, larger chunks rather than
        a backlog of one-token events.
        """
        updates = await self._take()
        return "".join(u.text for u in updates), updates[-1]

    async def collect(self) -> tuple[list[str], TurnUpdate]:
        parts = []
        while True:
            updates = await self._take()
            parts += [u.text for u in updates]
            if updates[-1].finish is not None:
                return parts, updates[-1]


def _conversation(request: Request, key: str) -> str | None:
    """The turn's conversation id in the engine (the header's, scoped by key), if named."""
    name = request.headers.get(CONVERSATION_HEADER)
    if name is None:
        return None
    if not 1 <= len(name) <= _CONVERSATION_CHARS or not all(33 <= ord(c) < 127 for c in name):
        raise InvalidRequestError(
            f"X-Tandem-Conversation must be 1-{_CONVERSATION_CHARS} visible ASCII characters"
        )
    return f"{key}/{name}"


async def _cancel_on_disconnect(request: Request, cancel: Callable[[], None]) -> None:
    """Call ``cancel`` when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel()
            return


async def _read(request: Request) -> bytes | None:
    """The body, or None when it exceeds ``MAX_BODY_BYTES``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)
