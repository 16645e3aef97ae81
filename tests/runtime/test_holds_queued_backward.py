"""A relay's ``Holds`` answer must count a backward it has received and not yet computed.

A gradient is held twice when a backward's sender gave up on a slow replica and repaired the
hop onto another while the slow one still had it: the slow one adds it to its sum once its
queue reaches it. Relay ``r`` (stage 1 of 2) is busy with microbatch 8's forward when
microbatch 7's backward arrives; its origin, whose backward went round ``r`` on another
replica, asks which gradients ``r`` holds. Answered without 7, the duplicate goes unseen (no
holder drops its sum) and 7 counts twice in the stage's average once ``r`` computes it.
"""

from __future__ import annotations

from pathlib import Path

import trio

from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.gradient_redo import decode_holds
from gwtf.node.runtime.dataplane.hop import BACKWARD, FORWARD, HopHeader
from gwtf.node.training import codec
from tests.runtime.test_kept_forward_overwrite import (
    LIMITS,
    PEER,
    relay_r_onto_t,
    swarm_of,
    tensor,
    tried,
)


def test_a_backward_waiting_in_the_relays_queue_is_answered_as_held(tmp_path: Path) -> None:
    books, capture, plane_r, planes = swarm_of(tmp_path)
    f7, f8, g7 = (codec.encode(m, tensor(s), LIMITS) for m, s in ((7, 1), (8, 2), (7, 3)))
    forward_7 = tried(HopHeader(1, 0, 7, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    forward_8 = tried(HopHeader(1, 0, 8, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    path = (PEER["d"], PEER["r"], PEER["t"], PEER["d"])
    backward_7 = HopHeader(1, 0, 7, 0, BACKWARD, 1, 0, 0, PEER["d"], path)
    held: list[list[int]] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            role = relay_r_onto_t(nursery, books, plane_r, planes, capture)
            await planes["d"].send(PEER["r"], forward_7, f7)
            plane_r.emulated_hop_s = 2.0  # r is slow from here on
            nursery.start_soon(planes["d"].send, PEER["r"], forward_8, f8)
            with trio.fail_after(10):  # 8's forward takes the compute loop first
                while (0, 8) not in role.buffers:
                    await trio.sleep(0.01)
            nursery.start_soon(planes["t"].send, PEER["r"], backward_7, g7)
            with trio.fail_after(10):
                while not plane_r.receiving(0, 7, BACKWARD):
                    await trio.sleep(0.01)
            reply = await role.holds(control.Holds(0, 7, 1))
            held.append(decode_holds(reply, 2, 1)[2])
            with trio.fail_after(20):  # r computes 7's backward after all
                while 7 not in role.worker.accumulated:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert held == [[0]], "r held microbatch 7's gradient but answered that it did not"
