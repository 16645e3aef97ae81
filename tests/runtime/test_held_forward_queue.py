"""Asking a microbatch's origin about a second forward must not stop the relay's other hops.

Relay ``r`` (stage 1 of 2) holds microbatch 7's forward. Run member ``s`` sends it a forward of
7 from another input (with 7's try token, leaked by a colluder on its path) claiming a restart,
so ``r`` asks 7's origin ``d``, which is slow to answer (far away, or busy). Meanwhile ``d``
sends ``r`` microbatch 8's forward: it must be computed and acknowledged without waiting for
the answer about 7, or each made-up forward (declined, never charged) halts the relay for the
origin's round trip, up to a quarter of the ack deadline, and its honest senders' acks run late.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from gwtf.node.p2p.rpc import Decline, PeerTimeout
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import PROTOCOL_ID
from gwtf.node.runtime.dataplane.hop import ATTEMPT_BLOCK, FORWARD, HopHeader
from gwtf.node.training import codec
from tests.runtime.test_kept_forward_overwrite import (
    LIMITS,
    PEER,
    Capture,
    relay_r_onto_t,
    swarm_of,
    tensor,
    tried,
)


class SlowOrigin(Capture):
    """r's sends; its questions to the origin answered only once ``answer`` is set, or timed
    out at their deadline as the rpc layer does."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = trio.Event()
        self.answer = trio.Event()

    async def open(self, peer: Any, protocol: str, timeout_s: float) -> None:
        pass  # connected: the hop goes at once

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        if protocol == PROTOCOL_ID:
            return await super().request(peer, protocol, payload, limits)
        assert isinstance(control.decode_request(payload), control.CurrentTry)
        self.asked.set()
        with trio.move_on_after(limits.timeout_s):
            await self.answer.wait()
            return control.encode_reply(True, attempt=0)
        raise PeerTimeout(f"peer {peer} did not answer in time")


def test_a_slow_origin_answer_does_not_hold_up_the_relays_other_hops(tmp_path: Path) -> None:
    books, _capture, plane_r, planes = swarm_of(tmp_path)
    origin = SlowOrigin()
    plane_r.rpc = origin  # type: ignore[assignment]
    f7, made_up_input, f8 = (
        codec.encode(m, tensor(s), LIMITS) for m, s in ((7, 1), (7, 2), (8, 3))
    )
    forward_7 = tried(HopHeader(1, 0, 7, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    # With 7's try token, leaked by a node on its path:
    made_up = forward_7.onward(attempt=ATTEMPT_BLOCK, path=(PEER["s"],))
    forward_8 = tried(HopHeader(1, 0, 8, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    order: list[str] = []

    async def attack() -> None:
        try:
            await planes["s"].send(PEER["r"], made_up, made_up_input)
            order.append("made-up computed")
        except Decline:
            order.append("made-up declined")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            relay_r_onto_t(nursery, books, plane_r, planes, origin)
            await planes["d"].send(PEER["r"], forward_7, f7)
            nursery.start_soon(attack)
            with trio.fail_after(10):
                await origin.asked.wait()
            await planes["d"].send(PEER["r"], forward_8, f8)
            order.append("8 acknowledged")
            origin.answer.set()
            with trio.fail_after(10):
                while len(order) < 2:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert order == ["8 acknowledged", "made-up declined"]
