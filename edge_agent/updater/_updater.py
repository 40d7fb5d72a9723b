"""The device-side model updater: assignment in, verified model swapped in, status out.

``ModelUpdater`` listens for this device's signed assignment (retained on
MQTT, so it arrives on every connect) and polls the CDN for it while MQTT is
down or not configured. MQTT is the device's one connection (a
``DeviceLink``, client id = device id): the agent's, when the agent has a
broker on the same host and port as ``mqtt`` (``agent.link``), or ``link``
when given; an updater whose agent has none opens its own. One worker thread
runs one update at a time::

    downloading  fetch the manifest, check it (``_trust``), fetch the blob, or
                 the delta from the running version when that is smaller, or
                 reuse the copy the store still holds (a rollback) (``_sources``)
    verifying    SHA-256 of the bytes, decompress / apply the delta (bounded
                 by raw_size), load the model and run its smoke test (``_smoke``)
    installing   write the version whole into the store (``_store``)
    swapping     ``agent.swap_model``: the next request runs the new model
                 (``agent.swap_language`` for a package: the next turn)
    committing   flip ``current.json``, then report installed / rolled-back

A package (``format: "onnx-genai"``, a language model folder) takes the same
steps, except that it can only load from disk: "verifying" checks the
archive's digests, "installing" unpacks it (``shared.unpack_package``: only
the listed files, each of its signed size and SHA-256, no links or paths out
of the folder) into the version's directory, which is not yet current, and
loads it there for its smoke generation; a package that fails is removed.
The agent's ``language`` runtime is what it swaps and what ``running_version``
reads when the agent's tensor model is not this updater's model.

Trust: ``trusted_keys`` is a ``shared.TrustedRoot`` (assignments checked
against its assigner role, manifests against its publisher role, with their
thresholds) or, as devices were first provisioned, a list of pinned
publisher keys (a root of version 0). Before each assignment the root is
brought up to date from the CDN (``_roots``: ``/v1/roots/<n>.root.json``,
each accepted only when the previous root's keys signed it), and roots
accepted earlier are re-checked from the store at start.

Invariants: the agent keeps serving its model throughout and after any
failure (a failure after the swap swaps the old runtime back); every failure
is reported as ``failed`` with a one-line reason; ``current.json`` moves only
after the new version is complete on disk, so a crash at any step restarts
on a verified model (``bootstrap``). An assignment refused as untrusted is
not retried (a new one must come); other failures are retried, with
exponential backoff from ``poll_interval_s``.

``step_hook(name)`` runs at the start of each step; tests use it to stop the
process there. ``fetcher``, instead of ``cdn_url``, is how the updater reaches
the CDN: any ``CdnFetcher`` (``_fetcher``; the default is ``CdnClient`` on
urllib, with ``read_token`` and ``download`` settings).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared import (
    MAX_DOCUMENT_BYTES,
    Assignment,
    InboundMessage,
    ModelManifest,
    MqttSettings,
    Topics,
    UpdateState,
    UpdateStatus,
    claimed_version,
    format_time,
    validate_name,
)

from .._agent_core import BaseAgent
from .._device_link import DeviceLink
from .._errors import DownloadError, UntrustedUpdateError, UpdateError
from ..language import LanguageRuntime
from ..runtimes import ModelRuntime
from ._fetcher import CdnFetcher, DownloadSettings
from ._roots import RootKeeper
from ._smoke import load_checked_language, load_checked_runtime
from ._sources import ModelSources
from ._stats import UpdaterStats
from ._store import CurrentPointer, DeviceModelStore
from ._trust import Trust, UpdateTrust
from ._urllib_fetcher import CdnClient

__all__ = ["STEPS", "ModelUpdater"]

log = logging.getLogger("tandem.edge.updater")

STEPS = ("downloading", "verifying", "installing", "swapping", "committing")
_MAX_REMEMBERED = 64  # assignment documents whose outcome is remembered
_MAX_BACKOFF_S = 3600.0
_MAX_REPORTS = 64


class ModelUpdater:
    """Keeps ``agent`` on the model version its signed assignment names."""

    def __init__(
        self,
        agent: BaseAgent,
        *,
        model: str,
        device_id: str,
        cdn_url: str | None = None,
        trusted_keys: Trust,
        store_dir: str | Path,
        mqtt: MqttSettings | None = None,
        topics: Topics | None = None,
        poll_interval_s: float = 60.0,
        read_token: str | None = None,
        step_hook: Callable[[str], None] | None = None,
        download: DownloadSettings | None = None,
        link: DeviceLink | None = None,
        fetcher: CdnFetcher | None = None,
    ) -> None:
        if (cdn_url is None) == (fetcher is None):
            raise ValueError("give cdn_url (the default urllib fetcher) or fetcher, not both")
        if fetcher is not None and (read_token is not None or download is not None):
            raise ValueError(
                "read_token and download configure the default fetcher; give them to yours"
            )
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self.agent = agent
        self.model = validate_name(model, "model name")
        self.device_id = validate_name(device_id, "device id")
        self.topics = topics or Topics()
        self.link = link if link is not None else _device_link(agent, self.device_id, mqtt)
        self.mqtt = self.link.settings if self.link is not None else None
        self.poll_interval_s = poll_interval_s
        self.stats = UpdaterStats()
        self._cdn = fetcher or CdnClient(str(cdn_url), read_token=read_token, settings=download)
        self._roots = RootKeeper(trusted_keys, store_dir, self._cdn)
        self._keys = self._roots.root  # one object: a rotation is seen by every check
        self._store = DeviceModelStore(store_dir)
        self._stopping = threading.Event()  # also cancels a download in progress
        self._fetcher = ModelSources(
            self._cdn,
            self._store,
            model=self.model,
            trusted_keys=self._keys,
            stats=self.stats,
            cancel=self._stopping,
        )
        pointer = self._store.pointer(self.model)
        self._trust = UpdateTrust(
            self._keys,
            device_id=self.device_id,
            model=self.model,
            record=pointer.trust if pointer is not None else None,
        )
        self._step_hook = step_hook
        self._lock = threading.Lock()  # one update at a time
        self._wake = threading.Event()
        self._pending: bytes | None = None  # the newest assignment from MQTT, not yet taken
        self._pending_lock = threading.Lock()
        self._settled: dict[str, None] = {}  # ordered set of documents with a final outcome
        self._backoff: dict[str, tuple[int, float]] = {}  # document -> (failures, retry at)
        self._reports: list[UpdateStatus] = []
        self._thread: threading.Thread | None = None
        self._listening = False
        self._said_why = False  # why MQTT is down was logged (once per outage)

    # -- public surface ----------------------------------------------------------------------

    @staticmethod
    def bootstrap(store_dir: str | Path, trusted_keys: Trust, model: str) -> ModelRuntime | None:
        """The runtime to start the agent with: the committed version, else the previous
        (their manifests checked against the root as the store last advanced it)."""
        root = RootKeeper(trusted_keys, store_dir).root
        loaded = DeviceModelStore(store_dir).load_current(model, root)
        if loaded is None or not isinstance(loaded.runtime, ModelRuntime):
            return None
        return loaded.runtime

    @staticmethod
    def bootstrap_language(
        store_dir: str | Path, trusted_keys: Trust, model: str
    ) -> LanguageRuntime | None:
        """``bootstrap`` for a package: the language runtime to give the agent as
        ``language_model`` (the committed version, else the previous, else None)."""
        root = RootKeeper(trusted_keys, store_dir).root
        loaded = DeviceModelStore(store_dir).load_current(model, root)
        if loaded is None or not isinstance(loaded.runtime, LanguageRuntime):
            return None
        return loaded.runtime

    @property
    def status(self) -> UpdateStatus | None:
        """The last report (``None`` before the first)."""
        return self._reports[-1] if self._reports else None

    @property
    def reports(self) -> list[UpdateStatus]:
        """The most recent reports, oldest first."""
        return list(self._reports)

    @property
    def running_version(self) -> int | None:
        """The version the agent serves, if it is a version of this updater's model (its
        tensor model, else its language model)."""
        for runtime in (self.agent.runtime, self.agent.language):
            if runtime is not None and runtime.name == self.model and runtime.version.isdigit():
                return int(runtime.version) or None
        return None

    def start(self) -> ModelUpdater:
        """Listen for assignments (MQTT and/or polling) in the background."""
        if self._thread is not None:
            return self
        self._store.cleanup(self.model)  # half-written leftovers of a crash, if any
        self._stopping.clear()
        self._listen_on_link()
        self._thread = threading.Thread(
            target=self._run, name=f"tandem-updater-{self.model}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop listening; cancels a download in progress and waits for the worker."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        self._leave_link()

    def __enter__(self) -> ModelUpdater:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_now(self) -> UpdateStatus | None:
        """Fetch this device's assignment from the CDN and act on it, in this thread.

        Returns the last report. Raises ``DownloadError`` only when the
        assignment itself cannot be fetched; update failures are reported.
        """
        raw = self._cdn.fetch_document(self._cdn.assignment_url(self.device_id, self.model))
        if raw is not None:
            self._process(raw, force=True)
        return self.status

    # -- the worker --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception:  # a bug must not end updates for good: log, pause, go on
                log.exception("updater: worker error; continuing")
                self._stopping.wait(self.poll_interval_s)

    def _listen(self) -> None:
        grace = self.mqtt.connect_timeout_s if self.mqtt is not None else 0.0
        next_poll = time.monotonic() + grace  # let the retained assignment arrive first
        latest: bytes | None = None  # the last assignment MQTT delivered, retried on failure
        while not self._stopping.is_set():
            with self._pending_lock:
                raw, self._pending = self._pending, None
            if raw is not None:
                latest = raw
                self._process(raw, force=False)
                continue
            now = time.monotonic()
            connected = self._mqtt_up
            if not connected and now >= next_poll:
                next_poll = now + self.poll_interval_s
                self._poll()
                continue
            retry = self._backoff.get(_key(latest)) if connected and latest is not None else None
            if retry is not None and now >= retry[1]:
                assert latest is not None
                self._process(latest, force=False)
                continue
            wake_at = min(
                next_poll if not connected else now + self.poll_interval_s,
                retry[1] if retry is not None else now + self.poll_interval_s,
            )
            self._wake.wait(max(0.01, wake_at - now))
            self._wake.clear()

    def _poll(self) -> None:
        self.stats.polls += 1
        link = self.link
        failure = link.connect_failure if link is not None and not self._said_why else None
        if link is not None and failure is not None:  # read once: the network thread clears it
            self._said_why = True  # once per outage
            why = failure.explain(link.settings.url)
            log.warning("updater: %s; polling the CDN for assignments", why)
        try:
            raw = self._cdn.fetch_document(self._cdn.assignment_url(self.device_id, self.model))
        except DownloadError as e:
            log.warning("updater: polling the CDN for an assignment failed: %s", e)
            return
        if raw is not None:
            self._process(raw, force=False)

    def _process(self, raw: bytes, *, force: bool) -> None:
        key = _key(raw)
        with self._lock:
            if not force:
                entry = self._backoff.get(key)
                if key in self._settled or (entry is not None and time.monotonic() < entry[1]):
                    return
            self.stats.assignments += 1
            self._roots.refresh()  # a rotated root applies to this very assignment
            try:
                assignment = self._trust.accept_assignment(raw)
            except UntrustedUpdateError as e:
                self._remember(self._settled, key, None)
                version = claimed_version(raw) or self.running_version
                self._fail(version, str(e), None)
                return
            if assignment.version == self.running_version:
                self._remember(self._settled, key, None)
                return
            try:
                self._update(assignment)
            except Exception as e:
                if not isinstance(e, UpdateError):
                    log.exception("updater: unexpected error updating to %s", assignment.version)
                    reason = f"internal error: {type(e).__name__}: {e}"
                else:
                    reason = str(e)
                failures = self._backoff.get(key, (0, 0.0))[0] + 1
                delay = min(self.poll_interval_s * 2 ** (failures - 1), _MAX_BACKOFF_S)
                self._remember(self._backoff, key, (failures, time.monotonic() + delay))
                self._fail(assignment.version, reason, assignment.rollout)
            else:
                self._backoff.pop(key, None)
                self._remember(self._settled, key, None)

    # -- one update --------------------------------------------------------------------------

    def _update(self, assignment: Assignment) -> None:
        version, running = assignment.version, self.running_version
        rollback = assignment.rollback and running is not None and version < running
        self._step("downloading", assignment, UpdateState.DOWNLOADING)
        signed = self._cdn.fetch_document(self._cdn.manifest_url(self.model, version))
        if signed is None:
            raise DownloadError(f"the CDN has no manifest for {self.model}@{version}")
        manifest = self._trust.accept_manifest(signed, assignment)
        fetched = self._fetcher.fetch(manifest, running)

        self._step("verifying", assignment, UpdateState.VERIFYING)
        raw = self._fetcher.expand(manifest, fetched)
        if manifest.package is not None:
            self._step("installing", assignment)
            language = self._install_package(manifest, signed, raw)
            self._step("swapping", assignment)
            old: ModelRuntime | LanguageRuntime | None = self.agent.swap_language(language)
        else:
            runtime = load_checked_runtime(manifest, raw)
            self._step("installing", assignment)
            self._store.install(self.model, manifest, signed, raw)
            self._step("swapping", assignment)
            old = self.agent.swap_model(runtime)
        try:
            self._step("committing", assignment)
            previous = running if running is not None and running != version else None
            if previous is not None and not self._store.has_version(self.model, previous):
                previous = None
            record = self._trust.after_commit(assignment)
            self._store.commit(self.model, CurrentPointer(version, previous, record))
        except BaseException:  # the store still says old: serve it again
            if manifest.package is not None:
                self.agent.language = old  # type: ignore[assignment]  # what it swapped out
            else:
                self.agent.runtime = old  # type: ignore[assignment]
            raise
        self._trust.record = record
        if rollback:
            self.stats.rolled_back += 1
        else:
            self.stats.installed += 1
        state = UpdateState.ROLLED_BACK if rollback else UpdateState.INSTALLED
        self._report(version, state, "", assignment.rollout)

    def _install_package(
        self, manifest: ModelManifest, signed: bytes, raw: bytes
    ) -> LanguageRuntime:
        """Unpack the verified archive into its (not yet current) version directory and
        load it there; a package that does not load or generate is removed again."""
        folder = self._store.install(self.model, manifest, signed, raw)
        try:
            return load_checked_language(manifest, folder)
        except BaseException:
            self._store.discard_uncommitted(self.model, manifest.version)
            raise

    # -- reporting ---------------------------------------------------------------------------

    def _step(self, name: str, assignment: Assignment, state: UpdateState | None = None) -> None:
        if self._step_hook is not None:
            self._step_hook(name)
        if state is not None:
            self._report(assignment.version, state, "", assignment.rollout)

    def _fail(self, version: int | None, reason: str, rollout: str | None) -> None:
        self.stats.failed += 1
        log.warning("updater: %s update to %s failed: %s", self.model, version, reason)
        if version is not None:
            self._report(version, UpdateState.FAILED, reason, rollout)

    def _report(self, version: int, state: UpdateState, reason: str, rollout: str | None) -> None:
        status = UpdateStatus(
            device=self.device_id,
            model=self.model,
            version=version,
            state=state,
            at=format_time(datetime.now(UTC)),
            reason=reason.splitlines()[0] if reason else "",
            running_version=self.running_version,
            rollout=rollout,
        )
        self._reports = [*self._reports[-(_MAX_REPORTS - 1) :], status]
        link = self.link
        if link is not None and self._listening:
            topic = self.topics.status(self.device_id)
            handle = link.publish(topic, status.to_json(), qos=1)
            if handle.offline:
                log.info("updater: status %s queued until the broker is back", state.value)

    # -- MQTT: the device's link --------------------------------------------------------------

    def _listen_on_link(self) -> None:
        link = self.link
        if link is None or self._listening:
            return
        self._listening = True
        link.watch(self._on_connection)
        link.listen(self.topics.assign(self.device_id), self._on_assignment)
        link.open()

    def _leave_link(self) -> None:
        link = self.link
        if link is None or not self._listening:
            return
        self._listening = False
        self._said_why = False
        link.unlisten(self.topics.assign(self.device_id))
        link.unwatch(self._on_connection)
        link.close()

    @property
    def _mqtt_up(self) -> bool:
        """Whether assignments come over MQTT now (else the worker polls the CDN)."""
        link = self.link
        return self._listening and link is not None and link.connected

    def _on_connection(self, up: bool) -> None:
        if up:
            self._said_why = False
        else:
            self._wake.set()  # polling takes over

    def _on_assignment(self, message: InboundMessage) -> None:
        payload = bytes(message.payload)
        if not payload or len(payload) > MAX_DOCUMENT_BYTES:
            return  # a cleared retained message, or more than any assignment
        with self._pending_lock:
            self._pending = payload
        self._wake.set()

    @staticmethod
    def _remember(table: dict[str, Any], key: str, value: Any) -> None:
        table.pop(key, None)
        table[key] = value
        while len(table) > _MAX_REMEMBERED:
            del table[next(iter(table))]


def _device_link(agent: BaseAgent, device_id: str, mqtt: MqttSettings | None) -> DeviceLink | None:
    """The link an updater uses: none without ``mqtt``; the agent's when it is this device's
    on the same broker (a second connection under the device's id would drop the first)."""
    if mqtt is None:
        return None
    shared = agent.link
    if shared is not None and shared.device_id == device_id and shared.serves(mqtt):
        return shared
    return DeviceLink(mqtt, device_id)


def _key(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
