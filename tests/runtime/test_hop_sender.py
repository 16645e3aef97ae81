"""An acknowledged hop tells the flow core its receiver is alive
(``node/runtime/dataplane/sender.py``), so keep-alives need not ping a peer that data flows to."""

from __future__ import annotations

import random
from typing import Any

import trio
import trio.testing

from coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from coordinator_free.wire import Hello
from node.runtime.dataplane.exchange import DataPlane
from node.runtime.dataplane.hop import BACKWARD, FORWARD, HopHeader
from node.runtime.dataplane.sender import HopSender, HopStats
from node.runtime.flow.service import FlowService

ACK_S = 0.25  # how long the receiver takes to acknowledge a hop


class AckingPlane(DataPlane):
    """A data plane whose every send is acknowledged after ``ACK_S``."""

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        await trio.sleep(ACK_S)
        return b""


def test_an_acknowledged_forward_or_backward_counts_as_hearing_from_its_receiver() -> None:
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    for peer, role, stage in (("d", "data", 0), ("b", "relay", 2)):
        node.handle(peer, Hello(role, stage, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    unused: Any = None  # the sends never reach the network, and nothing is declared dead
    plane = AckingPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    forward = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, "d", ("d", "a"))
    backward = HopHeader(1, 0, 7, 0, BACKWARD, 0, 0, 0, "d", ("d", "a", "b", "d"))
    heard: dict[str, float] = {}

    async def main() -> None:
        await trio.sleep(10.0)
        assert await sender.send_forward(forward, b"out", "b", b"in") == "b"
        heard["b"] = node.peers["b"].last_heard_s
        await trio.sleep(10.0)
        await sender.send_backward(sender.pass_back(backward, b"grad", b"in"))
        heard["d"] = node.peers["d"].last_heard_s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert heard == {"b": 10.0 + ACK_S, "d": 20.0 + 2 * ACK_S}
