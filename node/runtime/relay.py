"""A relay on the live network: computes its stage for whatever the flow protocol sends it.

Forward: compute, keep the input and output until the backward comes, send the output to the next
hop that the flow table maps the incoming flow to (another next-stage replica if that one does not
acknowledge). Backward: compute, send the gradient to the previous node of the recorded path; if
that node is dead, repair just that hop — ask the node before it to re-send its buffered forward
output to a live replica of the dead node's stage, flagged as a repair, then send the gradient
there. End of iteration: average with the stage's live replicas and step.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from node.p2p.rpc import Decline, PeerUnavailable, RequestDeclined, RpcLimits
from node.runtime import control
from node.runtime.averaging import GradientAverager
from node.runtime.compute import T, in_worker_thread
from node.runtime.dataplane import DataPlane, HopRecord
from node.runtime.flow_service import FlowService
from node.runtime.hop import (
    BACKWARD,
    FLAG_REPAIR,
    FLAG_RESUME,
    FORWARD,
    HopHeader,
    frame_digest,
)
from node.runtime.routing import SwarmWiring
from node.training import codec
from node.training.codec import CodecLimits
from node.training.stage_worker import StageWorker

log = logging.getLogger(__name__)


@dataclass
class Buffered:
    """What a relay keeps of a microbatch until its backward is through."""

    header: HopHeader  # the forward hop as received
    output_frame: bytes
    sending: bool = False  # the output is on its way to the next hop
    sent_to: str = ""  # the next hop that acknowledged the output

    def trace_state(self) -> tuple[str, str]:
        """This forward's state for a ``Trace`` (see ``control.TRACE_STATES``)."""
        if self.header.flags & FLAG_REPAIR:
            return "held", ""
        if self.sent_to:
            return "sent", self.sent_to
        return ("sending" if self.sending else "stuck"), ""


@dataclass
class PassedBack:
    """A gradient a node computed and sent on, kept until the iteration ends."""

    header: HopHeader  # the outgoing backward (its path names the node it goes to)
    frame: bytes
    input_digest: bytes
    sending: bool = False
    sent_to: str = ""  # the node that acknowledged it
    around: set[str] = field(default_factory=set)  # dead nodes it was re-sent around
    recorded: bool = False  # in the hop log (once, however often it is sent)


@dataclass
class HopStats:
    forward_resends: int = 0
    backward_repairs: int = 0
    forward_repairs: int = 0  # a data node: stalled forwards resumed at the lost hop
    gradient_resumes: int = 0  # a data node: lost gradients sent again around the dead hop
    repairs_served: int = 0
    stages_not_stepped: int = 0  # a data node: (iteration, stage) pairs with no replica stepping
    # A relay's ends of iteration (seconds, summed): all of it, and the averaging exchange in it.
    ending_s: float = 0.0
    averaging_s: float = 0.0


class HopSender:
    """Forward sends with re-send on a missed ack, and backward sends with hop repair."""

    def __init__(
        self, plane: DataPlane, flow: FlowService, stats: HopStats, wiring: SwarmWiring | None
    ) -> None:
        self.plane = plane
        self.flow = flow
        self.stats = stats
        self.wiring = wiring  # None: hops follow the flow table (GWTF); else SWARM's wiring
        self.passed: dict[tuple[int, int], PassedBack] = {}  # by (iteration, microbatch)

    def next_hop(self, stage: int, route: str | None) -> str | None:
        """Where a forward into ``stage`` goes: the flow's next hop, or SWARM's weighted draw."""
        if self.wiring is not None:
            wanted = 0 if stage > self.plane.stages else stage
            return self.wiring.choose([p.peer_id for p in self.flow.node.alive_peers(wanted)])
        return route if route is not None else self.replacement(stage, set())

    async def forward(self, header: HopHeader, frame: bytes, to: str, input_digest: bytes) -> str:
        """Send a forward; on a missed ack re-send to another replica of the next stage.
        Returns the node that acknowledged it."""
        tried: set[str] = set()
        while True:
            try:
                sent_at = trio.current_time()
                await self.plane.send(to, header, frame)
                if self.wiring is not None:
                    self.wiring.observe(to, trio.current_time() - sent_at)
                self._record(header, to, input_digest, frame)
                return to
            except PeerUnavailable as exc:
                log.warning(
                    "forward of microbatch %s to %s failed: %s", header.microbatch_id, to, exc
                )
                tried.add(to)
                if not isinstance(exc, RequestDeclined):  # a decline comes from a live peer
                    self.flow.dispatch(self.flow.node.peer_dead(to, trio.current_time()))
                replacement = self.replacement(header.stage, tried)
                if replacement is None:
                    raise
                self.stats.forward_resends += 1
                to, header = replacement, header.onward(attempt=header.attempt + 1)

    def replacement(self, stage: int, exclude: set[str]) -> str | None:
        """A live node of ``stage`` (the sink stage is S+1, data nodes) not in ``exclude``,
        drawn at random (from the flow core's seeded generator) so that hops outside any flow
        spread over the replicas instead of piling onto the first."""
        wanted = 0 if stage > self.plane.stages else stage
        candidates = [p.peer_id for p in self.flow.node.alive_peers(wanted)]
        candidates = [peer for peer in candidates if peer not in exclude]
        return self.flow.node.rng.choice(candidates) if candidates else None

    def pass_back(self, header: HopHeader, frame: bytes, input_digest: bytes) -> PassedBack:
        """Keep a gradient this node computed (``header`` is the outgoing backward) until the
        iteration ends: if the node it goes to dies holding it, this node sends it again."""
        record = PassedBack(header, frame, input_digest)
        self.passed[(header.iteration, header.microbatch_id)] = record
        return record

    async def backward(self, record: PassedBack) -> None:
        """Send a kept gradient to ``path[stage]``; if that node is dead, repair the hop around
        it and send there. ``record`` ends up naming the node that acknowledged it."""
        header, tried = record.header, set(record.around)
        record.sending = True
        try:
            while True:
                to = header.path[header.stage]
                try:
                    await self.plane.send(to, header, record.frame)
                except PeerUnavailable as exc:
                    if header.stage == 0:
                        raise  # the origin holds the iteration; nobody can stand in for it
                    log.warning(
                        "backward of microbatch %s to %s failed: %s", header.microbatch_id, to, exc
                    )
                    tried.add(to)
                    if not isinstance(exc, RequestDeclined):  # a decline comes from a live peer
                        self.flow.dispatch(self.flow.node.peer_dead(to, trio.current_time()))
                    header = await self._around(header, tried)
                    continue
                if not record.recorded:  # a gradient sent again is the same work, claimed once
                    self._record(header, to, record.input_digest, record.frame)
                    record.recorded = True
                record.header, record.sent_to = header, to
                return
        finally:
            record.sending = False

    async def _around(self, header: HopHeader, dead: set[str]) -> HopHeader:
        """Repair a backward hop whose node is dead: the node before it re-sends its forward
        output to another replica of the dead node's stage; returns the backward to send there."""
        replacement = self.replacement(header.stage, dead)
        if replacement is None:
            raise PeerUnavailable(f"no live replica of stage {header.stage} left")
        attempt = header.attempt + 1
        await self.request_resend(header, replacement, attempt)
        self.stats.backward_repairs += 1
        path = list(header.path)
        path[header.stage] = replacement
        return header.onward(path=tuple(path), attempt=attempt)

    async def backward_or_log(self, record: PassedBack) -> None:
        """``backward`` as a background task: a gradient that cannot be delivered is logged (the
        origin's trace of the stalled microbatch finds it here, stuck)."""
        try:
            await self.backward(record)
        except (PeerUnavailable, ProtocolError) as exc:
            log.warning("gradient of microbatch %s stalls: %s", record.header.microbatch_id, exc)

    def trace_back(self, request: control.TraceBack) -> bytes:
        """What this node knows of a microbatch's backward."""
        if self.plane.receiving(request.iteration, request.microbatch, BACKWARD):
            return control.encode_trace("queued")
        record = self.passed.get((request.iteration, request.microbatch))
        if record is None:
            return control.encode_trace("absent")
        if record.sent_to:
            return control.encode_trace("sent", record.sent_to)
        return control.encode_trace("sending" if record.sending else "stuck")

    async def resume_backward(self, request: control.ResumeBack) -> bytes:
        """Send a gradient again around ``request.dead``, which acknowledged it and died."""
        record = self.passed.get((request.iteration, request.microbatch))
        if record is None or record.sending or record.sent_to != request.dead:
            return control.encode_reply(False, why="no gradient delivered to that node here")
        record.around.add(request.dead)
        record.sent_to = ""
        self.flow.dispatch(self.flow.node.peer_dead(request.dead, trio.current_time()))
        try:
            record.header = await self._around(record.header, record.around)
            await self.backward(record)
        except (PeerUnavailable, ProtocolError) as exc:
            return control.encode_reply(False, why=str(exc))
        return control.encode_reply(True)

    async def serve_resend(self, to: str, repair: HopHeader, frame: bytes) -> bytes:
        """Answer a ``Resend``: send the buffered forward, flagged as a repair, to ``to``."""
        try:
            await self.plane.send(to, repair, frame)
        except PeerUnavailable as exc:
            return control.encode_reply(False, why=str(exc))
        self.stats.repairs_served += 1
        return control.encode_reply(True)

    async def request_resend(self, header: HopHeader, replacement: str, attempt: int) -> None:
        """Ask the node before the dead hop to re-send its forward output to ``replacement``."""
        before = header.path[header.stage - 1]
        request = control.Resend(header.iteration, header.microbatch_id, replacement, attempt)
        limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 2 * self.plane.ack_deadline_s)
        reply = control.decode_reply(
            await self.plane.rpc.request(
                ID.from_base58(before), control.PROTOCOL_ID, control.encode_request(request), limits
            )
        )
        if not reply["ok"]:
            raise PeerUnavailable(f"{before} could not re-send microbatch {header.microbatch_id}")

    def _record(self, header: HopHeader, to: str, input_digest: bytes, frame: bytes) -> None:
        """Record the hop this node computed, once ``to`` acknowledged its output (``header`` is
        the outgoing one, so this node's stage is one before a forward's, one after a backward's).
        """
        worker_stage = header.stage - 1 if header.direction == FORWARD else header.stage + 1
        self.plane.hop_log.record(
            HopRecord(
                header.iteration,
                header.microbatch_id,
                worker_stage,
                header.direction,
                header.attempt,
                self.plane.node_id,
                to,
                input_digest,
                frame_digest(frame),
                bool(header.flags & FLAG_REPAIR),
            )
        )


@dataclass
class RelayRole:
    worker: StageWorker
    stage: int
    plane: DataPlane
    flow: FlowService
    averager: GradientAverager
    limits: CodecLimits
    nursery: trio.Nursery
    stats: HopStats = field(default_factory=HopStats)
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(1))
    buffers: dict[tuple[int, int], Buffered] = field(default_factory=dict)
    #: Loads the stage's state at a step >= the given one from a live replica (set by the node).
    resync: Callable[[int], Awaitable[None]] | None = None
    resyncing: bool = False
    resync_target: int = 0  # the step the replicas reach after the latest round sat out
    resynced: trio.Event = field(default_factory=trio.Event)  # set when a resync ends

    wiring: SwarmWiring | None = None

    def __post_init__(self) -> None:
        self.sender = HopSender(self.plane, self.flow, self.stats, self.wiring)
        self.plane.compute = self.compute

    async def compute(self, header: HopHeader, frame: bytes) -> None:
        if header.stage != self.stage:
            raise ProtocolError(f"hop for stage {header.stage} sent to a stage {self.stage} relay")
        await self._catch_up(header.iteration)
        tensor = codec.decode(bytearray(frame), self.limits).tensor
        key = (header.iteration, header.microbatch_id)
        if header.direction == FORWARD:
            output = await self._run(self.worker.forward, header.microbatch_id, tensor)
            out_frame = codec.encode(header.microbatch_id, output, self.limits)
            sends_on = not header.flags & FLAG_REPAIR
            self.buffers[key] = Buffered(header, out_frame, sending=sends_on)
            if sends_on:
                self.nursery.start_soon(self._send_forward, header, out_frame, frame_digest(frame))
        else:
            grad = await self._run(self.worker.backward, header.microbatch_id, tensor)
            self.buffers.pop(key, None)
            grad_frame = codec.encode(header.microbatch_id, grad, self.limits)
            onward = header.onward(stage=header.stage - 1, flags=0)
            record = self.sender.pass_back(onward, grad_frame, frame_digest(frame))
            self.nursery.start_soon(self.sender.backward_or_log, record)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await in_worker_thread(self.limiter, fn, *args)

    async def _send_forward(self, received: HopHeader, frame: bytes, input_digest: bytes) -> None:
        upstream = received.path[-1]
        route = self.flow.node.route(upstream, received.slot)
        # Not (yet) a flow of ours: any live next-stage replica will do.
        to = self.sender.next_hop(self.stage + 1, route[0] if route else None)
        slot = route[1] if route and to == route[0] else 0
        buffered = self.buffers.get((received.iteration, received.microbatch_id))
        if to is None:
            if buffered is not None:
                buffered.sending = False
            log.warning(
                "no next hop for microbatch %s; it will be repaired", received.microbatch_id
            )
            return
        header = received.onward(
            stage=self.stage + 1, slot=slot, path=(*received.path, self.plane.node_id), flags=0
        )
        try:
            delivered_to = await self.sender.forward(header, frame, to, input_digest)
        except PeerUnavailable as exc:
            log.warning("microbatch %s stalls here: %s", received.microbatch_id, exc)
            delivered_to = ""
        if buffered is not None:
            buffered.sending, buffered.sent_to = False, delivered_to

    async def handle_resend(self, request: control.Resend) -> bytes:
        """Re-send the buffered forward output: for a backward repair (``Resend``: the receiver
        only recomputes) or a forward repair (``Resume``: the receiver also sends it on)."""
        buffered = self.buffers.get((request.iteration, request.microbatch))
        if buffered is None:
            return control.encode_reply(False, why="no buffered forward for that microbatch")
        resume = isinstance(request, control.Resume)
        header = buffered.header.onward(
            stage=self.stage + 1,
            attempt=request.attempt,
            flags=FLAG_RESUME if resume else FLAG_REPAIR,
            path=(*buffered.header.path, self.plane.node_id),
        )
        reply = await self.sender.serve_resend(request.to, header, buffered.output_frame)
        if resume and control.decode_reply(reply)["ok"]:
            buffered.sending, buffered.sent_to = False, request.to
        return reply

    def trace(self, request: control.Trace) -> bytes:
        """What this relay knows of a microbatch's forward."""
        if self.plane.receiving(request.iteration, request.microbatch, FORWARD):
            return control.encode_trace("queued")
        buffered = self.buffers.get((request.iteration, request.microbatch))
        if buffered is None:
            return control.encode_trace("absent")
        return control.encode_trace(*buffered.trace_state())

    async def _catch_up(self, iteration: int) -> None:
        """Hold a hop of ``iteration`` until this relay's weights are that iteration's (step
        ``iteration``): a hop computed with other weights gives a wrong gradient. A relay behind
        (it joined while its replicas stepped, or sat a round out) loads the replicas' state
        first; its sender waits for the ack meanwhile."""
        if iteration < self.worker.step_count:
            raise Decline(
                f"hop of iteration {iteration}, but this relay has stepped to "
                f"{self.worker.step_count}; send it to a replica still in that iteration"
            )
        if iteration > self.worker.step_count and self.resync is not None:
            self._start_resync(iteration)
        while self.resyncing:
            await self.resynced.wait()
        if iteration != self.worker.step_count:
            raise Decline(
                f"hop of iteration {iteration}, but this relay is at step "
                f"{self.worker.step_count} and could not catch up"
            )

    def _start_resync(self, step: int) -> None:
        self.resync_target = max(self.resync_target, step)
        if self.resync is not None and not self.resyncing:
            self.resyncing, self.resynced = True, trio.Event()
            self.nursery.start_soon(self._resync)

    def _forget_microbatches(self) -> None:
        """The iteration is over: nothing kept for its repairs is needed any more."""
        self.buffers.clear()
        self.sender.passed.clear()

    async def _resync(self) -> None:
        """Load the replicas' state until this relay has caught up with the latest round."""
        assert self.resync is not None
        try:
            while self.worker.step_count < self.resync_target:
                await self.resync(self.resync_target)
        finally:
            self.resyncing = False
            self.resynced.set()

    async def end_iteration(self, iteration: int, replicas: tuple[str, ...]) -> bytes:
        """Average with ``replicas`` (this stage's live replicas), step, report the step."""
        if self.worker.step_count != iteration or self.plane.node_id not in replicas:
            # Left out of this round (joined mid-iteration, or missed a step): sit it out, then
            # load the replicas' state after their step so the next round includes this relay.
            log.warning(
                "stage %s relay at step %s sits out iteration %s (%s); it will resync",
                self.stage,
                self.worker.step_count,
                iteration,
                "not among the replicas" if self.plane.node_id not in replicas else "out of step",
            )
            await self._run(self.worker.discard_gradients)
            await self._run(self.worker.drop_all)
            self._forget_microbatches()
            if self.plane.node_id in replicas:
                # Still hand in an empty share, so the round need not wait for this relay.
                empty = await self._run(self.worker.gradient_share)
                await self.averager.average(self.stage, iteration, empty, replicas)
            self._start_resync(iteration + 1)
            return control.encode_reply(False, why="out of step", step=self.worker.step_count)
        started = trio.current_time()
        share = await self._run(self.worker.gradient_share)
        averaging = trio.current_time()
        result = await self.averager.average(self.stage, iteration, share, replicas)
        self.stats.averaging_s += trio.current_time() - averaging
        if result.combined.microbatch_count > 0:
            await self._run(self.worker.average_gradients, [result.combined])
            await self._run(self.worker.step)
        else:
            await self._run(self.worker.discard_gradients)
            self.worker.step_count += 1  # no stage traffic at all: keep the step count in lockstep
        await self._run(self.worker.drop_all)
        self._forget_microbatches()
        self.stats.ending_s += trio.current_time() - started
        return control.encode_reply(True, step=self.worker.step_count)
