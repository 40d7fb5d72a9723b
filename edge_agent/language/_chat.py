"""A dialogue with a language model on the device, keeping its KV cache between turns.

``Conversation`` holds the messages, the token ids the model has seen
(history), and the ONNX Runtime GenAI ``Generator`` that holds their KV
cache. A turn appends only its new tokens to that generator
(``append_tokens`` on the same ``Generator``), so the history is not
computed again. The history is prefilled anew (a fresh generator) when
there is no kept state: the first turn, after the model ended a reply with
its end-of-sequence token (the generator is then done), after a failed
turn, when the sampling options change (they are fixed per generator) or
when the agent's language model changed.

The chat template (the tiny models ship with none), one line per message::

    System: {content}
    User: {content}
    Assistant: {content}

and the prompt ends with ``Assistant:``, which the model continues. The
text a turn appends starts with a newline after the previous reply, so the
history reads as the template above. Roles are ``system``, ``user`` and
``assistant``.

A turn the hub answers sends the whole history as text (the hub model may
tokenize differently), with the conversation's ``id`` and turn number so a
hub that keeps KV caches can find its own; the turn goes to the hub
replica that answered the last one (``hub``, sticky: its KV cache is
there; ``_cloud`` re-routes it to any replica when that one is gone); its
reply joins the history
like a local one, and the kept generator, which has not seen it, is
dropped: the next local turn re-prefills. A turn handed to the hub mid-turn
(``handoff=``) sends the hub the history, the turn's prompt and the device's
tokens as ids; its reply (the device's ids, then the hub's text) joins the
history, and the kept generator, which holds everything up to the handoff,
serves the next turn (rewound and fed the rest).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import InvalidInputError

if TYPE_CHECKING:
    from ._runtime import LanguageRuntime

__all__ = ["ROLES", "Conversation", "render_turn"]

ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}


def render_turn(messages: Sequence[Mapping[str, str]], *, first: bool) -> str:
    """The template text of one turn's new messages, ending with ``Assistant:``."""
    if not messages:
        raise InvalidInputError("a chat turn needs at least one message")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(f"message {i} is not a mapping: {message!r}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise InvalidInputError(
                f"message {i} has role {role!r}; expected one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str):
            raise InvalidInputError(f"message {i} content must be text, got {content!r}")
        lines.append(f"{ROLES[role]}: {content}\n")
    return ("" if first else "\n") + "".join(lines) + "Assistant:"


class Conversation:
    """The messages, token history and kept generator of one dialogue.

    Use one conversation for one turn at a time; ``close()`` frees its
    generator (a conversation that is garbage collected frees it too).
    """

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex  # names the dialogue to the hub (its KV cache there)
        self.messages: list[dict[str, str]] = []
        self.history: list[int] = []  # every token the model has seen, replies included
        self._generator: Any = None
        self._runtime: LanguageRuntime | None = None
        self._search: dict[str, Any] | None = None
        self._busy = threading.Lock()
        self.turns = 0
        self._opened = 0  # messages the turn in progress added
        self.reprefills = 0  # turns that had to compute the whole history again
        self.hub: str | None = None  # the hub replica that answered last: it holds the cache
        self._handing = False  # the turn in progress is being handed to the hub
        self._device_part: tuple[list[int], list[int], str] | None = None  # prompt, ids, text
        self._skip = 0  # a handed-off turn the device took back: its first ids are in the prompt

    @property
    def has_state(self) -> bool:
        """True while a generator holds the history's KV cache."""
        return self._generator is not None

    def _open_turn(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Take the conversation for a turn; the turn's template text."""
        text = render_turn(messages, first=not self.history)
        if not self._busy.acquire(blocking=False):
            raise InvalidInputError("this conversation has a turn in progress: finish it first")
        self.messages.extend({"role": m["role"], "content": m["content"]} for m in messages)
        self._opened = len(messages)
        return text

    def _begin_turn(
        self, runtime: LanguageRuntime, new_ids: list[int], search: dict[str, Any]
    ) -> tuple[Any, list[int], int]:
        """``(generator, ids to append, ids reused)`` for the turn's prefill."""
        if self._device_part is not None:  # the hub failed a handed-off turn: the device
            self._skip = len(self._device_part[1])  # resumes, its part now in new_ids
            self._device_part, self._handing = None, False
        total = len(self.history) + len(new_ids)
        if total >= runtime.context_length:
            raise InvalidInputError(
                f"the conversation is {total} tokens, the model's context is "
                f"{runtime.context_length}: start a new Conversation"
            )
        reusable = (
            self._generator is not None
            and self._runtime is runtime
            and self._search == search
            and not self._generator.is_done()
        )
        if reusable:
            # The last token a generator produced is in its sequence but not in its KV
            # cache, and ONNX Runtime GenAI 0.18's append_tokens right after
            # generate_next_token does not answer as a fresh generator fed the same tokens
            # would (the hub's kept conversations saw it): rewind to before that token and
            # feed it again with the new turn (one token of prefill, the same answer).
            keep = max(0, min(len(self.history), int(self._generator.token_count()) - 1))
            if int(self._generator.token_count()) != keep:
                self._generator.rewind_to(keep)
            return self._generator, self.history[keep:] + new_ids, keep
        self._free()
        self.reprefills += bool(self.history)
        self._generator = runtime.new_generator({**search, "max_length": runtime.context_length})
        self._runtime, self._search = runtime, dict(search)
        return self._generator, self.history + new_ids, 0

    def _hand_off(self, ids: list[int]) -> list[int]:
        """The turn in progress goes to the hub after the device's tokens (``ids``: the
        turn's prompt and them): what the hub continues, the whole dialogue."""
        self._handing = True
        return self.history + ids

    def _end_turn(self, new_prompt: list[int], output: list[int], text: str) -> None:
        """The turn ran (to its end or cancelled): its prompt and reply join the history.
        At a handoff (the device's part of the turn ended) the turn stays open, the kept
        generator too: it holds the prompt and the device's tokens."""
        if self._handing:
            self._device_part, self._handing = (list(new_prompt), list(output), text), False
            return
        output, self._skip = output[self._skip :], 0
        self.history.extend(new_prompt)
        self.history.extend(output)
        if self._runtime is not None and not self._runtime.resumable:
            self._free()  # LiteRT-LM: its session cannot rewind, and would decode on
        self.messages.append({"role": "assistant", "content": text})
        self.turns += 1
        self._opened = 0
        self._release_busy()

    def _end_cloud_turn(self, new_prompt: list[int], reply: list[int], text: str) -> None:
        """A turn the hub answered: it joins the history; the kept generator never saw it.
        A handed-off turn's reply is the device's ids, then the hub's text encoded: the
        kept generator holds the history up to the handoff, a prefix of the new one."""
        part, self._device_part, self._handing = self._device_part, None, False
        if part is None or self._runtime is None:
            self._free()
            self._end_turn(new_prompt, reply, text)
            return
        prompt, device_ids, device_text = part
        rest = text[len(device_text) :]
        self._end_turn(prompt, device_ids + (self._runtime.encode(rest) if rest else []), text)

    def _abort_turn(self, *, keep_state: bool = False) -> None:
        """The turn never ran or failed: its messages go. A failed prefill or step leaves
        the kept generator in an unknown state, so the next turn re-prefills; a turn
        refused before it ran (``keep_state``) leaves it as it was."""
        self._device_part, self._handing, self._skip = None, False, 0
        if self._opened:
            del self.messages[-self._opened :]
            self._opened = 0
        if not keep_state:
            self._free()
        self._release_busy()

    def _release_busy(self) -> None:
        if self._busy.locked():
            self._busy.release()

    def _free(self) -> None:
        generator, self._generator = self._generator, None
        if generator is not None and self._runtime is not None:
            self._runtime.release(generator)

    def close(self) -> None:
        """Free the kept generator; the next turn re-prefills the history."""
        self._free()

    def __del__(self) -> None:
        if getattr(self, "_generator", None) is not None:
            self._free()
