"""OpenAI request bodies checked field by field, and the response and chunk shapes.

Every wrong field is an ``InvalidRequestError`` naming it (400 in OpenAI's
error JSON), never a 500. Fields the hub does not act on (``user``,
``logit_bias``, ``presence_penalty``...) are accepted and ignored, as
vLLM does; ``n`` other than 1, ``logprobs``, ``echo`` and ``best_of`` are
refused, since the answer would not be what was asked.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidRequestError
from ..language import Sampling

__all__ = [
    "GenerateBody",
    "chat_prompt",
    "chunk",
    "completion_response",
    "error_body",
    "parse_body",
]

_REFUSED = {"n": 1, "best_of": 1, "echo": False}


@dataclass(frozen=True)
class GenerateBody:
    model: str
    prompt: str | list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    sampling: Sampling
    chat: bool


def parse_body(raw: bytes, *, chat: bool) -> GenerateBody:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"the body is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidRequestError("the body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a string")
    for name, allowed in _REFUSED.items():
        if data.get(name, allowed) not in (allowed, None):
            raise InvalidRequestError(f"'{name}' must be {json.dumps(allowed)} here")
    if data.get("logprobs") not in (None, False, 0):
        raise InvalidRequestError("'logprobs' is not supported")
    prompt = chat_prompt(data.get("messages")) if chat else _prompt(data.get("prompt"))
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate escaped in the JSON
            raise InvalidRequestError(f"the prompt is not valid Unicode text: {e.reason}") from e
    key = "max_completion_tokens" if chat and "max_completion_tokens" in data else "max_tokens"
    max_tokens = data.get(key)
    if max_tokens is not None and not _is_int(max_tokens):
        raise InvalidRequestError(f"'{key}' must be an integer, got {max_tokens!r:.40}")
    if max_tokens is None and not chat:
        max_tokens = 16  # OpenAI's default for /v1/completions
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be true or false")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequestError("'stream_options' must be an object")
    return GenerateBody(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=bool(stream),
        include_usage=options.get("include_usage") is True,
        sampling=_sampling(data),
        chat=chat,
    )


def chat_prompt(messages: object) -> str:
    """The prompt text of ``messages``: ``"<role>: <content>\\n"`` each, then ``"assistant:"``.

    The models built here have no chat template of their own, so the hub uses
    this plain one (documented in docs/language-models.md).
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise InvalidRequestError(f"messages[{i}].role {role!r:.40} is not a known role")
        if isinstance(content, list):  # content parts: text only
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise InvalidRequestError(f"messages[{i}].content: only text parts are served")
            content = "".join(texts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            raise InvalidRequestError(f"messages[{i}].content must be a string")
        lines.append(f"{role}: {content}\n")
    return "".join(lines) + "assistant:"


def _prompt(prompt: object) -> str | list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("'prompt' is empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return [int(t) for t in prompt]
    raise InvalidRequestError(
        "'prompt' must be a non-empty string or array of token ids (one prompt per request)"
    )


def _sampling(data: dict[str, Any]) -> Sampling:
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    seed = data.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**32):
        raise InvalidRequestError("'seed' must be an integer in [0, 2**32)")
    stop = data.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (
        isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)
    ):
        raise InvalidRequestError("'stop' must be a string or an array of non-empty strings")
    return Sampling(temperature=temperature, top_p=top_p, seed=seed, stop=tuple(stop or ()))


def _number(data: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"'{name}' must be a number")
    if not low <= value <= high:
        raise InvalidRequestError(f"'{name}' must be in [{low:g}, {high:g}], got {value:g}")
    return float(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- answers


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens a kept conversation reused."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_response(
    body: GenerateBody,
    rid: str,
    text: str,
    finish: str,
    prompt_tokens: int,
    completion: int,
    cached: int = 0,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    if body.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {
        "id": rid,
        "object": "chat.completion" if body.chat else "text_completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion, cached),
    }


def chunk(
    body: GenerateBody,
    rid: str,
    text: str | None,
    finish: str | None,
    *,
    first: bool = False,
    usage_of: tuple[int, int, int] | None = None,
) -> str:
    """One server-sent event (``data: {...}\\n\\n``) in OpenAI's chunk format."""
    choices: list[dict[str, Any]] = []
    if usage_of is None:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if body.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choices.append(choice)
    event: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if body.chat else "text_completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": choices,
    }
    if usage_of is not None:
        event["usage"] = usage(*usage_of)
    return f"data: {json.dumps(event)}\n\n"


def error_body(message: str, status: int) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
        429: "rate_limit_exceeded",
        503: "server_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {404: "model_not_found", 429: "rate_limit_exceeded", 401: "invalid_api_key"}
    return {"error": {"message": message, "type": kind, "param": None, "code": code.get(status)}}
