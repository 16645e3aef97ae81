"""Repairing a late microbatch at the hop where it was lost, for the data node that started it.

Acks come after compute, so a relay can acknowledge a hop and die before sending its output on;
nobody else notices. When a microbatch runs late the data node follows it as the nodes remember
it (``Trace`` for a forward, ``TraceBack`` for a backward) to the first node that is gone, never
got the hop, or could not hand it on, and has the hop sent again past that node:

* forward: the last live node before the gap re-sends its buffered output (``Resume``) to another
  replica of the lost stage, which computes it and sends it on like any forward. A dead node that
  had already handed the hop on is no gap: the next stage's replicas are asked who holds it.
* backward: the node that delivered the gradient to the dead one sends it again around it
  (``ResumeBack``): the node before the dead hop re-sends its forward output to another replica,
  which recomputes that hop's forward and then takes the gradient.

Only the lost hop is recomputed. A node still computing or sending is left alone; when there is
nothing to repair the caller waits on, and restarts the microbatch at its stall deadline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, TypeVar

import trio

from gwtf.coordinator_free.decisions import stand_in
from gwtf.errors import ProtocolError
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.hop import TakeAttempt
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats, may_be_cut
from gwtf.node.runtime.flow.service import FlowService

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (iteration, microbatch id)


@dataclass(frozen=True)
class Outcome:
    what: str
    repaired: bool  # a hop was sent again (else the microbatch is only slow somewhere)


class TraceHere(Protocol):
    """What this node, as a sink, knows of a microbatch's forward: a trace reply
    (``control.encode_trace``) as a peer would give it. Does not block or raise."""

    def __call__(self, request: control.Trace, /) -> bytes: ...


class ReplicasOf(Protocol):
    """The relays of a stage that may be alive, as far as this node knows now (may be empty).
    Does not block or raise."""

    def __call__(self, stage: int, /) -> list[str]: ...


Resumed = TypeVar("Resumed", control.Resume, control.ResumeBack)


@dataclass
class StallRepair:
    plane: DataPlane
    flow: FlowService
    sender: HopSender
    stats: HopStats
    #: This node's own answers: a trace of it as a sink, a resume of its embedding output.
    trace_here: TraceHere
    resend_here: control.AnswerHere[control.Resume]
    #: The microbatch's next attempt number (each re-sent hop is a new attempt).
    take_attempt: TakeAttempt
    trace_timeout_s: control.AskDeadline
    #: The relays of a stage that may be alive (the flow protocol's and discovery's: the data
    #: node's flow neighbours are only stage 1 and the last stage).
    replicas_of: ReplicasOf

    @property
    def node_id(self) -> str:
        return self.plane.node_id

    # ---- forward -----------------------------------------------------------------------------

    async def repair_forward(self, key: Key, first_hop: str | None) -> Outcome | None:
        """Trace the forward from ``first_hop`` and repair it at the gap; None when nothing can
        be repaired."""
        holder, node, stage = self.node_id, first_hop, 1
        while node is not None and stage <= self.plane.stages + 1:
            state, next_hop = await self._trace(node, control.Trace(*key))
            if state == "dead":
                handed_to = await self._holder_in(stage + 1, key, exclude={node})
                if handed_to is not None:  # it handed the hop on before it died: no gap here
                    holder, node, stage = node, handed_to, stage + 1
                    continue
            if state in ("dead", "absent"):
                return await self._resume(holder, stage, {node}, key, f"{node} {state}")
            if state == "stuck":
                return await self._resume(node, stage + 1, set(), key, f"{node} stuck")
            if state in ("queued", "sending"):
                return Outcome(f"{node} still has it {state}; waiting", repaired=False)
            if state != "sent":
                return None  # held: computed and kept; the forward is not what stalls
            holder, node, stage = node, next_hop, stage + 1
        return None

    async def _holder_in(self, stage: int, key: Key, exclude: set[str]) -> str | None:
        """A live node of ``stage`` (S+1: this sink) that has received the forward, if any."""
        candidates = [self.node_id] if stage > self.plane.stages else self.replicas_of(stage)
        for node in candidates:
            if node not in exclude:
                state, _ = await self._trace(node, control.Trace(*key))
                if state not in ("dead", "absent"):
                    return node
        return None

    async def _resume(
        self, holder: str, stage: int, exclude: set[str], key: Key, why: str
    ) -> Outcome | None:
        """Ask ``holder`` to re-send its buffered output to a live replica of ``stage``."""
        to = stand_in(self.replicas_of(stage), exclude, self.flow.node.rng)
        if to is None and stage == self.plane.stages + 1 and self.node_id not in exclude:
            to = self.node_id  # the sink: this data node computes the loss itself
        if to is None:
            return None
        request = control.Resume(key[0], key[1], to, self.take_attempt(key))
        if not await self._ask(holder, request, self.resend_here):
            return None
        self.stats.forward_repairs += 1
        return Outcome(f"{why}: {holder} re-sent its output to {to} (stage {stage})", True)

    # ---- backward ----------------------------------------------------------------------------

    async def repair_backward(self, key: Key) -> Outcome | None:
        """Follow the gradient from this sink to where it is; if the node holding it died, have
        the node that delivered it to that one send it again around it."""
        holder, node = self.node_id, self.node_id
        for _ in range(self.plane.stages + 1):
            request = control.TraceBack(*key)
            if node == self.node_id:
                state, next_hop = control.decode_trace(
                    self.sender.trace_back(request), control.TRACE_BACK_STATES
                )
            else:
                state, next_hop = await self._trace(node, request)
            if state in ("dead", "absent"):
                resume = control.ResumeBack(key[0], key[1], node)
                if not await self._ask(holder, resume, self.sender.resume_backward):
                    return None
                self.stats.gradient_resumes += 1
                return Outcome(f"{node} {state}: {holder} sent its gradient again around it", True)
            if state in ("queued", "sending"):
                return Outcome(f"{node} has the gradient {state}; waiting", repaired=False)
            if state != "sent" or next_hop == self.node_id:
                return None  # stuck (nobody could take it), or it is arriving here
            holder, node = node, next_hop
        return None

    # ---- asking other nodes ------------------------------------------------------------------

    async def _trace(self, node: str, request: control.Trace) -> tuple[str, str]:
        """The microbatch's state at ``node`` ("dead" when it does not answer)."""
        backward = isinstance(request, control.TraceBack)
        states = control.TRACE_BACK_STATES if backward else control.TRACE_STATES
        if node == self.node_id:
            return control.decode_trace(self.trace_here(request), states)
        # A trace cut under a live node (its stream reset) must not tear down every flow
        # through it, nor have the microbatch repaired around it: it answers a probe, and is
        # asked once more.
        for again in (False, True):
            try:
                reply = await control.ask(self.plane.rpc, node, request, self.trace_timeout_s())
                return control.decode_trace(reply, states)
            except ProtocolError as exc:
                log.warning("tracing microbatch %s: %s is silent%s: %s", request.microbatch,
                            node, " though it answers a probe" if again else "", exc)  # fmt: skip
                if again or not may_be_cut(exc):
                    break
                if not await self.sender.probes.answers(node):
                    break  # gone: no second ask
        self.flow.dispatch(self.flow.node.peer_dead(node, trio.current_time()))
        return "dead", ""

    async def _ask(self, holder: str, request: Resumed, here: control.AnswerHere[Resumed]) -> bool:
        """Ask ``holder`` (this node: ``here``) to send a hop again; True when it did."""
        return await control.ask_to_send(
            self.plane.rpc, self.node_id, holder, request, self.plane.ack_deadline_s, here,
            "repairing",
        )  # fmt: skip
