"""Speculative decoding across the link: the device drafts, the hub verifies.

``SpecStream`` is a ``TextStream`` (same iteration, ``close``, ``final``,
``GenerationRecord``) for ``preset="speculative"``. Each round the device
model drafts ``k`` tokens with its own generator, sends them to the hub in
a ``VerifyRequest`` (``SpecLink``), and gets back how many the hub's model
accepts plus the hub's own next token; it rewinds its generator to the
committed length, appends the hub's token, and streams the committed text
(``TextChunk``, ``source=cloud``: every token shown was checked by the hub).
Only committed tokens are ever shown. Greedy, the output is the hub's own
greedy decoding, token for token; sampled (``Sampling`` with a temperature),
each draft is drawn from the compressed row the hub tests it against
(``_spec_sampling``), the rows travel with the round, and the hub's
rejection rule makes the output follow the hub model's distribution.

Drafting ahead: while a round is in flight the device keeps drafting the
continuation that assumes every draft is accepted and that the hub's token
is the device's own next guess; if the verdict agrees, those tokens are the
next round's drafts already made (``SpecStats.ahead_used``), else they are
rewound away. ``k`` comes from the ``draft_length`` (an ``int``, or an
adaptive controller with ``.k`` and ``.observe(rtt_s, drafted, accepted,
draft_s_per_token)``), fed every round.

The session lives on one hub replica: the first round goes to any replica,
the later ones to the one that answered (``…/verify/{model}/{hub}``). A
verdict ``resend`` (the hub evicted the session, or another replica got the
round), or a PUBACK saying no replica subscribes there, sends the whole
committed context again to any replica (``SpecStats.resent``). The hub
silent past ``CloudTextSettings.first_chunk_s`` (first round) or
``stall_s`` (later ones), the connection lost, or an error verdict: the
device finishes the turn alone from the committed tokens (``degraded``,
the reason in ``fallbacks``; ``SpecStats.alone_tokens``): no token is shown
twice and none is lost.
"""

from __future__ import annotations

import dataclasses
import queue
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from shared import PublishHandle, TextSampling, VerifyFinish, VerifyRequest, VerifyResult

from .._errors import InferenceError, UplinkError
from .._result import Source
from ._cloud import CloudTextSettings, LinkFault
from ._generation import FinishReason, Sampling, TextChunk
from ._spec_sampling import draft_row, draw, pack
from ._spec_stats import SpecStats
from ._stream import TextStream

if TYPE_CHECKING:
    from ._presets import TextRoute
    from ._runtime import LanguageRuntime
    from ._spec_link import SpecInbox, SpecLink

__all__ = ["DraftControl", "SpecPlan", "SpecStats", "SpecStream"]

_now = time.perf_counter
MAX_AHEAD = 16  # tokens drafted ahead while a round is in flight


class DraftControl(Protocol):
    """What an adaptive draft length offers (``edge_agent.language.DraftLength``)."""

    @property
    def k(self) -> int: ...

    def observe(
        self, rtt_s: float, drafted: int, accepted: int, draft_s_per_token: float
    ) -> None: ...


@dataclass(frozen=True)
class SpecPlan:
    """A speculative turn's way to the hub."""

    link: SpecLink
    device_id: str
    model: str
    settings: CloudTextSettings
    draft_length: int | DraftControl = 4


class SpecStream(TextStream):
    """One speculative turn (see the module docstring)."""

    def __init__(self, runtime: LanguageRuntime, prompt_ids: list[int], *, max_tokens: int,
                 sampling: Sampling, deadline_ms: float | None, preset: str, route: TextRoute,
                 plan: SpecPlan | None) -> None:  # fmt: skip
        # The generator decodes greedily: a sampled turn draws its drafts here (``_draw``).
        super().__init__(runtime, prompt_ids, max_tokens=max_tokens, sampling=Sampling(),
                         deadline_ms=deadline_ms, preset=preset, route=route)  # fmt: skip
        self._draw = None if sampling.greedy else sampling
        self._rng = np.random.default_rng(sampling.seed)
        self._q: list[np.ndarray] = []  # a sampled turn: the row each draft was drawn from
        self._spec = plan
        self._session = uuid.uuid4().hex
        self._inbox: SpecInbox | None = None
        self._hub: str | None = None  # the replica holding the session
        self._base = 0  # committed ids the hub holds
        self._unsent: list[int] = list(prompt_ids)  # committed ids the hub lacks
        self._drafts: list[int] = []  # in the generator after the committed ids
        self._round = 0
        self._alone = plan is None  # decoding without the hub (no way to it, or it failed)
        self._chunks: deque[TextChunk] = deque()
        self._draft_s = 0.0
        self._n_drafted = 0  # tokens the device model drafted (sent or not)
        self._stats = SpecStats(0, 0, 0, 0, (), ())

    # -- the turn -------------------------------------------------------------------------

    def _step(self) -> TextChunk | None:
        while not self._chunks and self.result is None:
            if self._generator is None:
                self._prefill()
                if self._spec is not None:
                    self._inbox = self._spec.link.open(self._session)
            if self._deadline_at is not None and _now() >= self._deadline_at:
                self._finish(FinishReason.DEADLINE)
            elif self._alone:
                self._alone_step()
            else:
                self._one_round()
        return self._chunks.popleft() if self._chunks else None

    def _one_round(self) -> None:
        plan = self._spec
        assert plan is not None
        if self._closing:
            self._finish(FinishReason.CANCELLED)
            return
        left = self._max_tokens - len(self._out)
        k = max(0, min(_k(plan.draft_length), left - 1, self._room()))
        while len(self._drafts) < k and self._draft_one():
            pass
        k = min(k, len(self._drafts))
        request = self._request(plan, k, left)
        try:
            handle = plan.link.send(request, self._hub)
        except UplinkError as e:
            self._go_alone(f"the round could not be sent: {e}")
            return
        sent = _now()
        verdict = self._await(request, handle, k)
        rtt = _now() - sent
        if self._closing:
            self._finish(FinishReason.CANCELLED)
            return
        if verdict is _DEADLINE:
            self._finish(FinishReason.DEADLINE)
            return
        if verdict is _GONE:
            self._resend()
            return
        if isinstance(verdict, str):
            self._go_alone(verdict)
            return
        if verdict.finish is VerifyFinish.RESEND:
            self._resend()
            return
        if verdict.finish is VerifyFinish.ERROR:
            self._go_alone(f"the hub answered {verdict.error.value}: {verdict.error_message}")
            return
        self._apply(verdict, k, rtt)

    def _request(self, plan: SpecPlan, k: int, left: int) -> VerifyRequest:
        budget = None
        if self._deadline_at is not None:
            budget = max(self._deadline_at - _now(), 1e-3) * 1000.0
        self._round += 1
        wire, dists = TextSampling(), None
        if self._draw is not None:
            s = self._draw
            wire = TextSampling(temperature=float(s.temperature or 1.0), top_p=s.top_p,
                                top_k=s.top_k, seed=s.seed)  # fmt: skip
            dists = pack(self._q[:k]) if k else None
        return VerifyRequest(
            request_id=uuid.uuid4().hex, model=plan.model, session=self._session,
            round=self._round, base=self._base, committed=tuple(self._unsent),
            drafts=tuple(self._drafts[:k]), max_tokens=left, device_id=plan.device_id,
            timeout_ms=budget, sent_at_ms=time.time() * 1000.0, sampling=wire, draft_dists=dists,
        )  # fmt: skip

    def _await(self, request: VerifyRequest, handle: PublishHandle, k: int) -> VerifyResult | str:
        """The round's verdict, drafting ahead meanwhile; a string says why none will come."""
        plan, inbox = self._spec, self._inbox
        assert plan is not None and inbox is not None
        settings = plan.settings
        patience = settings.first_chunk_s if request.base == 0 else settings.stall_s  # prefill
        give_up = _now() + patience
        sticky = self._hub is not None
        while True:
            if handle.done and handle.no_subscribers:  # the PUBACK (MQTT 5) says at once
                return _GONE if sticky else "no hub takes speculative rounds for this model"
            try:
                if self._may_draft_ahead(k):
                    message = inbox.get_nowait()
                else:
                    wait = min(give_up, self._deadline_at or give_up) - _now()
                    if not handle.done:  # look at the PUBACK again soon
                        wait = min(wait, 0.05)
                    message = inbox.get(timeout=max(0.0, wait))
            except queue.Empty:
                if self._may_draft_ahead(k) and self._draft_one():
                    continue
                if self._deadline_at is not None and _now() >= self._deadline_at:
                    return _DEADLINE
                if _now() >= give_up:
                    return f"no verdict from the hub for {patience:g} s"
                continue
            if isinstance(message, LinkFault):
                return message.reason
            if message.round != request.round or message.request_id != request.request_id:
                continue  # a verdict of an abandoned round: never applied
            return message

    def _may_draft_ahead(self, k: int) -> bool:
        """More drafting ahead is worth it: within the budget, the room and the cap."""
        ahead = len(self._drafts) - k
        left = self._max_tokens - len(self._out) - k - 1
        return 0 <= ahead < min(MAX_AHEAD, left) and len(self._drafts) < self._room()

    def _apply(self, verdict: VerifyResult, k: int, rtt: float) -> None:
        plan = self._spec
        assert plan is not None
        a = min(verdict.accepted, k)
        new = [*self._drafts[:a], *verdict.tokens]
        expected = self._base + len(self._unsent) + len(new)
        if verdict.committed != expected:
            self._go_alone(f"the hub's session is out of step ({verdict.committed} committed, "
                           f"{expected} here)")  # fmt: skip
            return
        ahead = self._drafts[k:]
        hit = a == k and verdict.tokens and ahead and ahead[0] == verdict.tokens[0]
        if hit:
            self._drafts, self._q = ahead[1:], self._q[k + 1 :]
        elif verdict.tokens:
            # Rewind one further and feed the last kept id again with the hub's: appending
            # right after generate_next_token loses that step's id in ONNX Runtime GenAI
            # 0.18 (docs/language-models.md).
            kept = [*self._prompt_ids, *self._out, *self._drafts[:a]]
            self._rewind(len(kept) - 1)
            self._append([kept[-1], *verdict.tokens])
            self._drafts, self._q = [], []
        self._hub = verdict.hub or self._hub
        self._base, self._unsent = verdict.committed, []
        s = self._stats
        self._stats = dataclasses.replace(
            s, rounds=s.rounds + 1, drafted=s.drafted + k, accepted=s.accepted + a,
            hub_tokens=s.hub_tokens + len(verdict.tokens), rtt_ms=(*s.rtt_ms, rtt * 1000.0),
            k=(*s.k, k), ahead_used=s.ahead_used + int(bool(hit)),
        )  # fmt: skip
        control = plan.draft_length
        if not isinstance(control, int):
            per_token = self._draft_s / self._n_drafted if self._n_drafted else 0.0
            control.observe(rtt, k, a, per_token)
        self._commit(new, _SPEC)
        if self.result is None and verdict.finish is not VerifyFinish.MORE:
            stop = verdict.finish is VerifyFinish.STOP
            self._finish(FinishReason.STOP if stop else FinishReason.LENGTH)

    def _resend(self) -> None:
        """The hub lost the session: the whole committed context goes again, to any replica."""
        self._base, self._hub = 0, None
        self._unsent = [*self._prompt_ids, *self._out]
        self._stats = dataclasses.replace(self._stats, resent=self._stats.resent + 1)
        if self._stats.resent > 3:
            self._go_alone("the hub lost the session again and again")

    def _go_alone(self, reason: str) -> None:
        """The hub will not verify: finish the turn on the device from the committed ids."""
        self._alone = True
        self._degraded = True
        self._fallbacks.append(f"the hub failed the turn ({reason}): finished on the device")
        self._close_session()
        ids = [*self._prompt_ids, *self._out]
        self._rewind(len(ids) - 1)  # the last committed id again, for its logits
        self._append(ids[-1:])
        self._drafts, self._q = [], []

    def _alone_step(self) -> None:
        if not self._draft_one():
            self._finish(FinishReason.LENGTH)
            return
        token = self._drafts.pop()
        self._q = []
        self._stats = dataclasses.replace(self._stats, alone_tokens=self._stats.alone_tokens + 1)
        self._commit([token], _ALONE)

    def _commit(self, ids: list[int], source: Source) -> None:
        """Show committed ids (whole characters); end the turn at EOS or ``max_tokens``."""
        eos = self._runtime.eos_token_ids
        parts = []
        now = _now()
        for token in ids:
            self._out.append(token)
            self._pending += 1
            if token in eos:
                break
            text = self._detokenizer.decode(token)
            if text:
                parts.append(text)
        self._last_at = now
        if self._first_at is None:
            self._first_at = now
        if parts:
            text = "".join(parts)
            self._chunks.append(TextChunk(text, source, self._index, self._pending))
            self._parts.append(text)
            self._index += 1
            self._pending = 0
        if self._out and self._out[-1] in eos:
            self._finish(FinishReason.STOP)
        elif len(self._out) >= self._max_tokens:
            self._finish(FinishReason.LENGTH)

    # -- the device model -----------------------------------------------------------------

    def _room(self) -> int:
        """Tokens the generator may still hold beyond the committed ones."""
        used = len(self._prompt_ids) + len(self._out)
        turn_end = len(self._prompt_ids) + self._max_tokens  # the generator's max_length
        return max(0, min(self._runtime.context_length, turn_end) - used)

    def _draft_one(self) -> bool:
        """One more draft token (False when the generator can take no more, or the last
        draft ends the text)."""
        generator = self._generator
        eos = self._runtime.eos_token_ids
        if (self._drafts and self._drafts[-1] in eos) or generator.is_done():
            return False
        if len(self._drafts) >= self._room():
            return False
        began = _now()
        try:
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if self._draw is not None:  # draw from the row the hub will test against
                q = draft_row(generator.get_logits(), self._draw)
                self._q.append(q)
                drawn = draw(q, self._rng)
                if drawn != token:  # the greedy pick has no KV yet: drop it, feed the draw
                    generator.rewind_to(len(self._prompt_ids) + len(self._out) + len(self._drafts))
                    generator.append_tokens(np.asarray([drawn], dtype=np.int32))
                    token = drawn
        except Exception as e:
            raise InferenceError(f"{self._runtime.kind} failed while drafting: {e}") from e
        self._draft_s += _now() - began
        self._n_drafted += 1
        self._drafts.append(token)
        return True

    def _rewind(self, length: int) -> None:
        try:
            self._generator.rewind_to(length)
        except Exception as e:
            raise InferenceError(f"{self._runtime.kind} could not rewind: {e}") from e

    def _append(self, ids: list[int]) -> None:
        try:
            self._generator.append_tokens(np.asarray(ids, dtype=np.int32))
        except Exception as e:
            raise InferenceError(f"{self._runtime.kind} failed on the hub's token: {e}") from e

    # -- ending ---------------------------------------------------------------------------

    def _close_session(self) -> None:
        plan, self._inbox = self._spec, None
        if plan is not None:
            plan.link.close(self._session, plan.model, self._hub)

    def _finish(self, reason: FinishReason) -> None:
        self._close_session()
        super()._finish(reason)

    def _abandon(self) -> None:
        self._close_session()
        super()._abandon()

    def close(self) -> None:
        """Stop the turn; a step waiting for a verdict wakes at once."""
        inbox = self._inbox
        if inbox is not None and self.result is None:
            self._closing = True
            inbox.put(LinkFault("the stream was closed"))
        super().close()

    def _observe_device(self) -> None:
        """The prefill and the drafting rates (not the turn's, which include the link)."""
        self._runtime.observe(
            prefill_tokens=self._prompt_total - self._reused,
            prefill_s=self._prefilled_at - self._prefill_from,
            decode_tokens=self._n_drafted,
            decode_s=self._draft_s,
        )

    def _record(self, reason: FinishReason) -> None:
        super()._record(reason)
        assert self.result is not None
        s = self._stats
        self.result = dataclasses.replace(
            self.result, output_ids=tuple(self._out), edge_tokens=s.accepted + s.alone_tokens,
            cloud_tokens=s.hub_tokens, hub=self._hub, speculation=s,
        )  # fmt: skip


_SPEC = Source.CLOUD
_ALONE = Source.EDGE
_GONE = "the hub replica holding the session is gone (no subscriber on its topic)"
_DEADLINE = "the turn's deadline passed while the hub verified"


def _k(control: int | Any) -> int:
    return control if isinstance(control, int) else int(control.k)
