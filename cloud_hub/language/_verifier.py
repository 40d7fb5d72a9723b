"""The hub's side of speculative decoding: verify a device's drafts in one forward pass.

``Verifier`` serves one model (``VerifyModel``: its ONNX graph on plain ONNX
Runtime) on one worker thread. A round (``shared.VerifyRequest``) of session
(device, session id) runs one forward of ``[uncommitted..., d_1..d_k]``:
the committed ids whose KV the session lacks (the whole prompt in the first
round, then the hub's own token of the last round) followed by the drafts.
Rows ``m-1 .. m-1+k`` of its logits (``m`` uncommitted ids) are the hub's
distributions for each draft position and the one after them; greedy
acceptance takes the longest prefix with ``d_i == argmax`` and then the
hub's argmax after it (the "bonus": a correction, or one token more when
every draft held). Both are ``accept_drafts`` (``_accept``); a sampled round
passes the draft's distributions (``shared.decode_draft_dists`` of its
``draft_dists``), the turn's temperature and top-p, and the top-k the round
names or else the model's own (``search.top_k``, what the engine samples
with), with the session's random stream (seeded by ``sampling.seed``).
The committed ids grow by the accepted drafts and the bonus; the KV cache is
cut to the committed length minus one (the bonus has no KV yet), so a
rejected draft leaves nothing behind.

Stops: an end-of-sequence id among the committed ends the turn (``stop``,
nothing after it); ``max_tokens`` (what the device may still commit) and the
model's context end it ``length``. Errors are typed results, never a
silence: ids out of the vocabulary or a round past the context
``invalid_input`` (so is a sampled round without its draft's distributions,
and ones that do not decode are ``bad_request``), a session it does not
hold ``resend``, an expired round ``deadline_exceeded``, a failed forward
``internal``.

Rounds waiting at once are taken together (``verify_batches`` counts the
takes). Those that start a session (no KV yet: a first round, or one sent
again whole) and have the same number of ids run in one batched forward
(``verify_batched_rounds``), exactly; every other round runs a forward of
its own, since this graph's attention kernel takes no batch with a past
(``_verify_model``). ``stats`` counts ``verify_forwards``, ``verify_rounds``
and ``tokens_committed``, so forward passes per generated token is
``verify_forwards / tokens_committed``.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import (
    ErrorCode,
    ProtocolError,
    SparseDists,
    VerifyClose,
    VerifyFinish,
    VerifyRequest,
    VerifyResult,
    decode_draft_dists,
)

from .._errors import HubError, HubStoppingError, InvalidRequestError, error_code
from ._accept import accept_drafts, target_probs
from ._verify_model import KV, VerifyModel
from ._verify_sessions import SessionLimits, VerifySession, VerifySessions

__all__ = ["Reply", "Verifier"]

log = logging.getLogger(__name__)

Reply = Callable[[VerifyResult], None]


@dataclass
class _Ready:
    """A round ready for its forward: the session, the ids to run, how many of them were
    committed before the drafts (``m``), the drafts."""

    key: tuple[str, str]
    session: VerifySession
    ids: list[int]
    m: int
    drafts: list[int]


@dataclass
class _Job:
    device: str
    message: VerifyRequest | VerifyClose
    reply: Reply | None
    deadline: float | None


class Verifier:
    """One model's verification rounds, on one worker thread (see the module docstring)."""

    def __init__(
        self,
        model: VerifyModel,
        *,
        limits: SessionLimits | None = None,
        hub_id: str | None = None,
    ) -> None:
        self.model = model
        self.hub_id = hub_id
        self.sessions = VerifySessions(limits or SessionLimits())
        self._cond = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._closing = False
        self.counters = collections.Counter[str]()
        self._thread = threading.Thread(target=self._run, name="spec-verifier", daemon=True)
        self._thread.start()

    # -- any thread -----------------------------------------------------------------------

    def submit(self, device: str, request: VerifyRequest, reply: Reply,
               deadline: float | None = None) -> None:  # fmt: skip
        """Queue a round; ``reply`` gets its result on the worker thread."""
        self._put(_Job(device, request, reply, deadline))

    def close_session(self, device: str, close: VerifyClose) -> None:
        self._put(_Job(device, close, None, None))

    def _put(self, job: _Job) -> None:
        with self._cond:
            if self._closing:
                raise HubStoppingError("the hub is stopping; finish the turn on the device")
            self._jobs.append(job)
            self._cond.notify()

    def stats(self) -> dict[str, int]:
        """``verify_rounds``, ``verify_forwards``, ``verify_batches``, ``tokens_committed``,
        ``drafts_received``, ``drafts_accepted``, ``resend``, ``errors``, ``sessions``,
        ``sessions_evicted``, ``kv_bytes``."""
        with self._cond:
            return {
                **self.counters,
                "verify_forwards": self.model.forwards,
                "sessions": len(self.sessions),
                "sessions_evicted": self.sessions.evicted,
                "kv_bytes": self.sessions.nbytes,
            }

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # -- the worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                jobs = list(self._jobs)
                self._jobs.clear()
                if self._closing:
                    break
                self.counters["verify_batches"] += 1
            self._take(jobs)
        for job in jobs:  # rounds still queued: their devices go on alone at once
            if job.reply is not None and isinstance(job.message, VerifyRequest):
                why = "the hub is stopping; finish the turn on the device"
                job.reply(self._error(job.message, ErrorCode.OVERLOADED, why))

    def _take(self, jobs: list[_Job]) -> None:
        """Prepare every round taken; run the fresh ones of one length in one forward."""
        ready: list[tuple[_Job, _Ready]] = []
        for job in jobs:
            message = job.message
            if isinstance(message, VerifyClose):
                with self._cond:
                    self.sessions.pop((job.device, message.session))
                continue
            out = self._guard(job, functools.partial(self._prepare, job))
            if isinstance(out, VerifyResult):
                self._reply(job, out)
            else:
                ready.append((job, out))
        keys = [r.key for _, r in ready]
        by_length: dict[int, list[tuple[_Job, _Ready]]] = {}
        for job, r in ready:
            if r.session.kv_len == 0 and keys.count(r.key) == 1:  # a fresh session, once
                by_length.setdefault(len(r.ids), []).append((job, r))
            else:
                self._forward_one(job, r, None)
        for group in by_length.values():
            outputs: list[tuple[np.ndarray, KV]] | None = None
            if len(group) > 1:  # exact: no past, no padding (``VerifyModel.forward_batch``)
                try:
                    outputs = self.model.forward_batch([r.ids for _, r in group])
                    with self._cond:
                        self.counters["verify_batched_rounds"] += len(group)
                except Exception:
                    log.exception("a batched verify forward failed; running its rounds alone")
            for n, (job, r) in enumerate(group):
                self._forward_one(job, r, None if outputs is None else outputs[n])

    def _forward_one(self, job: _Job, ready: _Ready, done: tuple[np.ndarray, KV] | None) -> None:
        """Complete a round from its batch's output, or from a forward of its own."""

        def step() -> VerifyResult:
            out = done if done is not None else self.model.forward(ready.ids, ready.session.kv)
            return self._complete(job, ready, out)

        self._reply(job, self._guard(job, step))

    def _guard(self, job: _Job, step: Callable[[], Any]) -> Any:
        """``step()``, or the typed error result its failure is (the session dropped: it may
        be half updated, and its device goes on alone)."""
        message = job.message
        assert isinstance(message, VerifyRequest)
        try:
            return step()
        except (HubError, ProtocolError) as e:  # the round's own fault: typed
            error = self._error(message, error_code(e), str(e))
        except Exception as e:  # the model raised: this round fails, the hub keeps serving
            log.exception("verify round %s of %s failed", message.request_id, job.device)
            error = self._error(message, ErrorCode.INTERNAL, f"the forward pass failed: {e}")
        with self._cond:
            self.sessions.pop((job.device, message.session))
        return error

    def _reply(self, job: _Job, result: VerifyResult) -> None:
        with self._cond:
            self.counters["errors" if result.finish is VerifyFinish.ERROR else "verify_rounds"] += 1
        assert job.reply is not None
        job.reply(result)

    def _prepare(self, job: _Job) -> VerifyResult | _Ready:
        """The round's session (made, found or refused) and the ids of its forward."""
        request, device = job.message, job.device
        assert isinstance(request, VerifyRequest)
        if job.deadline is not None and time.monotonic() > job.deadline:
            return self._error(request, ErrorCode.DEADLINE_EXCEEDED,
                               "the round waited past its budget; not run")  # fmt: skip
        key = (device, request.session)
        model = self.model
        bad = [t for t in (*request.committed, *request.drafts) if t >= model.vocab_size]
        if bad:
            return self._error(request, ErrorCode.INVALID_INPUT,
                               f"token id {bad[0]} is out of the model's vocabulary "
                               f"(0..{model.vocab_size - 1})")  # fmt: skip
        with self._cond:
            session = self.sessions.get(key)
            if request.base == 0:
                seed = request.sampling.seed
                session = VerifySession(list(request.committed), model.empty(),
                                        np.random.default_rng(seed))  # fmt: skip
                self.sessions.put(key, session)
            elif session is None or len(session.tokens) != request.base:
                self.counters["resend"] += 1
                why = "no such session here" if session is None else "out of step"
                return self._result(request, VerifyFinish.RESEND, 0, (), 0, why)
            else:
                session.tokens.extend(request.committed)
            self.sessions.trim(keep=key)
        if len(session.tokens) >= model.context:
            return self._result(request, VerifyFinish.LENGTH, 0, (), len(session.tokens))
        drafts = list(request.drafts[: model.context - len(session.tokens)])
        tail = session.tokens[session.kv_len :]
        return _Ready(key, session, tail + drafts, len(tail), drafts)

    def _complete(self, job: _Job, ready: _Ready, forward: tuple[np.ndarray, KV]) -> VerifyResult:
        """Accept, commit, cut the KV cache back: the round's verdict."""
        request = job.message
        assert isinstance(request, VerifyRequest)
        logits, present = forward
        session, m, drafts, model = ready.session, ready.m, ready.drafts, self.model
        accepted, bonus = self._decide(request, logits[m - 1 : m + len(drafts)], drafts,
                                       session.rng)  # fmt: skip
        new = [*drafts[:accepted], bonus]
        finish = VerifyFinish.MORE
        for i, t in enumerate(new):
            if t in model.eos:
                new, finish = new[: i + 1], VerifyFinish.STOP
                break
        if len(new) >= request.max_tokens:
            if len(new) > request.max_tokens or finish is VerifyFinish.MORE:
                finish = VerifyFinish.LENGTH
            new = new[: request.max_tokens]
        keep = session.kv_len + m + min(accepted, len(new))
        session.tokens.extend(new)
        session.kv = [np.ascontiguousarray(x[:, :, :keep]) for x in present]
        if finish is VerifyFinish.MORE and len(session.tokens) >= model.context:
            finish = VerifyFinish.LENGTH
        n_drafts = min(accepted, len(new))
        with self._cond:
            self.counters["tokens_committed"] += len(new)
            self.counters["drafts_received"] += len(request.drafts)
            self.counters["drafts_accepted"] += n_drafts
            self.sessions.trim(keep=ready.key)
        hub_tokens = tuple(new[n_drafts:])
        return self._result(request, finish, n_drafts, hub_tokens, len(session.tokens))

    def _decide(
        self, request: VerifyRequest, rows: np.ndarray, drafts: list[int], rng: Any
    ) -> tuple[int, int]:
        """Accepted drafts and the hub's token, by ``accept_drafts`` (greedy, or sampled with
        the draft's distributions and the model's own top-k unless the round names one)."""
        sampling = request.sampling
        if sampling.greedy:
            done = accept_drafts(rows, drafts, None, sampling, rng)
            return done.accepted, done.next_token
        top_k = sampling.top_k or self.model.top_k
        if not drafts:  # nothing to test: the hub samples its token
            p = target_probs(rows[0], temperature=float(sampling.temperature or 1.0),
                             top_p=sampling.top_p or 1.0, top_k=top_k)  # fmt: skip
            return 0, int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
        if request.draft_dists is None:
            raise InvalidRequestError("a sampled round needs the draft's distributions")
        vocab = self.model.vocab_size
        dists = decode_draft_dists(request.draft_dists, k=len(request.drafts), vocab=vocab)
        if len(drafts) < dists.k:  # drafts cut at the context
            n = len(drafts)
            dists = SparseDists(ids=dists.ids[:n], probs=dists.probs[:n], rest=dists.rest[:n],
                                vocab=vocab)  # fmt: skip
        done = accept_drafts(rows, drafts, dists, sampling, rng, top_k=top_k)
        return done.accepted, done.next_token

    def _result(
        self, request: VerifyRequest, finish: VerifyFinish, accepted: int,
        tokens: tuple[int, ...], committed: int, message: str = "",
    ) -> VerifyResult:  # fmt: skip
        return VerifyResult(
            request_id=request.request_id, session=request.session, round=request.round,
            finish=finish, accepted=accepted, tokens=tokens, committed=committed,
            error_message=message, hub=self.hub_id,
        )  # fmt: skip

    def _error(self, request: VerifyRequest, code: ErrorCode, message: str) -> VerifyResult:
        return VerifyResult(
            request_id=request.request_id, session=request.session, round=request.round,
            finish=VerifyFinish.ERROR, error=code, error_message=message, hub=self.hub_id,
        )  # fmt: skip
