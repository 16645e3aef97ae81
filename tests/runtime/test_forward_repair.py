"""A relay that dies after acknowledging a forward, before handing it on: only that hop is redone.

The data node's stall deadline passes; it traces the microbatch's recorded path, finds the dead
relay, and asks the node before it to re-send its buffered output to the other replica of the
dead relay's stage, which computes it and sends it on: for a stage-1 relay that node is the data
node itself, for a stage-2 relay it is the stage-1 relay that fed it. No microbatch restarts, and
every hop of those iterations is recorded exactly once (the dead relay's lost hop was never
recorded: nobody acknowledged its output).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import trio

from gwtf.errors import ProtocolError
from node.runtime import control
from node.runtime.hop import FLAG_REPAIR, FLAG_RESUME, FORWARD, HopHeader
from node.runtime.relay import Buffered, RelayRole
from tests.runtime.swarm_harness import Swarm, reference_losses, run_swarm

ITERATIONS = 3
BATCH = 4
#: In iteration 1 a stage-1 relay dies, in iteration 2 a stage-2 relay.
CRASHES = {1: ("a1", "a2"), 2: ("b1", "b2")}


def dying_send(
    swarm: Swarm, name: str, iteration: int, role: RelayRole, crashed: dict[int, str]
) -> Callable[[HopHeader, bytes, bytes], Coroutine[Any, Any, None]]:
    """``role``'s forward send, except that the first relay of its group to send one of
    ``iteration`` dies instead (after its ack is out), and sends nothing more."""
    send_forward = role._send_forward

    async def send(received: HopHeader, frame: bytes, digest: bytes) -> None:
        if received.iteration == iteration and crashed.get(iteration, name) == name:
            if iteration not in crashed:
                crashed[iteration] = name
                await trio.sleep(0.5)  # the ack reaches the data node meanwhile
                swarm.crash(name)
            await trio.sleep_forever()
        await send_forward(received, frame, digest)

    return send


def test_a_relay_dying_between_its_ack_and_its_forward_costs_one_hop(tmp_path: Path) -> None:
    swarm = Swarm()
    crashed: dict[int, str] = {}

    async def crash_after_ack(swarm: Swarm) -> None:
        """Arm both stage-1 relays: the first to compute a forward of the crash iteration dies
        once its ack is out, without sending the output on."""
        while not {"data", "a1", "a2", "b1", "b2"} <= set(swarm.nodes):
            await trio.sleep(0.01)
        data = swarm.nodes["data"].role
        data.stall_timeout_s = 4.0  # type: ignore[union-attr]
        data.probe_timeout_s = 2.0  # type: ignore[union-attr] # a trace of the dead relay
        for iteration, group in CRASHES.items():
            for name in group:
                role = swarm.nodes[name].role
                assert isinstance(role, RelayRole)
                role._send_forward = dying_send(  # type: ignore[method-assign,assignment]
                    swarm, name, iteration, role, crashed
                )

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(150):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "a2": 1, "b1": 2, "b2": 2},
                crash_after_ack,
                swarm,
            )

    results = trio.run(main)
    assert sorted(crashed) == sorted(CRASHES)
    data = swarm.nodes["data"].role
    assert [r.restarts for r in results] == [0] * ITERATIONS
    assert data.stats.forward_repairs >= 2
    relays = {name: node.role for name, node in swarm.nodes.items() if name != "data"}
    assert sum(r.stats.repairs_served for r in relays.values()) >= 1  # a stage-1 relay's
    assert [r.loss for r in results] == pytest.approx(reference_losses(ITERATIONS, BATCH), rel=1e-4)
    for iteration, name in crashed.items():
        records = [
            r
            for node in swarm.nodes.values()
            for r in node.plane.hop_log.records
            if r.iteration == iteration
        ]
        counts = Counter((r.microbatch_id, r.stage, r.direction) for r in records)
        microbatches = range(iteration * BATCH, (iteration + 1) * BATCH)
        expected = {(m, stage, FORWARD): 1 for m in microbatches for stage in (0, 1, 2)}
        assert {k: v for k, v in counts.items() if k[2] == FORWARD} == expected
        # The forward the dead relay lost was computed again by the other replica only.
        dead = swarm.nodes[name].plane.node_id
        assert not [r for r in records if r.worker == dead and r.direction == FORWARD]


def test_trace_requests_and_replies_are_checked() -> None:
    request = control.Trace(3, 7)
    assert control.decode_request(control.encode_request(request)) == request
    resume = control.Resume(3, 7, "peer", 2)
    decoded = control.decode_request(control.encode_request(resume))
    assert type(decoded) is control.Resume and decoded == resume
    assert control.decode_trace(control.encode_trace("sent", "peer")) == ("sent", "peer")
    for bad in (
        control.encode_trace("sent"),
        control.encode_trace("absent", "peer"),
        control.encode_trace("lost"),
        control.encode_reply(True),
    ):
        with pytest.raises(ProtocolError):
            control.decode_trace(bad)


def test_a_relays_buffered_forward_reports_its_trace_state() -> None:
    header = HopHeader(1, 0, 3, 0, FORWARD, 1, 0, 0, "origin", ("origin",))
    assert Buffered(header, b"out", sending=True).trace_state() == ("sending", "")
    assert Buffered(header, b"out").trace_state() == ("stuck", "")
    assert Buffered(header, b"out", sent_to="next").trace_state() == ("sent", "next")
    repair = header.onward(flags=FLAG_REPAIR)
    assert Buffered(repair, b"out").trace_state() == ("held", "")
    resumed = header.onward(flags=FLAG_RESUME)
    assert Buffered(resumed, b"out", sent_to="next").trace_state() == ("sent", "next")
    for state, next_hop in (("sending", ""), ("stuck", ""), ("sent", "next"), ("held", "")):
        assert control.decode_trace(control.encode_trace(state, next_hop)) == (state, next_hop)
