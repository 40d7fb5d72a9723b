"""The device's verify link (``SpecLink``) on a real Mosquitto: a lost broker connection
ends every waiting session's inbox with a ``LinkFault`` at once, so a round in flight does
not wait out its stall timer (the speculative stream then finishes the turn alone)."""

from __future__ import annotations

import queue

from edge_agent import DeviceLink
from edge_agent.language._inbox_link import LinkFault
from edge_agent.language._spec_link import SpecLink
from shared import MqttSettings, Topics

from ._brokers import MosquittoProcess


def test_a_lost_connection_faults_every_open_session(own_mosquitto: MosquittoProcess) -> None:
    link = DeviceLink(MqttSettings(host="127.0.0.1", port=own_mosquitto.port), "spec-link-1")
    spec = SpecLink(link, "spec-link-1", topics=Topics("speclink/v1"))
    assert link.open(wait_s=10.0)
    try:
        spec.attach()
        assert spec.connected
        inboxes = [spec.open("s1"), spec.open("s2")]
        spec.close("s2", "tiny", None)  # a closed session hears nothing more
        own_mosquitto.stop()
        fault = inboxes[0].get(timeout=30.0)
        assert isinstance(fault, LinkFault) and "lost" in fault.reason
        try:
            inboxes[1].get_nowait()
            raise AssertionError("a closed session was told of the fault")
        except queue.Empty:
            pass
        assert not spec.connected
    finally:
        spec.detach()
        link.close()
