"""Repairing a stalled forward at the hop where it was lost, for the data node that started it.

Acks come after compute, so a relay can acknowledge a forward and die before sending its output
on. The data node then follows the microbatch's path as the nodes remember it (``Trace``): from
the node that took its embedding output, hop by hop, to the first node that is gone, never got
the hop, or could not hand it on. The last live node before that gap re-sends its buffered
output (``Resume``) to another replica of the lost stage, which computes it and sends it on like
any forward, so only the lost hop is recomputed. A node still computing or sending is left
alone; when there is nothing to repair the caller restarts the microbatch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from node.p2p.rpc import RpcLimits
from node.runtime import control
from node.runtime.dataplane import DataPlane
from node.runtime.flow_service import FlowService
from node.runtime.relay import HopSender, HopStats

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (iteration, microbatch id)


@dataclass
class ForwardRepair:
    plane: DataPlane
    flow: FlowService
    sender: HopSender
    stats: HopStats
    #: This node's own answers: a trace of it as a sink, a resume of its embedding output.
    trace_here: Callable[[control.Trace], bytes]
    resend_here: Callable[[control.Resume], Awaitable[bytes]]
    #: The microbatch's next attempt number (each re-sent hop is a new attempt).
    take_attempt: Callable[[Key], int]
    trace_timeout_s: Callable[[], float]

    @property
    def node_id(self) -> str:
        return self.plane.node_id

    async def repair(self, key: Key, first_hop: str | None) -> str | None:
        """Trace the forward from ``first_hop`` and repair it at the gap; returns what was done
        (or that the path is only slow), or None when nothing can be repaired."""
        holder, node, stage = self.node_id, first_hop, 1
        while node is not None and stage <= self.plane.stages + 1:
            state, next_hop = await self._trace(node, key)
            if state in ("dead", "absent"):
                return await self._resume(holder, stage, {node}, key, f"{node} {state}")
            if state == "stuck":
                return await self._resume(node, stage + 1, set(), key, f"{node} stuck")
            if state in ("queued", "sending"):
                return f"{node} still has it {state}; waiting"
            if state != "sent":
                return None  # held: computed and kept; the forward is not what stalls
            holder, node, stage = node, next_hop, stage + 1
        return None

    async def _trace(self, node: str, key: Key) -> tuple[str, str]:
        """The forward's state at ``node`` ("dead" when it does not answer)."""
        request = control.Trace(*key)
        if node == self.node_id:
            return control.decode_trace(self.trace_here(request))
        limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, self.trace_timeout_s())
        try:
            reply = await self.plane.rpc.request(
                ID.from_base58(node), control.PROTOCOL_ID, control.encode_request(request), limits
            )
            return control.decode_trace(reply)
        except ProtocolError as exc:
            log.warning("tracing microbatch %s: %s does not answer: %s", key[1], node, exc)
            self.flow.dispatch(self.flow.node.peer_dead(node, trio.current_time()))
            return "dead", ""

    async def _resume(
        self, holder: str, stage: int, exclude: set[str], key: Key, why: str
    ) -> str | None:
        """Ask ``holder`` to re-send its buffered output to a live replica of ``stage``."""
        to = self.sender.replacement(stage, exclude)
        if to is None and stage == self.plane.stages + 1 and self.node_id not in exclude:
            to = self.node_id  # the sink: this data node computes the loss itself
        if to is None:
            return None
        request = control.Resume(key[0], key[1], to, self.take_attempt(key))
        try:
            if holder == self.node_id:
                reply = await self.resend_here(request)
            else:
                limits = RpcLimits(
                    control.MAX_BYTES, control.MAX_BYTES, 2 * self.plane.ack_deadline_s
                )
                reply = await self.plane.rpc.request(
                    ID.from_base58(holder),
                    control.PROTOCOL_ID,
                    control.encode_request(request),
                    limits,
                )
            if not control.decode_reply(reply)["ok"]:
                return None
        except ProtocolError as exc:
            log.warning("repairing microbatch %s: %s failed: %s", key[1], holder, exc)
            return None
        self.stats.forward_repairs += 1
        return f"{why}: {holder} re-sent its output to {to} (stage {stage})"
