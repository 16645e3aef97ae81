"""Fault injection for tests and benchmarks: a relay that dies by SIGKILL at a chosen hop.

``crash_on`` names a direction and an iteration, a lock file (the first relay of the stage to
take it is the one that dies) and a moment; it fires at the first such hop of that iteration or a
later one (a relay the flows leave without one in that very iteration dies at its next).
``on_receipt`` dies as the hop arrives, before it is computed or acknowledged (its sender sees
the failure and re-sends); ``after_ack`` dies once the hop is computed and acknowledged, before
its output is sent on, so no sender sees anything and only the data node's trace of the late
microbatch finds the loss.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from gwtf.node.runtime.dataplane.exchange import Kept
from gwtf.node.runtime.dataplane.hop import BACKWARD, FORWARD, HopHeader

if TYPE_CHECKING:
    from gwtf.node.runtime.dataplane.sender import PassedBack
    from gwtf.node.runtime.live_node import LiveNode

log = logging.getLogger(__name__)

CRASH_MOMENTS = ("on_receipt", "after_ack")
#: How long an ``after_ack`` crash waits for the ack to reach the sender.
ACK_GRACE_S = 0.3


def arm_crash(node: LiveNode, crash_on: dict[str, Any]) -> None:
    """Die by SIGKILL at the first matching hop, of ``iteration`` or later (if this node wins
    the lock)."""
    direction = FORWARD if crash_on["direction"] == "forward" else BACKWARD
    iteration = int(crash_on["iteration"])
    lock = Path(crash_on["lock"])

    def wins(header: HopHeader) -> bool:
        if header.direction != direction or header.iteration < iteration:
            return False
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False  # another node took this crash
        # Who took it: a supervisor tells this death from a kill by hand.
        os.write(fd, node.config.name.encode())
        os.close(fd)
        return True

    def die(what: str) -> None:
        log.warning("fault injection: dying %s of iteration %s", what, iteration)
        os.kill(os.getpid(), signal.SIGKILL)

    if crash_on.get("when", "on_receipt") == "on_receipt":
        compute = node.plane.compute
        assert compute is not None, "the role sets compute before the node is started"

        async def crashing(header: HopHeader, frame: bytes) -> Kept | None:
            if wins(header):
                die(f"mid-{crash_on['direction']}")
            return await compute(header, frame)

        node.plane.compute = crashing
        return
    from gwtf.node.runtime.roles.relay import (
        RelayRole,  # the process's own role; torch is loaded by now
    )

    role = node.role
    assert isinstance(role, RelayRole), "only relays are armed"
    # The onward sends see the header as it goes on: a forward's stage is one past the relay's,
    # a backward's one before it; its iteration is the hop's.
    if direction == FORWARD:
        send_forward = role._send_forward

        async def send_forward_then_die(received: HopHeader, frame: bytes, digest: bytes) -> None:
            if wins(received):
                await trio.sleep(ACK_GRACE_S)
                die("after acknowledging a forward")
            await send_forward(received, frame, digest)

        role._send_forward = send_forward_then_die  # type: ignore[method-assign,assignment]
    else:
        send_backward = role.sender.send_backward_or_log

        async def send_backward_then_die(record: PassedBack) -> None:
            if wins(record.header):
                await trio.sleep(ACK_GRACE_S)
                die("after acknowledging a backward")
            await send_backward(record)

        role.sender.send_backward_or_log = send_backward_then_die  # type: ignore[method-assign]
