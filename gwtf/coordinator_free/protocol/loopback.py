"""A deterministic in-memory network that runs flow nodes: for tests and small experiments.

Messages are delivered after a per-link delay in virtual time, in (time, send order) order, so a
run is a pure function of the nodes' seeds. A crashed node neither ticks nor receives. With
``through_wire`` every message is encoded and decoded on the way, as on a real link.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Protocol

from gwtf.coordinator_free.protocol.config import Outbound
from gwtf.coordinator_free.protocol.node import FlowNode
from gwtf.coordinator_free.wire import Message, decode, encode


class LinkDelay(Protocol):
    """Seconds a message takes from one node to another (ids) on the loopback network. Pure;
    does not raise."""

    def __call__(self, sender: str, receiver: str, /) -> float: ...


class LoopbackNetwork:
    """Delivers the nodes' messages to each other and drives their ticks."""

    def __init__(
        self,
        nodes: Iterable[FlowNode],
        link_delay_s: LinkDelay | None = None,
        through_wire: bool = False,
    ) -> None:
        self.nodes: dict[str, FlowNode] = {node.node_id: node for node in nodes}
        self.link_delay_s: LinkDelay = link_delay_s or (lambda a, b: 0.01)
        self.through_wire = through_wire
        self.now = 0.0
        self.crashed: set[str] = set()
        self.delivered = 0
        self._queue: list[tuple[float, int, str, str, Message]] = []
        self._sequence = 0

    def send(self, sender: str, sends: list[Outbound]) -> None:
        for outbound in sends:
            message = decode(encode(outbound.message)) if self.through_wire else outbound.message
            arrive = self.now + self.link_delay_s(sender, outbound.to)
            self._sequence += 1
            heapq.heappush(self._queue, (arrive, self._sequence, sender, outbound.to, message))

    def introduce_all(self, neighbours: Callable[[FlowNode], Iterable[str]]) -> None:
        """Introduce each node to the peers ``neighbours`` names for it."""
        for node in self.nodes.values():
            for peer_id in neighbours(node):
                self.send(node.node_id, node.introduce(peer_id))

    def crash(self, node_id: str) -> None:
        self.crashed.add(node_id)

    def deliver_in_flight(self, max_messages: int = 1_000_000) -> None:
        """Deliver messages (and those they cause) without ticking, until none is in flight."""
        for _ in range(max_messages):
            if not self._queue:
                return
            self._deliver_next()

    def _deliver_next(self) -> None:
        arrive, _, sender, to, message = heapq.heappop(self._queue)
        self.now = max(self.now, arrive)
        if to in self.crashed or to not in self.nodes:
            return
        self.delivered += 1
        self.send(to, self.nodes[to].handle(sender, message, self.now))

    def run_until(self, until_s: float, tick_every_s: float = 1.0) -> None:
        """Advance virtual time to ``until_s``, ticking every live node every ``tick_every_s``."""
        next_tick = self.now
        while True:
            next_event = self._queue[0][0] if self._queue else float("inf")
            if min(next_event, next_tick) > until_s:
                break
            if next_tick <= next_event:
                self.now = next_tick
                for node_id in sorted(self.nodes):
                    if node_id not in self.crashed:
                        self.send(node_id, self.nodes[node_id].tick(self.now))
                next_tick += tick_every_s
                continue
            self._deliver_next()
        self.now = until_s
