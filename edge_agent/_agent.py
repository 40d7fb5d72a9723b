"""The edge agent: answers every request locally, in the cloud, or by falling back.

``EdgeAgent`` (blocking) and ``AsyncEdgeAgent`` (asyncio) are twins over
``BaseAgent`` (``_agent_core``), which makes every decision; they only run
the local model and wait for the hub, each in its own way, as httpx's
Client/AsyncClient do. The invariants are ``BaseAgent``'s.

The local path (``infer`` -> ``_run_local`` -> ``_edge_result``) is the hot
path: its Python work is what the agent adds to a runtime call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import numpy as np

from ._agent_core import AgentStats, BaseAgent, Call
from ._errors import UplinkError
from ._outcome import CloudAnswer, CloudOutcome, Fallback
from ._policy import Decision, Route
from ._result import InferenceResult
from ._telemetry import ServingStats
from ._tracing import CallTrace, step_of
from .language import (
    AsyncTextStream,
    Conversation,
    DraftControl,
    HandoffPolicy,
    Sampling,
    TextStream,
)
from .language._turn import start_chat, start_generate

__all__ = ["AgentStats", "AsyncEdgeAgent", "BaseAgent", "EdgeAgent"]

_LOCAL = Route.LOCAL
_now = time.perf_counter


class EdgeAgent(BaseAgent):
    """The blocking agent. Thread-safe: call ``infer`` from any number of threads."""

    def start(self, *, wait_s: float | None = 5.0) -> EdgeAgent:
        """Connect the uplink (if any); waits up to ``wait_s`` for the first connection attempt.

        Returns as soon as the broker answers or the attempt fails; without a
        broker it logs one line saying what the agent does meanwhile, and keeps
        retrying in the background.
        """
        if self.uplink is not None:
            self.uplink.start(wait_s=wait_s)
            self._uplink_started()
        return self

    def close(self) -> None:
        if self._cloud_text is not None:
            self._cloud_text.detach()
        if self.uplink is not None:
            self.uplink.stop()
        if self.runtime is not None:
            self.runtime.close()
        if self.language is not None:
            self.language.close()
        _close_tracer(self)

    def __enter__(self) -> EdgeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def infer(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, *, deadline_ms: float | None = None
    ) -> InferenceResult:
        """Answer one request within ``deadline_ms`` (default ``default_deadline_ms``)."""
        if self._tracer is not None:
            return self._traced_infer(inputs, deadline_ms)
        serving = self._serving
        try:
            call = self._begin(serving, inputs, deadline_ms)
            decision = self._route_before(call)
            if decision.route is _LOCAL:
                self._run_local(call)
                if self.policy.always is None:  # an always-* policy decided before the run
                    decision = self._route_after(call)
                if decision.route is _LOCAL:
                    return self._edge_result(call, decision.reason)
            return self._offload(call, decision)
        except Exception:
            self._failed(serving)
            raise

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        sampling: Sampling | None = None,
        deadline_ms: float | None = None,
        preset: str = "edge_only",
        handoff: HandoffPolicy | None = None,
        draft_length: int | DraftControl | None = None,
    ) -> TextStream:
        """Generate text after ``prompt``: an iterator of ``TextChunk``, then ``.result``.

        Greedy unless ``sampling`` says otherwise; ``deadline_ms`` bounds the turn
        (finish reason ``deadline``); closing the stream cancels it. Presets:
        ``edge_only``; ``prefer_edge`` (a heavy turn goes to the hub); ``prefer_cloud``;
        ``cloud_only``. The hub needs ``broker=`` and ``cloud_language_model=``: without
        them ``prefer_edge`` stays here (the record's ``fallbacks`` say so) and the
        other two raise ``TextOffloadUnavailableError``. A hub that fails mid-turn:
        the device finishes it (``record.degraded``), or a ``cloud_only`` turn ends
        with finish reason ``error`` (``record.error``). ``handoff``: the preset
        ``handoff`` starts on the device and hands the turn to the hub mid-turn when
        ``handoff`` (a ``HandoffPolicy``, kept across turns for its budget) says the
        device is unsure; with another preset it only scores the turn
        (``record.handoff_score``, what ``HandoffPolicy.calibrate`` takes).
        ``speculative``: the device drafts ``draft_length`` tokens a round (an int, or
        an adaptive ``DraftLength``), the hub verifies them; the text is the hub's
        greedy decoding (``record.speculation`` counts rounds, drafts, acceptance).
        """
        return start_generate(
            self.language, prompt, max_tokens=max_tokens, sampling=sampling,
            deadline_ms=deadline_ms, preset=preset, cloud=self._cloud_text, handoff=handoff,
            draft_length=draft_length,
        )  # fmt: skip

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        conversation: Conversation | None = None,
        max_tokens: int,
        sampling: Sampling | None = None,
        deadline_ms: float | None = None,
        preset: str = "edge_only",
        handoff: HandoffPolicy | None = None,
    ) -> TextStream:
        """One chat turn: ``messages`` are the turn's new messages (``role``/``content``).

        ``conversation`` keeps the dialogue and its KV cache between turns (a new
        one when ``None``; it is ``stream.conversation``). The reply joins the
        conversation when the stream ends. ``handoff`` as for ``generate``: a turn
        handed to the hub continues there from the whole history plus the device's
        tokens, and its reply (both parts) joins the conversation; the device's
        kept KV cache, which holds the device's part, serves the next turn.
        """
        return start_chat(
            self.language, messages, conversation, max_tokens=max_tokens, sampling=sampling,
            deadline_ms=deadline_ms, preset=preset, cloud=self._cloud_text, handoff=handoff,
        )  # fmt: skip

    def _traced_infer(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, deadline_ms: float | None
    ) -> InferenceResult:
        """``infer`` with its spans (``_tracing``): the same steps, each in a span."""
        trace, serving, call = _traced_begin(self, inputs, deadline_ms)
        try:
            with trace.step("tandem.decision") as step:
                decision = self._route_before(call)
                step.decided(decision)
            if decision.route is _LOCAL:
                with trace.step("tandem.local_run"):
                    self._run_local(call)
                if self.policy.always is None:
                    with trace.step("tandem.decision") as step:
                        decision = self._route_after(call)
                        step.decided(decision)
            if decision.route is _LOCAL:
                result = self._edge_result(call, decision.reason)
            else:
                result = self._offload(call, decision)
        except Exception as e:
            trace.failed(e)
            self._failed(serving)
            raise
        trace.finish(result, route=decision.route, decision=decision.reason)
        return result

    def _offload(self, call: Call, decision: Decision) -> InferenceResult:
        outcome = self._try_cloud(call, decision)
        if isinstance(outcome, CloudAnswer):
            return outcome.result
        if call.local_outputs is None:
            if call.runtime is None:
                raise self._no_answer(outcome)
            with step_of(call.trace, "tandem.local_run"):
                self._run_local(call)
        return self._fallback_result(call, outcome.reason)

    def _try_cloud(self, call: Call, decision: Decision) -> CloudOutcome:
        wait_ms = self._cloud_wait_ms(call)
        if isinstance(wait_ms, Fallback):
            return wait_ms
        try:
            future = self._send(call, wait_ms)
            with step_of(call.trace, "tandem.wait"):
                reply = future.result(timeout=self._wait_left_s(call))
        except (TimeoutError, UplinkError) as e:
            return self._cloud_failed(call, e)
        return self._cloud_answered(call, reply, decision.reason)

    def _run_local(self, call: Call) -> None:
        runtime = call.runtime
        assert runtime is not None
        inflight = self._local_inflight
        inflight.enter()
        t0 = _now()
        try:
            outputs = runtime.run_validated(call.inputs)  # _begin validated them
        finally:
            inflight.leave()
        local_ms = (_now() - t0) * 1000.0
        call.local_outputs = outputs
        call.local_ms = local_ms
        self.local_estimator.observe(local_ms)


class AsyncEdgeAgent(BaseAgent):
    """The asyncio twin of ``EdgeAgent``: the local model runs in a worker thread."""

    async def start(self, *, wait_s: float | None = 5.0) -> AsyncEdgeAgent:
        if self.uplink is not None:
            await asyncio.to_thread(self.uplink.start, wait_s=wait_s)
            self._uplink_started()
        return self

    async def close(self) -> None:
        if self._cloud_text is not None:
            self._cloud_text.detach()
        if self.uplink is not None:
            await asyncio.to_thread(self.uplink.stop)
        if self.runtime is not None:
            self.runtime.close()
        if self.language is not None:
            self.language.close()
        await asyncio.to_thread(_close_tracer, self)

    async def __aenter__(self) -> AsyncEdgeAgent:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def infer(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, *, deadline_ms: float | None = None
    ) -> InferenceResult:
        if self._tracer is not None:
            return await self._traced_infer(inputs, deadline_ms)
        serving = self._serving
        try:
            call = self._begin(serving, inputs, deadline_ms)
            decision = self._route_before(call)
            if decision.route is _LOCAL:
                await self._run_local(call)
                if self.policy.always is None:  # an always-* policy decided before the run
                    decision = self._route_after(call)
                if decision.route is _LOCAL:
                    return self._edge_result(call, decision.reason)
            return await self._offload(call, decision)
        except Exception:  # not CancelledError: a caller giving up is not the model's error
            self._failed(serving)
            raise

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        sampling: Sampling | None = None,
        deadline_ms: float | None = None,
        preset: str = "edge_only",
        handoff: HandoffPolicy | None = None,
        draft_length: int | DraftControl | None = None,
    ) -> AsyncTextStream:
        """``EdgeAgent.generate`` as an async iterator (each step in a worker thread)."""
        return AsyncTextStream(
            start_generate(
                self.language, prompt, max_tokens=max_tokens, sampling=sampling,
                deadline_ms=deadline_ms, preset=preset, cloud=self._cloud_text, handoff=handoff,
                draft_length=draft_length,
            )
        )  # fmt: skip

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        conversation: Conversation | None = None,
        max_tokens: int,
        sampling: Sampling | None = None,
        deadline_ms: float | None = None,
        preset: str = "edge_only",
        handoff: HandoffPolicy | None = None,
    ) -> AsyncTextStream:
        """``EdgeAgent.chat`` as an async iterator."""
        return AsyncTextStream(
            start_chat(
                self.language, messages, conversation, max_tokens=max_tokens,
                sampling=sampling, deadline_ms=deadline_ms, preset=preset, cloud=self._cloud_text,
                handoff=handoff,
            )
        )  # fmt: skip

    async def _traced_infer(
        self, inputs: Mapping[str, np.ndarray] | np.ndarray, deadline_ms: float | None
    ) -> InferenceResult:
        """``infer`` with its spans, as ``EdgeAgent._traced_infer``."""
        trace, serving, call = _traced_begin(self, inputs, deadline_ms)
        try:
            with trace.step("tandem.decision") as step:
                decision = self._route_before(call)
                step.decided(decision)
            if decision.route is _LOCAL:
                with trace.step("tandem.local_run"):
                    await self._run_local(call)
                if self.policy.always is None:
                    with trace.step("tandem.decision") as step:
                        decision = self._route_after(call)
                        step.decided(decision)
            if decision.route is _LOCAL:
                result = self._edge_result(call, decision.reason)
            else:
                result = await self._offload(call, decision)
        except BaseException as e:  # a cancelled call's span ends too
            trace.failed(e)
            if isinstance(e, Exception):  # not CancelledError: see ``infer``
                self._failed(serving)
            raise
        trace.finish(result, route=decision.route, decision=decision.reason)
        return result

    async def _offload(self, call: Call, decision: Decision) -> InferenceResult:
        outcome = await self._try_cloud(call, decision)
        if isinstance(outcome, CloudAnswer):
            return outcome.result
        if call.local_outputs is None:
            if call.runtime is None:
                raise self._no_answer(outcome)
            with step_of(call.trace, "tandem.local_run"):
                await self._run_local(call)
        return self._fallback_result(call, outcome.reason)

    async def _try_cloud(self, call: Call, decision: Decision) -> CloudOutcome:
        wait_ms = self._cloud_wait_ms(call)
        if isinstance(wait_ms, Fallback):
            return wait_ms
        try:
            future = self._send(call, wait_ms)
            with step_of(call.trace, "tandem.wait"):
                reply = await asyncio.wait_for(asyncio.wrap_future(future), self._wait_left_s(call))
        except (TimeoutError, UplinkError) as e:
            return self._cloud_failed(call, e)
        return self._cloud_answered(call, reply, decision.reason)

    async def _run_local(self, call: Call) -> None:
        runtime = call.runtime
        assert runtime is not None
        inflight = self._local_inflight
        inflight.enter()
        t0 = _now()
        try:
            outputs = await asyncio.to_thread(runtime.run_validated, call.inputs)
        finally:
            inflight.leave()
        self._local_done(call, outputs, (_now() - t0) * 1000.0)


def _traced_begin(
    agent: BaseAgent, inputs: Mapping[str, np.ndarray] | np.ndarray, deadline_ms: float | None
) -> tuple[CallTrace, ServingStats, Call]:
    """``_begin`` of a traced call: the root span opened first, so it covers the checks."""
    assert agent._tracer is not None
    trace = agent._tracer.begin()
    serving = agent._serving
    try:
        call = agent._begin(serving, inputs, deadline_ms)
    except Exception as e:
        trace.failed(e)
        agent._failed(serving)
        raise
    call.trace = trace
    trace.named(call.request_id)
    return trace, serving, call


def _close_tracer(agent: BaseAgent) -> None:
    """Flush the spans not exported yet (``close``); later calls are not traced."""
    tracer, agent._tracer = agent._tracer, None
    if tracer is not None:
        tracer.shutdown()
