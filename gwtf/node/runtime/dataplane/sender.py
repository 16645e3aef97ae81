"""Sending hops on: forwards re-sent to another replica on a missed ack, gradients kept and
repaired around a dead node.

``HopSender`` is shared by relays and the data node. A forward whose receiver does not
acknowledge it goes to another replica of the next stage. A gradient is kept (``PassedBack``)
until the iteration ends: if its receiver is dead, the node before that one re-sends its buffered
forward output to another replica as a repair, which recomputes that forward and then takes the
gradient; the same happens later on request (``resume_backward``) when the receiver acknowledged
the gradient and died holding it. Every hop is counted once its receiver acknowledged the
output (its receipt, with receipts on, is recorded for a batch in ``DataPlane.send``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import trio

from gwtf.coordinator_free.decisions import (
    Detours,
    Onward,
    hop_view,
    next_hop,
    plan_hop_repair,
    replicas,
    stand_in,
)
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import (
    PeerTimeout,
    PeerUnavailable,
    RequestDeclined,
    RequestMisdirected,
    RequestRefused,
    TooLargeForRelay,
)
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane, HopRecord, WrongAck, sent_hop
from gwtf.node.runtime.dataplane.hop import (
    ATTEMPT_BLOCK,
    BACKWARD,
    FLAG_REDO,
    FLAG_REPAIR,
    HopHeader,
    resend_attempt,
)
from gwtf.node.runtime.flow.routing import SwarmWiring
from gwtf.node.runtime.flow.service import FlowService

log = logging.getLogger(__name__)


class StageOf(Protocol):
    """The stage a peer serves as this node knows it (0: a data node), None when it does not
    know. Does not block or raise."""

    def __call__(self, peer: str, /) -> int | None: ...


class FlowRoute(Protocol):
    """A flow's route as the flow core holds it now: the next hop and this node's slot, or
    None when the flow has none (being rebuilt, or off a flow). Read at each re-send, so it
    follows the core; does not block or raise."""

    def __call__(self) -> tuple[str, int] | None: ...


@dataclass
class PassedBack:
    """A gradient a node computed and sent on, kept until the iteration ends."""

    header: HopHeader  # the outgoing backward (its path names the node it goes to)
    frame: bytes
    input_digest: bytes | None  # None: sent unreceipted (``RelayRole._backward_receipted``)
    sending: bool = False
    sent_to: str = ""  # the node that acknowledged it
    around: set[str] = field(default_factory=set)  # dead nodes it was re-sent around
    recorded: bool = False  # counted (once, however often it is sent)


@dataclass
class HopStats:
    forward_resends: int = 0
    backward_repairs: int = 0
    forward_repairs: int = 0  # a data node: stalled forwards resumed at the lost hop
    gradient_resumes: int = 0  # a data node: lost gradients sent again around the dead hop
    repairs_served: int = 0
    stages_not_stepped: int = 0  # a data node: (iteration, stage) pairs with no replica stepping
    taken_back_in: int = 0  # a data node: times it was left out while alive and asked back in
    microbatches_on_loans: int = 0  # a data node: started on a flow another data node lent it
    # A data node: (microbatch, stage) gradients a dead replica held, redone on a live one;
    # lost all the same (no live replica, or the redo failed); held by two replicas (counted
    # twice in the average: no holder could drop its sum); relays' sums dropped for one held
    # twice (their other microbatches redone).
    gradients_redone: int = 0
    gradients_lost: int = 0
    gradients_duplicated: int = 0
    gradient_sums_dropped: int = 0
    microbatches_redone: int = 0  # a data node: microbatches with a stage's gradient redone
    cut_sends: int = 0  # hop sends that failed to a peer that then answered a probe: not dead
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
        self.detours = Detours()  # forwards in flight off a flow, by peer: ``next_hop`` ranks
        # The stage of a peer's signed card that discovery verified and holds, None without
        # one (``AddressBook.stage_of``, set once the node's book exists): the stages two
        # away from this node's are no flow neighbours, yet their nodes ask for re-sends.
        self.carded_stage: StageOf = lambda _peer: None
        self.probes = PeerProbes(plane, flow)  # peers probed after a cut send: set aside

    def next_hop(
        self, stage: int, route: tuple[str, int] | None, origin: str | None = None
    ) -> str | None:
        """Where a forward into ``stage`` goes: past the last stage its ``origin``, else the
        flow's next hop (``route``: it and this node's slot) else the ranked best next-stage
        peer (``decisions.next_hop``, as in the simulator), or SWARM's weighted draw; with
        receipts on, a peer that withheld a countersignature this iteration only when no
        other can take it (the training goes on, that hop unpaid)."""
        if self.wiring is not None and (origin is None or stage <= self.plane.stages):
            wanted = 0 if stage > self.plane.stages else stage
            alive = [p.peer_id for p in self.flow.node.alive_peers(wanted)]
            return self.wiring.choose(self._set_aside(alive, stage))
        onward = self._next_hop(route, (), origin, stage)
        return None if onward is None else onward.to

    def _next_hop(
        self,
        route: tuple[str, int] | None,
        tried: Collection[str],
        origin: str | None,
        stage: int,
    ) -> Onward | None:
        """``decisions.next_hop`` into ``stage`` with ``tried`` left out, and the peers being
        probed after a cut send (``PeerProbes``) or, with receipts on, that withheld a batch's
        countersignature this iteration (their hops would go unpaid) too unless no other is
        left: one whose dial hangs would hold the hop for the probe's deadline."""
        book = self.plane.receipts
        if book is not None and stage <= self.plane.stages:  # not the sink, a data node
            may_send = book.withholders.may_send
            stopped = () if route is None or may_send(route[0]) else (route[0],)
            view = hop_view(self.flow.node, route, may_send, self.detours, origin)
            onward = next_hop(view, {*tried, *stopped, *self.probes.probing})
            if onward is not None:
                return onward
        probing = self.probes.probing
        if probing:
            view = hop_view(self.flow.node, route, detours=self.detours, origin=origin)
            onward = next_hop(view, {*tried, *probing})
            if onward is not None:
                return onward
        view = hop_view(self.flow.node, route, detours=self.detours, origin=origin)
        return next_hop(view, tried)

    async def send_forward(
        self,
        header: HopHeader,
        frame: bytes,
        to: str,
        input_digest: bytes,
        route: FlowRoute = lambda: None,
    ) -> str:
        """Send a forward; on a missed ack re-send it where ``decisions.next_hop`` says now
        (``route``: the flow's route as the core holds it now), the peers tried left out.
        Returns the node that acknowledged it. A peer whose send was cut is probed meanwhile
        (``_failed``): the re-send, which leaves it out, does not wait for the answer; the
        return (or the failure) does, so the verdict lands (at most the probe's deadline)."""
        async with trio.open_nursery() as probes:
            try:
                return await self._send_forward(probes, header, frame, to, input_digest, route)
            except Exception as exc:
                # Raised outside the nursery: inside, it would cancel the probes and come out
                # wrapped in an exception group that callers catching it would not match.
                failure = exc
        raise failure

    async def _send_forward(
        self,
        probes: trio.Nursery,
        header: HopHeader,
        frame: bytes,
        to: str,
        input_digest: bytes,
        route: FlowRoute,
    ) -> str:
        tried: set[str] = set()
        while True:
            try:
                sent_at = trio.current_time()
                with self.detour(header.stage, to, route()):
                    output_digest = await self.plane.send(to, header, frame, input_digest)
                if self.wiring is not None:
                    self.wiring.observe(to, trio.current_time() - sent_at)
                self._acknowledged(to)
                self._record(header, to, input_digest, output_digest)
                return to
            except PeerUnavailable as exc:
                log.log(
                    _level(exc),
                    "forward of microbatch %s to %s failed: %s",
                    header.microbatch_id,
                    to,
                    exc,
                )
                tried.add(to)
                probes.start_soon(self._failed, to, exc)
                # None past the last stage: only the origin computes its microbatch's loss.
                onward = self.resend_to(header.stage, route(), tried, header.origin)
                if onward is None:
                    raise
                self.stats.forward_resends += 1
                to = onward.to
                header = header.onward(
                    attempt=_next_attempt(header.attempt),
                    slot=header.slot if onward.slot is None else onward.slot,
                )

    def resend_to(
        self, stage: int, route: tuple[str, int] | None, tried: set[str], origin: str
    ) -> Onward | None:
        """Where a forward into ``stage`` goes again after ``tried`` missed it (past the last
        stage: ``origin`` alone, so None once it missed)."""
        if stage > self.plane.stages:
            return None if origin in tried else Onward(origin, None)
        if self.wiring is not None:  # SWARM's re-send: any other live replica
            chosen = self.stand_in(stage, tried)
            return None if chosen is None else Onward(chosen, None)
        return self._next_hop(route, tried, origin, stage)

    @contextmanager
    def detour(self, stage: int, to: str, route: tuple[str, int] | None) -> Iterator[None]:
        """Count a forward into ``stage`` as a detour in flight to ``to`` while it is being
        sent, if it leaves the flow (``route``: the flow's route as it stands); it ends with the
        send (acknowledged, failed or given up). The sink's origin and SWARM's draws are none."""
        off_flow = route is None or route[0] != to
        if self.wiring is not None or stage > self.plane.stages or not off_flow:
            yield
            return
        key = object()  # this one send
        self.detours.sent(key, to)
        try:
            yield
        finally:
            self.detours.ended(key)

    async def _failed(self, to: str, exc: PeerUnavailable) -> None:
        """Tell the flow core of a peer that failed a hop, if it is dead: one that declined the
        hop is alive; one that missed the ack deadline, or is not at the hop's stage (it moved;
        dropped there until heard of again), or refused the hop, or acknowledged another hop
        counts dead. A failure that may have left the peer alive (``may_be_cut``) counts dead
        only if it misses a probe too (``peer_answers``): a peer declared dead has every flow
        through it torn down."""
        if isinstance(exc, RequestDeclined) and not isinstance(exc, RequestMisdirected):
            return
        if may_be_cut(exc) and await self.probes.answers(to):
            self.stats.cut_sends += 1
            log.warning("hop to %s was cut (%s), but %s answers: still alive", to, exc, to)
            self.flow.node.heard_from(to, trio.current_time())
            return
        self.flow.dispatch(self.flow.node.peer_dead(to, trio.current_time()))

    def stand_in(self, stage: int, exclude: set[str]) -> str | None:
        """A live node of ``stage`` (the sink stage is S+1, data nodes) not in ``exclude`` to
        recompute a dead hop (``decisions.stand_in``: at random, from the flow core's seeded
        generator, so repairs spread over the replicas instead of piling onto the first)."""
        wanted = 0 if stage > self.plane.stages else stage
        candidates = [peer for peer in replicas(self.flow.node, wanted) if peer not in exclude]
        return stand_in(self._set_aside(candidates, stage), exclude, self.flow.node.rng)

    def _set_aside(self, peers: list[str], stage: int) -> list[str]:
        """``peers`` but those being probed and, with receipts on, those that withheld a
        batch's countersignature this iteration (their hops would go unpaid), unless that
        leaves none: SWARM's draws and stand-ins skip them as ``_next_hop`` does."""
        book = self.plane.receipts
        if book is not None and stage <= self.plane.stages:  # not the sink, a data node
            may_send = book.withholders.may_send
            kept = [peer for peer in peers if may_send(peer)]
            if kept:
                return _set_aside(kept, self.probes.probing)
        return _set_aside(peers, self.probes.probing)

    def pass_back(self, header: HopHeader, frame: bytes, input_digest: bytes | None) -> PassedBack:
        """Keep a gradient this node computed (``header`` is the outgoing backward) until the
        iteration ends: if the node it goes to dies holding it, this node sends it again."""
        record = PassedBack(header, frame, input_digest)
        self.passed[(header.iteration, header.microbatch_id)] = record
        return record

    async def send_backward(self, record: PassedBack) -> None:
        """Send a kept gradient to ``path[stage]``; if that node is dead, repair the hop around
        it and send there. ``record`` ends up naming the node that acknowledged it."""
        header, tried = record.header, set(record.around)
        record.sending = True
        try:
            while True:
                to = header.path[header.stage]
                try:
                    output_digest = await self.plane.send(
                        to, header, record.frame, record.input_digest
                    )
                except PeerUnavailable as exc:
                    if header.stage == 0:
                        raise  # the origin holds the iteration; nobody can stand in for it
                    log.log(
                        _level(exc),
                        "backward of microbatch %s to %s failed: %s",
                        header.microbatch_id,
                        to,
                        exc,
                    )
                    tried.add(to)
                    await self._failed(to, exc)
                    header = await self._around(header, tried)
                    continue
                self._acknowledged(to)
                if not record.recorded:  # a gradient sent again is the same work, counted once
                    self._record(header, to, record.input_digest or b"", output_digest)
                    record.recorded = True
                record.header, record.sent_to = header, to
                return
        finally:
            record.sending = False

    async def _around(self, header: HopHeader, dead: set[str]) -> HopHeader:
        """Repair a backward hop whose node is dead: the node before it re-sends its forward
        output to another replica of the dead node's stage; returns the backward to send there."""
        tried = set(dead)
        while True:
            repair = plan_hop_repair(
                header.path, header.stage, lambda stage, _dead: self.stand_in(stage, tried)
            )
            if repair is None:
                raise PeerUnavailable(f"no live replica of stage {header.stage} left")
            attempt = _next_attempt(header.attempt)
            try:
                await self.request_resend(header, repair.replacement, attempt)
            except PeerUnavailable as exc:
                # This node's view of the stage may be stale (a replica that died unseen):
                # try the next one; the attempt number is spent either way.
                log.warning("%s could not stand in for a dead hop: %s", repair.replacement, exc)
                tried.add(repair.replacement)
                header = header.onward(attempt=attempt)
                continue
            self.stats.backward_repairs += 1
            path = list(header.path)
            path[header.stage] = repair.replacement
            return header.onward(path=tuple(path), attempt=attempt)

    async def send_backward_or_log(self, record: PassedBack) -> None:
        """``backward`` as a background task: a gradient that cannot be delivered is logged (the
        origin's trace of the stalled microbatch finds it here, stuck)."""
        try:
            await self.send_backward(record)
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
        except (PeerUnavailable, ProtocolError) as exc:
            record.sent_to = request.dead  # unchanged: the next trace may ask again
            return control.encode_reply(False, why=str(exc))
        try:
            await self.send_backward(record)
        except (PeerUnavailable, ProtocolError) as exc:
            return control.encode_reply(False, why=str(exc))
        return control.encode_reply(True)

    async def redo_backward(self, asker: str, request: control.RedoBack) -> bytes:
        """Send the gradient kept of a microbatch to ``request.to`` as a redo, when its origin
        (``asker``) asks: it stands in for a dead replica of the stage before this node's."""
        record = self.passed.get((request.iteration, request.microbatch))
        if record is None:
            return control.encode_reply(False, why="no gradient of that microbatch kept here")
        if record.header.origin != asker:
            raise ProtocolError(f"peer {asker} asks for a redo of a microbatch not its own")
        path = list(record.header.path)
        path[record.header.stage] = request.to
        redo = record.header.onward(path=tuple(path), attempt=request.attempt, flags=FLAG_REDO)
        try:
            # Receipted again (the same computation: paid once) in case its first send's
            # receipt was never countersigned; the replica signs its own in the ack.
            await self.plane.send(request.to, redo, record.frame, record.input_digest)
        except PeerUnavailable as exc:
            return control.encode_reply(False, why=str(exc))
        return control.encode_reply(True)

    async def serve_resend(
        self, to: str, repair: HopHeader, frame: bytes, input_digest: bytes
    ) -> bytes:
        """Answer a ``Resend``: send the buffered forward, flagged as a repair, to ``to``.
        It is receipted again under the repair's attempt (the same computation, from the same
        input: certified once), so a forward whose first send was never acknowledged is paid
        and the chain goes on through it; a data node's (``input_digest`` b"") is its own."""
        try:
            await self.plane.send(to, repair, frame, input_digest)
        except PeerUnavailable as exc:
            return control.encode_reply(False, why=str(exc))
        self.stats.repairs_served += 1
        return control.encode_reply(True)

    async def request_resend(self, header: HopHeader, replacement: str, attempt: int) -> None:
        """Ask the node before the dead hop to re-send its forward output to ``replacement``."""
        before = header.path[header.stage - 1]
        request = control.Resend(header.iteration, header.microbatch_id, replacement, attempt)
        # The re-send is one send: its stream opened, then acknowledged; and the ask's own
        # round trip.
        timeout_s = self.plane.open_deadline_s + 2 * self.plane.ack_deadline_s
        reply = control.decode_reply(await control.ask(self.plane.rpc, before, request, timeout_s))
        if not reply["ok"]:
            raise PeerUnavailable(f"{before} could not re-send microbatch {header.microbatch_id}")

    def stage_of(self, peer: str) -> int | None:
        """The stage this node believes ``peer`` serves (0: a data node), None if unknown: the
        flow core's, for a neighbour, else the one its signed card names. Never a stage the
        peer states in a request: a node off the path could then name itself the asker."""
        known = self.flow.node.peers.get(peer)
        return self.carded_stage(peer) if known is None else known.stage

    def _acknowledged(self, peer: str) -> None:
        """An acknowledged hop proves ``peer`` alive: the core's keep-alives need not ping it."""
        self.flow.node.heard_from(peer, trio.current_time())

    def _record(
        self, header: HopHeader, to: str, input_digest: bytes, output_digest: bytes
    ) -> None:
        """Count the hop this node computed, once ``to`` acknowledged its output (``header`` is
        the outgoing one, so this node's stage is one before a forward's, one after a backward's).
        """
        hop = sent_hop(header, self.plane.node_id, to, input_digest, output_digest)
        self.plane.hops.record(HopRecord(hop, repair=bool(header.flags & FLAG_REPAIR)))


def resend_refusal(
    asker: str,
    request: control.Resend,
    forward: HopHeader,
    holder_stage: int,
    stages: int,
    stage_of: StageOf,
) -> str | None:
    """Why a node of ``holder_stage`` (0: the microbatch's origin) that holds the output of
    ``forward`` (the forward it received, or the origin's first hop) will not re-send it as
    ``asker`` asks, or None when it will.

    A re-send is receipted and chains through this node's output, so a node off the path must
    not be able to ask for one to itself (it would be paid for every microbatch, and push the
    path's own relay out of a hop's certificate). Only two nodes ask: the microbatch's origin,
    for a repair of its own (a new block of attempts it hands out, ``origin_attempt``), and
    the node after the dead hop on the recorded path (``HopSender._around``: a replica of the
    stage after the dead one, or the origin as the sink), with the next attempt inside the
    block the forward carried. Either way the output goes to a replica of the stage after this
    node (or to the origin as the sink). A stage the origin names that this node has not heard
    of is taken on the origin's word (its roster knows more relays than this node's view)."""
    origin, wanted = forward.origin, holder_stage + 1
    if request.attempt < forward.try_start:
        # The re-send carries the forward's try token, which names a later start: no receiver
        # takes it, and this node's data plane does not send it.
        return f"attempt {request.attempt} is below its forward's try ({forward.try_start})"
    block = forward.attempt // ATTEMPT_BLOCK
    in_block = request.attempt // ATTEMPT_BLOCK == block and request.attempt > forward.attempt
    if asker == origin:
        if request.attempt % ATTEMPT_BLOCK == 0 and request.attempt // ATTEMPT_BLOCK == block:
            return f"attempt {request.attempt} is the forward's own, not a repair's"
        if request.attempt % ATTEMPT_BLOCK and not in_block:
            return f"attempt {request.attempt} is outside the forward's block of attempts"
    else:
        if wanted + 1 > stages or stage_of(asker) != wanted + 1:  # past stage S: the origin
            return f"{asker} is neither the origin nor a node of stage {wanted + 1}"
        if not in_block:
            return f"attempt {request.attempt} is outside the forward's block of attempts"
    if wanted > stages:
        return None if request.to == origin else "only the origin computes the loss"
    stage = stage_of(request.to)
    if stage != wanted and not (asker == origin and stage is None):
        return f"{request.to} is not a replica of stage {wanted}"
    return None


def _set_aside(peers: list[str], probing: Collection[str]) -> list[str]:
    """``peers`` but those being probed, unless that leaves none."""
    left = [peer for peer in peers if peer not in probing]
    return left or peers


def _next_attempt(attempt: int) -> int:
    """``resend_attempt``, as a failure of the send (callers give the hop up, logged)."""
    try:
        return resend_attempt(attempt)
    except ProtocolError as exc:
        raise PeerUnavailable(str(exc)) from exc


def _level(exc: PeerUnavailable) -> int:
    """A hop too large for the relay to its peer was logged, once, where it was refused: its
    repair goes on quietly (it is not retried to that peer)."""
    return logging.DEBUG if isinstance(exc, TooLargeForRelay) else logging.WARNING


def may_be_cut(exc: ProtocolError) -> bool:
    """Whether a failed request may have left its peer alive: the stream reset or closed under
    it (as when the circuit it ran on closes), or a dial failed. Not a missed deadline, nor an
    answer (a refusal, a decline, a reply out of bounds, another hop's ack): those say what the
    peer is."""
    answered = PeerTimeout | RequestDeclined | RequestRefused | WrongAck
    return isinstance(exc, PeerUnavailable) and not isinstance(exc, answered)


async def peer_answers(plane: DataPlane, flow: FlowService, peer: str) -> bool:
    """Whether ``peer`` answers a liveness probe (``control.Alive``, on a stream of its own,
    dialled anew if the connection is gone) within the flow protocol's keep-alive timeout: what
    that protocol waits for a ping's answer before it counts a miss.

    The probe follows a send cut by a connection closing, and the control stream kept open to
    the peer ran on that connection: until its reader sees the close, a request on it fails as
    cut too. So a probe cut that way is asked once more, within the same deadline: the broken
    stream is dropped then, and the second goes on a new one (a new connection if need be)."""
    deadline = trio.current_time() + flow.node.config.keepalive_timeout_s
    for attempt in range(2):
        try:
            left_s = max(deadline - trio.current_time(), 1e-3)
            await control.ask(plane.rpc, peer, control.Alive(), left_s)
        except ProtocolError as exc:
            if attempt == 0 and may_be_cut(exc):
                log.debug("probe of %s cut (%s): asking on a new stream", peer, exc)
                continue
            log.info("%s missed a liveness probe after a failed hop: %s", peer, exc)
            return False
        return True
    return False  # not reached: the second try returns


@dataclass
class _Probe:
    done: trio.Event = field(default_factory=trio.Event)
    answered: bool | None = None  # None: its prober was cancelled before the answer


class PeerProbes:
    """``peer_answers`` after a cut send or trace, one probe per peer at a time: N sends cut
    at once (one connection closing under them) make one probe, the others await its answer.
    A peer being probed is set aside when a next hop or a stand-in is chosen (``probing``)."""

    def __init__(self, plane: DataPlane, flow: FlowService) -> None:
        self.plane, self.flow = plane, flow
        self._running: dict[str, _Probe] = {}

    @property
    def probing(self) -> Collection[str]:
        return self._running.keys()

    async def answers(self, peer: str) -> bool:
        while (running := self._running.get(peer)) is not None:
            await running.done.wait()
            if running.answered is not None:
                return running.answered
        probe = self._running[peer] = _Probe()
        try:
            probe.answered = await peer_answers(self.plane, self.flow, peer)
        finally:
            del self._running[peer]
            probe.done.set()
        return probe.answered
