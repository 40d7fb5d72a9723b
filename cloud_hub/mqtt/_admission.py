"""Two cheap checks the MQTT front makes before a request is computed: late, or seen before.

``TransitBaseline`` tells how late a request arrived. A request's
``timeout_ms`` is the budget left when the device sent it and ``sent_at_ms``
the device's wall clock then; clocks need not agree, so the hub compares
each request's transit (hub's wall clock at receipt minus ``sent_at_ms``)
with the smallest transit of that device's requests in the last
``window_s`` (two half-window buckets: a sliding minimum without a list).
What is above that baseline is time the request spent held up (a broker
frozen or overloaded, a backlog after a reconnect); a constant clock offset
cancels out. A request later than its whole budget is answered
``deadline_exceeded`` without being computed: its device gave up on it. A
device whose clock steps back by S seconds looks S seconds late until its
baseline catches up (at most ``window_s``); only requests with a budget
under S are refused meanwhile, and they are answered, not lost.

``RecentRequests`` remembers ``(device, request id)`` pairs for ``window_s``
(at most ``max_entries``, oldest forgotten first): the same request again
(an MQTT redelivery, a device retrying with the same id) is not computed a
second time.

Both cost a dictionary lookup and a few comparisons per request; neither
holds a lock (the session's single thread calls them).
"""

from __future__ import annotations

import math

__all__ = ["RecentRequests", "TransitBaseline"]

_INF = math.inf


class TransitBaseline:
    """Per device: how much later than its fastest recent request a request arrived."""

    def __init__(self, *, window_s: float = 60.0, max_devices: int = 100_000) -> None:
        if window_s <= 0 or max_devices < 1:
            raise ValueError("window_s must be > 0 and max_devices >= 1")
        self._half_s = window_s / 2
        self._max = max_devices
        # device -> [bucket start (monotonic s), this bucket's min transit, previous bucket's]
        self._devices: dict[str, list[float]] = {}

    def lateness_s(self, device: str, transit_s: float, now: float) -> float:
        """Seconds ``transit_s`` exceeds the device's baseline (0 for its first request).

        ``transit_s``: the hub's wall clock at receipt minus the device's send
        time; ``now``: ``time.monotonic()`` at receipt.
        """
        state = self._devices.get(device)
        if state is None:
            if len(self._devices) >= self._max:  # devices come and go: start over
                self._devices.clear()
            self._devices[device] = [now, transit_s, _INF]
            return 0.0
        age = now - state[0]
        if age >= self._half_s:  # a new bucket; the old one is kept for one more half
            state[2] = state[1] if age < 2 * self._half_s else _INF
            state[0], state[1] = now, _INF
        if transit_s < state[1]:
            state[1] = transit_s
        return transit_s - min(state[1], state[2])


class RecentRequests:
    """``seen(key, now)``: whether ``key`` was seen within ``window_s``; remembers it."""

    def __init__(self, *, window_s: float = 60.0, max_entries: int = 200_000) -> None:
        if window_s <= 0 or max_entries < 1:
            raise ValueError("window_s must be > 0 and max_entries >= 1")
        self.window_s = window_s
        self._max = max_entries
        self._seen: dict[tuple[str, str], float] = {}  # insertion order: oldest first

    def seen(self, key: tuple[str, str], now: float) -> bool:
        at = self._seen.get(key)
        if at is not None and now - at <= self.window_s:
            return True
        if at is not None:
            del self._seen[key]  # re-inserted below, as the newest
        elif len(self._seen) >= self._max:
            del self._seen[next(iter(self._seen))]
        self._seen[key] = now
        return False
