"""A relay on the live network: computes its stage for whatever the flow protocol sends it.

Forward: compute, keep the input and output until the backward comes, send the output to the next
hop that the flow table maps the incoming flow to (another next-stage replica if that one does not
acknowledge). A forward of a microbatch held from another input replaces it only after a restart
its origin confirms (``held_forward.py``). Backward: compute, send the gradient to the previous
node of the recorded path, repairing that hop if the node is dead (``hop_sender.py``). Answers
traces and re-send requests for what it keeps (each forward's output and each gradient sent, until
the next iteration's first hop: another stage may still redo from them after this one stepped), and
takes part in redoing the gradients a dead replica of its stage held (``gradient_redo.py``). A hop
of a later iteration than its weights' is held while the relay loads its replicas' state; one it
cannot compute with the right weights is declined. End of iteration: average with the stage's live
replicas and step, unless the round missed a replica holding gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Protocol

import torch
import trio

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import Decline, NotHere, PeerUnavailable
from gwtf.node.receipts.cheats import Distort
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.compute import T, in_worker_thread
from gwtf.node.runtime.dataplane.exchange import DataPlane, Kept
from gwtf.node.runtime.dataplane.hop import (
    FLAG_REDO,
    FLAG_REPAIR,
    FLAG_RESUME,
    FORWARD,
    HopHeader,
    frame_digest,
)
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats, PassedBack, resend_refusal
from gwtf.node.runtime.flow.routing import SwarmWiring
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.replicas.averaging import GradientAverager, RoundCutOff
from gwtf.node.runtime.roles.held_forward import ask_current_try, check_second_forward
from gwtf.node.runtime.roles.sealed_backwards import MAX_ORIGINS, SealedBackwards
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import holds_state_of, snapshot_part_state
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.stage_worker import StageWorker

log = logging.getLogger(__name__)


@dataclass
class Buffered:
    """What a relay keeps of a microbatch's forward until the iteration ends."""

    header: HopHeader  # the forward hop as received
    output_frame: bytes
    input_digest: bytes  # of the frame it was computed from (its receipt's, when re-sent)
    sending: bool = False  # the output is on its way to the next hop
    sent_to: str = ""  # the next hop that acknowledged the output

    def trace_state(self) -> tuple[str, str]:
        """This forward's state for a ``Trace`` (see ``control.TRACE_STATES``)."""
        if self.header.flags & FLAG_REPAIR:
            return "held", ""
        if self.sent_to:
            return "sent", self.sent_to
        return ("sending" if self.sending else "stuck"), ""


class Resync(Protocol):
    """Load this stage's state at a step at least ``min_step`` from a live replica into the
    worker. Blocks for the transfer, within a deadline of its own; raises ``trio.TooSlowError``
    or ``ProtocolError`` when no replica gave it (the relay then goes on from its own state)."""

    async def __call__(self, min_step: int, /) -> None: ...


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
    resync: Resync | None = None
    resyncing: bool = False
    resync_target: int = 0  # the step the replicas reach after the latest round sat out
    resynced: trio.Event = field(default_factory=trio.Event)  # set when a resync ends

    wiring: SwarmWiring | None = None
    #: Keeps each hop's frames and each iteration's state for auditors (None: keeps nothing).
    evidence: EvidenceArchive | None = None
    #: What a ``wrong-tensor`` cheat makes of each forward output (None: honest).
    distort: Distort | None = None
    _ending: trio.Lock = field(default_factory=trio.Lock)
    #: The latest end asked: iteration, attempt, reply, and whether the relay stepped.
    _ended: tuple[int, int, bytes, bool] = (-1, -1, b"", False)
    _kept_from: int = -1  # what is kept for repairs is of this iteration or later
    _closing: int = -1  # the latest iteration whose end began: its hops are computed no more
    _reopened: int = -1  # ... except the redo hops of this one, whose round missed a holder
    #: (epoch, iteration) -> the weights' version when their kept state was last checked, and
    #: whether it is these weights (``_keep_state``).
    _kept: dict[tuple[int, int], tuple[tuple[int, ...], bool]] = field(default_factory=dict)
    #: (iteration, microbatch) -> the node its origin said a redone gradient comes from.
    _redo_from: dict[tuple[int, int], str] = field(default_factory=dict)
    _discarded: int = -1  # the latest iteration whose gradient was dropped (``discard``)
    #: (iteration, microbatch, input digest) of a forward its origin let replace the held one
    #: -> the held input it may replace (``_admit``; taken by ``_check_held``).
    _admitted: dict[tuple[int, int, bytes], bytes] = field(default_factory=dict)
    #: The microbatches whose ``Holds`` their origin was answered: done at the origin, so a
    #: backward of one arriving later is a copy (a repair around a hop whose ack was lost) and
    #: is declined, not added to the answered sum.
    _sealed: SealedBackwards = field(default_factory=SealedBackwards)
    _unsealed_warned: set[str] = field(default_factory=set)  # causes warned of (``_unsealed``)

    def __post_init__(self) -> None:
        self.sender = HopSender(self.plane, self.flow, self.stats, self.wiring)
        self.plane.compute = self.compute
        self.plane.admit = self._admit

    async def compute(self, header: HopHeader, frame: bytes) -> Kept | None:
        """Compute a hop; the output when this relay keeps it rather than sending it on (a
        repair's forward, a redone gradient): its receipt is signed in the ack."""
        if header.stage != self.stage:  # a sender that has not heard of a move yet
            raise NotHere(f"hop for stage {header.stage} sent to a stage {self.stage} relay")
        await self._check_in_step(header.iteration)
        self._forget_microbatches(before=header.iteration)
        tensor = codec.decode(bytearray(frame), self.limits).tensor
        key = (header.iteration, header.microbatch_id)
        if header.direction == FORWARD:
            # The input's digest, hashed once for all that name it: the held forward, the
            # kept frame, the receipt of the hop sent on.
            digest = frame_digest(frame)
            self._check_held(header, key, digest)
            out_frame: bytes = await self._run(
                self._in_step, header, self._forward, header, frame, tensor, digest
            )
            sends_on = not header.flags & FLAG_REPAIR
            self.buffers[key] = Buffered(header, out_frame, digest, sending=sends_on)
            if not sends_on:  # signed in the ack: only once its weights are kept (or never)
                return Kept(out_frame, await self._state_kept(header))
            self.nursery.start_soon(self._send_forward, header, out_frame, digest)
            return None
        else:
            redo = bool(header.flags & FLAG_REDO)
            if redo:
                self._check_redo(header)
            elif self._sealed_against(header):
                raise Decline(self._sealed_why(header))
            elif key in self.sender.passed:
                self._pass_on_again(header)
                return None
            # The input's digest, hashed at most once: for the kept frame, and for the record
            # and receipt of the gradient sent on.
            input_digest = frame_digest(frame) if self.evidence is not None else None
            grad_frame: bytes = await self._run(
                self._in_step, header, self._backward, header, frame, tensor, input_digest
            )
            receipted = self._backward_receipted(key)
            if redo:  # signed in the ack: only once the weights it was computed with are kept
                receipted = receipted and await self._state_kept(header)
            if receipted and input_digest is None:
                input_digest = frame_digest(frame)
            onward = header.onward(stage=header.stage - 1, flags=0)
            record = self.sender.pass_back(onward, grad_frame, input_digest if receipted else None)
            if redo:  # a redone gradient is kept for the stage before's redo, if any
                return Kept(grad_frame, receipted)
            self.nursery.start_soon(self._send_backward, header, record)
            return None

    async def _admit(self, header: HopHeader, frame: bytes) -> None:
        """Before a forward joins the compute queue: one of a microbatch held here from another
        input asks its origin (``held_forward.py``) in the request's own task, so the answer
        holds up no other hop; a forward it may replace the held one with is noted."""
        key = (header.iteration, header.microbatch_id)
        held = self.buffers.get(key)
        if header.direction != FORWARD or header.stage != self.stage or held is None:
            return
        digest = frame_digest(frame)

        async def ask_try(origin: str, iteration: int, microbatch: int) -> tuple[int, int] | None:
            timeout_s = self.plane.ack_deadline_s / 4
            return await ask_current_try(self.plane.rpc, origin, iteration, microbatch, timeout_s)

        await check_second_forward(held.header, held.input_digest, header, digest, ask_try)
        if digest != held.input_digest:
            self._admitted[(*key, digest)] = held.input_digest

    def _check_held(self, header: HopHeader, key: tuple[int, int], digest: bytes) -> None:
        """A forward of a microbatch held here from another input (``digest``) replaces it
        only when ``_admit`` let it replace that very input: its real gradient goes through the
        held activations. One that met another held forward by its turn is declined."""
        held = self.buffers.get(key)
        admitted = self._admitted.pop((*key, digest), None)
        if held is None or held.input_digest == digest or admitted == held.input_digest:
            return
        raise Decline(
            f"microbatch {header.microbatch_id}'s forward is held here from another input, and "
            "its origin has not started it again since; send it to another replica"
        )

    def _backward_receipted(self, key: tuple[int, int]) -> bool:
        """Whether this relay records the receipt of a microbatch's backward: only when it
        recorded the receipt of the forward it goes through (the one held, whose activations
        are saved) from that very input (``DataPlane.backward_after``): a juror replays the
        backward with it, so the backward joins a batch only once that forward's has been
        countersigned."""
        buffered = self.buffers.get(key)
        if buffered is None or self.plane.receipts is None:
            return buffered is not None
        return self.plane.backward_after(buffered.header, self.stage, buffered.input_digest)

    def _pass_on_again(self, header: HopHeader) -> None:
        """A second backward of a microbatch whose gradient this relay computed and passed on
        already: a repair of a hop that was delivered after all (its ack was lost), or a
        restart. Computing it again would count its gradient twice here, and a repair around
        this relay would count it twice at another replica; the gradient kept is the one it
        would compute (the same weights and microbatch), so it goes on along the new path."""
        kept = self.sender.passed[(header.iteration, header.microbatch_id)]
        onward = header.onward(stage=header.stage - 1, flags=0)
        record = self.sender.pass_back(onward, kept.frame, kept.input_digest)
        record.recorded = True  # the same work, counted once
        log.info(
            "gradient of microbatch %s passed on here already; sending it on again, not "
            "computing it twice",
            header.microbatch_id,
        )
        self.nursery.start_soon(self._send_backward, header, record)

    async def _send_backward(self, received: HopHeader, record: PassedBack) -> None:
        if await self._state_kept(received):
            await self.sender.send_backward_or_log(record)

    def _check_redo(self, header: HopHeader) -> None:
        """A redone gradient is taken once, from the node the microbatch's origin named, and
        never for a microbatch whose gradient this relay holds already (it would count twice)."""
        key = (header.iteration, header.microbatch_id)
        if self._redo_from.pop(key, None) != header.path[header.stage + 1]:
            raise ProtocolError(f"redone gradient of microbatch {key[1]} nobody announced")
        if header.microbatch_id in self.worker.accumulated:
            raise Decline(f"the gradient of microbatch {key[1]} is held here already")

    def expect_redo(self, asker: str, request: control.ExpectRedo) -> bytes:
        """Accept a redone gradient from ``request.sender``, if the microbatch's origin asks
        and this relay holds the microbatch's forward."""
        key = (request.iteration, request.microbatch)
        buffered = self.buffers.get(key)
        if buffered is None:
            return control.encode_reply(False, why="no forward of that microbatch held here")
        if buffered.header.origin != asker:
            raise ProtocolError(f"peer {asker} announces a redo of a microbatch not its own")
        self._redo_from[key] = request.sender
        return control.encode_reply(True)

    async def holds(
        self, request: control.Holds, asker: str = "", asker_stage: int | None = 0
    ) -> bytes:
        """Which of the asked microbatches this relay's accumulated gradient holds (read in the
        compute thread, which adds to it), once the backwards of that iteration that are here
        are computed (waiting at most an ack deadline, well within the asker's): a slow
        replica whose backward was repaired onto another still adds it to its sum, and
        answered without it the duplicate would go unseen. Asked by their origin (``asker``,
        whose signed card says stage 0: a data node asks once every microbatch of its share is
        done), the answer is final: a backward of them that arrives later is a copy and is
        declined (``_sealed_against``), or it would count twice in the sum unseen."""
        with trio.move_on_after(self.plane.ack_deadline_s):
            while self.plane.backwards_here(request.iteration):
                await trio.sleep(0.01)

        end = request.first + request.count
        if asker and asker_stage is None:
            self._unsealed("no signed card of the asker is known here", request, asker)
        elif asker and asker_stage == 0:
            # Sealed before the answer is read in the compute thread: a backward computed
            # there before is in the answer, one after checks the seal first (``_backward``).
            step = self.worker.step_count
            sealed = self._sealed.seal(request.iteration, asker, request.first, end, step)
            if not sealed and self._sealed.full(request.iteration, asker):
                why = f"more than {MAX_ORIGINS} data nodes asked holds of the iteration"
                self._unsealed(why, request, asker)

        def held() -> list[int]:
            if self.worker.step_count != request.iteration or self.resyncing:
                return []
            return sorted(m - request.first for m in self.worker.accumulated
                          if request.first <= m < end)  # fmt: skip

        offsets = await self._run(held)
        step = self.worker.step_count
        return control.encode_reply(True, stage=self.stage, step=step, held=offsets)

    def _unsealed(self, why: str, request: control.Holds, asker: str) -> None:
        """Warn, once per cause, that an answer to ``Holds`` seals nothing: a late copy of a
        backward of those microbatches would then count twice in the stage's sum, unseen."""
        if why in self._unsealed_warned:
            return
        self._unsealed_warned.add(why)
        log.warning(
            "holds of iteration %s from %s seal nothing (%s): a late copy of a backward of "
            "its microbatches would count twice in this stage's gradient (warned once)",
            request.iteration,
            asker,
            why,
        )

    def _sealed_against(self, header: HopHeader) -> bool:
        """Whether a backward's origin was answered ``Holds`` for its microbatch already."""
        return self._sealed.covers(header.iteration, header.origin, header.microbatch_id)

    def _sealed_why(self, header: HopHeader) -> str:
        return (
            f"microbatch {header.microbatch_id} is done at its origin (its holds answered): a "
            "late copy of its backward is not added to the gradient"
        )

    async def forget(self, asker: str, request: control.Forget) -> bytes:
        """A data node resumed from its resume point trains ``request.iteration`` again: drop
        the gradients and kept forwards of it, and reopen it if its end had begun (a round
        that stepped nothing). Only when everything held of it is the asker's (the gradient
        is one sum: another origin's share could not be taken out), and only while this relay
        is at that step and no end is under way."""
        iteration = request.iteration
        # The asker trains the iteration again, its microbatches not done yet: lifted on
        # arrival, as an end under way may hold the relay past the asker's deadline.
        self._sealed.lift(iteration, asker)
        async with self._ending:
            held = {k[1]: b.header.origin for k, b in self.buffers.items() if k[0] == iteration}
            mine = {microbatch for microbatch, origin in held.items() if origin == asker}
            if not held and self._closing < iteration:
                # Nothing of it held and no end begun: nothing to drop, nothing to reopen.
                return control.encode_reply(False, why="nothing held", step=self.worker.step_count)

            def drop() -> bool:
                # In the compute thread, which alone adds to the gradient.
                if self.worker.step_count != iteration or self.resyncing:
                    return False
                if len(mine) < len(held) or not self.worker.accumulated <= mine:
                    return False
                self.worker.discard_gradients()
                self.worker.drop_all()
                return True

            dropped = await self._run(drop)
            if dropped:
                for kept in (self.buffers, self.sender.passed, self._redo_from):
                    for key in [key for key in kept if key[0] == iteration]:
                        del kept[key]
                self._closing, self._reopened = min(self._closing, iteration - 1), -1
                if self._ended[0] == iteration:
                    self._ended = (-1, -1, b"", False)
        return control.encode_reply(dropped, step=self.worker.step_count)

    async def discard(self, asker: str, request: control.Discard) -> bytes:
        """Drop the gradient accumulated of ``request.iteration``: another replica of this
        stage holds one of its microbatches too, and the asker redoes the rest. Only when
        every microbatch it holds is the asker's (the gradient is one sum: another origin's
        share could not be taken out), while this relay is at that step and no end is under
        way, and once per iteration, so an origin cannot keep a relay redoing its work."""
        iteration = request.iteration
        async with self._ending:
            if self._discarded >= iteration or self._closing >= iteration:
                return control.encode_reply(False, why="too late", step=self.worker.step_count)

            def drop() -> bool:
                # In the compute thread, which alone adds to the gradient.
                if self.worker.step_count != iteration or self.resyncing:
                    return False
                held = self.worker.accumulated
                kept = [self.buffers.get((iteration, m)) for m in held]
                if not held or any(b is None or b.header.origin != asker for b in kept):
                    return False
                self.worker.discard_gradients()
                # Set here, where backwards are computed: none of this iteration is added
                # after the drop but the redos the origin announces (``_backward``).
                self._discarded = iteration
                return True

            dropped = await self._run(drop)
            if dropped:
                log.warning(
                    "stage %s relay dropped its gradient of iteration %s: a microbatch of it "
                    "was computed twice; its origin redoes the rest",
                    self.stage,
                    iteration,
                )
        return control.encode_reply(dropped, step=self.worker.step_count)

    def _forward(
        self, header: HopHeader, frame: bytes, tensor: torch.Tensor, digest: bytes | None = None
    ) -> bytes:
        self._keep_state(header)
        output = self.worker.forward(header.microbatch_id, tensor)
        if self.distort is not None:
            output = self.distort(output)
        out_frame = codec.encode(header.microbatch_id, output, self.limits)
        self._keep_frames(header, frame, digest, out_frame)
        return out_frame

    def _backward(
        self, header: HopHeader, frame: bytes, tensor: torch.Tensor, digest: bytes | None = None
    ) -> bytes:
        if not header.flags & FLAG_REDO and self._sealed_against(header):
            raise Decline(self._sealed_why(header))  # sealed while it waited for this thread
        if self._discarded == header.iteration and not header.flags & FLAG_REDO:
            raise Decline(
                f"stage {self.stage} relay dropped its gradient of iteration "
                f"{header.iteration}; the microbatch's origin redoes what it held"
            )
        self._keep_state(header)
        grad = self.worker.backward(header.microbatch_id, tensor)
        grad_frame = codec.encode(header.microbatch_id, grad, self.limits)
        self._keep_frames(header, frame, digest, grad_frame)
        return grad_frame

    def _keep_state(self, header: HopHeader) -> None:
        """Keep the state of the hop's iteration for auditors, and decline the hop unless that
        kept state is the very weights it is about to be computed with: a hop that does not
        replay from its worker's kept weights is a wrong tensor, and its worker is slashed.

        In the compute thread, which every change of the weights runs in too (the step, a
        resync's load), so nothing changes them between this check and the hop. The first hop
        of an (epoch, iteration) keeps the state, or finds one this node kept before (a
        previous process of it, restarted) and checks that it holds these weights; a later hop
        checks that the weights have not changed since (``weights_version``, at no cost). Other
        weights than the kept ones (a replica's state loaded at the same step, a previous
        process's different ones) cannot be vouched for: the hop goes to another replica."""
        if self.evidence is None:
            return
        key = (header.epoch, header.iteration)
        version = self.worker.weights_version()
        known = self._kept.get(key)
        if known is None or known[0] != version:
            worker = self.worker
            current = self.evidence.keep_state(
                header.epoch,
                header.iteration,
                lambda: snapshot_part_state(worker, weights_only=True),
                lambda kept: holds_state_of(kept, worker, weights_only=True),
            )
            if not current:
                log.warning(
                    "stage %s relay declines the hops of iteration %s: the state it kept of "
                    "that iteration (epoch %s) is not the weights it holds now",
                    self.stage,
                    header.iteration,
                    header.epoch,
                )
            # Only the iteration in progress is ever checked again.
            self._kept = {k: v for k, v in self._kept.items() if k[1] == header.iteration}
            known = self._kept[key] = (version, current)
        if not known[1]:
            raise Decline(
                f"hop of iteration {header.iteration} at a stage {self.stage} relay whose "
                "weights are not the state it kept of that iteration; send it to another replica"
            )

    async def _state_kept(self, header: HopHeader) -> bool:
        """Wait until the state the hop was computed with is on disk (``_keep_state`` has it
        written in the archive's writer thread): only then may the hop's receipt be signed, as
        a relay that crashed before would have vouched for a hop it holds no evidence of.
        False (and the hop goes no further from here) if that write failed."""
        write = self.evidence.state_write(header.epoch, header.iteration) if self.evidence else None
        if write is None:
            return True
        if not write.done():
            done, token = trio.Event(), trio.lowlevel.current_trio_token()
            write.add_done_callback(lambda _: token.run_sync_soon(done.set))
            await done.wait()
        if write.exception() is None:
            return True
        log.error(
            "stage %s relay holds back microbatch %s: the state of iteration %s was not kept "
            "(%s); check the evidence folder's disk",
            self.stage,
            header.microbatch_id,
            header.iteration,
            write.exception(),
        )
        self._kept.pop((header.epoch, header.iteration), None)  # the next hop keeps it again
        return False

    def _keep_frames(
        self, header: HopHeader, frame: bytes, digest: bytes | None, out_frame: bytes
    ) -> None:
        if self.evidence is not None:
            self.evidence.keep_frame(header.epoch, frame, digest)
            self.evidence.keep_frame(header.epoch, out_frame)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await in_worker_thread(self.limiter, fn, *args)

    async def _send_forward(self, received: HopHeader, frame: bytes, input_digest: bytes) -> None:
        # A first hop on a lent flow comes from the borrower on the lender's slot.
        upstream = received.lender or received.path[-1]

        def flow_route() -> tuple[str, int] | None:
            return self.flow.node.route(upstream, received.slot)

        buffered = self.buffers.get((received.iteration, received.microbatch_id))
        if not await self._state_kept(received):
            if buffered is not None:
                buffered.sending = False
            return
        # Chosen once the state is kept: forwards that waited for it together are each counted
        # as detours in flight before the next chooses (``decisions.Detours``).
        route = flow_route()
        # The flow's next hop, else the ranked best next-stage peer; past the last stage, the
        # microbatch's origin (it holds the embedding the gradient ends in).
        to = self.sender.next_hop(self.stage + 1, route, received.origin)
        slot = route[1] if route and to == route[0] else 0
        if to is None:
            if buffered is not None:
                buffered.sending = False
            log.warning(
                "no next hop for microbatch %s; it will be repaired", received.microbatch_id
            )
            return
        header = received.onward(
            stage=self.stage + 1,
            slot=slot,
            path=(*received.path, self.plane.node_id),
            flags=0,
            lender="",
        )
        try:
            delivered_to = await self.sender.send_forward(
                header, frame, to, input_digest, flow_route
            )
        except PeerUnavailable as exc:
            log.warning("microbatch %s stalls here: %s", received.microbatch_id, exc)
            delivered_to = ""
        if buffered is not None:
            buffered.sending, buffered.sent_to = False, delivered_to

    async def handle_resend(self, request: control.Resend, asker: str) -> bytes:
        """Re-send the buffered forward output: for a backward repair (``Resend``: the receiver
        only recomputes) or a forward repair (``Resume``: the receiver also sends it on), when
        the microbatch's origin or the node after the dead hop asks (``resend_refusal``)."""
        buffered = self.buffers.get((request.iteration, request.microbatch))
        if buffered is None:
            return control.encode_reply(False, why="no buffered forward for that microbatch")
        refusal = resend_refusal(
            asker, request, buffered.header, self.stage, self.plane.stages, self.sender.stage_of
        )
        if refusal is not None:
            log.warning("re-send of microbatch %s refused: %s", request.microbatch, refusal)
            return control.encode_reply(False, why=refusal)
        if not await self._state_kept(buffered.header):  # its receipt would vouch for it
            return control.encode_reply(False, why="the weights of that hop are not kept")
        resume = isinstance(request, control.Resume)
        header = buffered.header.onward(
            stage=self.stage + 1,
            attempt=request.attempt,
            flags=FLAG_RESUME if resume else FLAG_REPAIR,
            path=(*buffered.header.path, self.plane.node_id),
        )
        reply = await self.sender.serve_resend(
            request.to, header, buffered.output_frame, buffered.input_digest
        )
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

    async def _check_in_step(self, iteration: int) -> None:
        """Compute a hop only with that iteration's weights (step ``iteration``): other weights
        give a wrong gradient. A relay behind its replicas (it joined while they stepped, or sat
        a round out) loads their state and holds the hop meanwhile, for up to half its sender's
        ack deadline: the held hop keeps its iteration from ending, so the relay catches up
        instead of chasing steps. Past that, or for a hop of an iteration it has left, it
        declines, and the sender sends the hop to another replica."""
        if iteration > self.worker.step_count:
            self._start_resync(iteration)
        with trio.move_on_after(self.plane.ack_deadline_s / 2):
            while self.resyncing:
                await self.resynced.wait()
        if self.resyncing or iteration != self.worker.step_count:
            raise Decline(
                f"hop of iteration {iteration} at a stage {self.stage} relay at step "
                f"{self.worker.step_count}{' (catching up)' if self.resyncing else ''}; "
                "send it to another replica"
            )

    def _in_step(self, header: HopHeader, fn: Callable[..., T], *args: object) -> T:
        """Compute a hop only while the weights are its iteration's and that iteration's end
        has not begun (between the attempts of an end whose round missed a holder: only the
        redo's hops). Checked again here, in the compute thread the step also runs in: a
        hop that passed ``_check_in_step`` may wait for the thread behind the iteration's end,
        and then a backward would meet a graph the step changed under it (a crash in torch), a
        forward the next iteration's weights, and a gradient added between the averaging and
        the step would reach only this replica's weights. Such a straggler (from a data node
        the others left out) is declined like any late hop."""
        iteration = header.iteration
        redo = header.flags & (FLAG_REPAIR if header.direction == FORWARD else FLAG_REDO)
        reopened = iteration == self._reopened and bool(redo)
        if iteration != self.worker.step_count or (iteration <= self._closing and not reopened):
            raise Decline(
                f"hop of iteration {iteration} at a stage {self.stage} relay ending or past it "
                f"(step {self.worker.step_count}); send it to another replica"
            )
        return fn(*args)

    def _start_resync(self, step: int) -> None:
        self.resync_target = max(self.resync_target, step)
        if self.resync is not None and not self.resyncing:
            self.resyncing, self.resynced = True, trio.Event()
            self.nursery.start_soon(self._resync)

    def _forget_microbatches(self, before: int) -> None:
        """What was kept for repairs and redos of the iterations before ``before``: no longer
        needed."""
        if self._kept_from >= before:
            return
        self._kept_from = before
        for kept in (self.buffers, self.sender.passed, self._redo_from):
            for key in [key for key in kept if key[0] < before]:
                del kept[key]
        for admitted in [key for key in self._admitted if key[0] < before]:
            del self._admitted[admitted]
        self._sealed.drop_before(before)

    async def _resync(self) -> None:
        """Load the replicas' state until this relay has caught up with the latest round.

        If no replica answers in time (the others died), this relay holds the newest state of
        its stage that is left: it goes on from it, and the stage loses the steps in between,
        rather than declining every hop for good."""
        assert self.resync is not None
        try:
            while self.worker.step_count < self.resync_target:
                try:
                    await self.resync(self.resync_target)
                except (trio.TooSlowError, ProtocolError) as exc:
                    log.error(
                        "no replica of stage %s gave its state at step %s (%s); going on from this "
                        "relay's own state at step %s: the stage loses the updates in between",
                        self.stage,
                        self.resync_target,
                        exc or "none answered",
                        self.worker.step_count,
                    )
                    self.worker.step_count = self.resync_target
        finally:
            self.resyncing = False
            self.resynced.set()

    async def end_iteration(self, request: control.EndIteration) -> bytes:
        """Average with ``request.replicas`` (this stage's live replicas), step, report the step.

        Once per iteration once it stepped: a repeated request (a second data node ending the
        iteration, its first one having died on the way) waits for the first and gets the same
        reply. A round that missed a holder (``EndIteration``) steps nothing and may be asked
        again, in the data node's next attempt."""
        async with self._ending:
            iteration, attempt, reply, settled = self._ended
            # A repeat (a second data node taking over starts again at attempt 0) gets the
            # latest answer: a round already closed is never opened again.
            if iteration != request.iteration or not (settled or request.attempt <= attempt):
                reply, settled = await self._end_iteration(request)
                self._ended = (request.iteration, request.attempt, reply, settled)
            return reply

    async def _cut_off(self, request: control.EndIteration, exc: RoundCutOff) -> tuple[bytes, bool]:
        """The round went on without this relay, and the others may have stepped: stepping on
        its own share would part its weights from theirs for good. Before the last attempt it
        keeps its gradients for the next one; at the last it loads a replica's state after the
        step instead (``_resync``, bounded: with none to load from it goes on from its own)."""
        iteration = request.iteration
        if not request.final:
            log.warning("stage %s relay: %s; waiting for the next attempt", self.stage, exc)
            self._reopened = iteration
            reply = control.encode_reply(False, why="incomplete", step=self.worker.step_count)
            return reply, False
        log.error("stage %s relay: %s; it loads a replica's state instead", self.stage, exc)
        await self._run(self.worker.discard_gradients)
        await self._run(self.worker.drop_all)
        self._forget_microbatches(before=iteration + 1)
        self._start_resync(iteration + 1)
        return control.encode_reply(False, why="cut off", step=self.worker.step_count), False

    async def _end_iteration(self, request: control.EndIteration) -> tuple[bytes, bool]:
        """The reply, and whether this relay is done with the iteration (it stepped)."""
        iteration, replicas = request.iteration, request.replicas
        self._closing, self._reopened = max(self._closing, iteration), -1
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
            self._forget_microbatches(before=iteration + 1)
            if self.plane.node_id in replicas:
                # Still hand in an empty share, so the round need not wait for this relay.
                empty = await self._run(self.worker.gradient_share)
                with suppress(RoundCutOff):  # it resyncs whatever the round's result
                    await self.averager.average(
                        self.stage, iteration, empty, replicas, request.attempt
                    )
            self._start_resync(iteration + 1)
            reply = control.encode_reply(False, why="out of step", step=self.worker.step_count)
            return reply, False
        started = trio.current_time()
        share = await self._run(self.worker.gradient_share)
        averaging = trio.current_time()
        try:
            result = await self.averager.average(
                self.stage, iteration, share, replicas, request.attempt
            )
        except RoundCutOff as exc:
            self.stats.averaging_s += trio.current_time() - averaging
            self.stats.ending_s += trio.current_time() - started
            return await self._cut_off(request, exc)
        self.stats.averaging_s += trio.current_time() - averaging
        missing = sorted(set(request.holders) - set(result.contributors))
        if missing:
            log.warning(
                "stage %s's average of iteration %s misses %s replica(s) holding gradients "
                "(died while averaging): %s",
                self.stage,
                iteration,
                len(missing),
                "stepping with what it has (last attempt)" if request.final else "not stepping",
            )
        if missing and not request.final:
            # The data node redoes what they held on live replicas and asks again: meanwhile
            # this iteration's redo hops (and only those) are computed again.
            self._reopened = iteration
            self.stats.ending_s += trio.current_time() - started
            reply = control.encode_reply(
                False, why="incomplete", missing=missing, step=self.worker.step_count
            )
            return reply, False
        if result.combined.microbatch_count > 0:
            await self._run(self.worker.average_gradients, [result.combined])
            await self._run(self.worker.step)
        else:
            await self._run(self.worker.discard_gradients)
            self.worker.step_count += 1  # no stage traffic at all: keep the step count in lockstep
        await self._run(self.worker.drop_all)
        # What this iteration's hops left is kept until the next iteration's first hop: another
        # stage whose round missed a holder redoes its gradients from it.
        self._forget_microbatches(before=iteration)
        self.stats.ending_s += trio.current_time() - started
        return control.encode_reply(True, step=self.worker.step_count, missing=missing), True
