"""The data node on the live network: starts microbatches, computes their loss, ends iterations.

Origin: each iteration injects its batch of microbatches (ids ``iteration * batch + j``) on the
flows the flow protocol built, at most one per flow slot at a time, keeps each embedding output
until the microbatch's gradient comes back, traces a microbatch that runs late and repairs it at
the lost hop (``stall_repair.py``), and re-starts a microbatch only when it stalls past its
deadline with nothing to repair (a new attempt; the summary counts it). Sink: computes the loss
of a microbatch that finished its forward and sends the gradient back along the recorded path
(repairing the last hop if that relay died), keeping it until the iteration ends. When every
microbatch of its share is done it has the gradients a dead replica held redone on a live one
(``gradient_redo.py``: the stages average every microbatch's gradient, as the whole model
would), probes the relays, asks every live one to average and step
(``relay_roster.py``), steps its own part, warns about (and counts) any stage none of whose
replicas stepped, and starts the next iteration.

Several data nodes can share a run (``shards``): each starts its own shard of every iteration's
microbatches (ids ``(iteration * shards + shard) * batch + j``) and computes their loss (a
microbatch's sink is its origin, which holds its embedding and, from the id, its labels); they
agree when every shard is done and which of them asks the relays to step (``data_peers.py``), and
average their embedding and head like any stage's replicas.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import trio

from gwtf.coordinator_free.decisions import keep_waiting
from gwtf.errors import ProtocolError, TrainingError
from gwtf.node.chain.epochs import EpochNow
from gwtf.node.p2p.rpc import Decline, PeerUnavailable
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.compute import T, in_worker_thread
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.gradient_redo import GradientRedo, RedoReport
from gwtf.node.runtime.dataplane.hop import (
    ATTEMPT_BLOCK,
    BACKWARD,
    FLAG_REPAIR,
    FLAG_RESUME,
    FORWARD,
    AttemptBlock,
    HopHeader,
    frame_digest,
    origin_attempt,
)
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats, PassedBack, resend_refusal
from gwtf.node.runtime.dataplane.stall_repair import Outcome, StallRepair
from gwtf.node.runtime.dataplane.try_token import sign_try
from gwtf.node.runtime.flow.routing import SwarmWiring
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.replicas.averaging import GradientAverager, RoundCutOff
from gwtf.node.runtime.roles.data_peers import DataPeers, LeftOut, shard_microbatches
from gwtf.node.runtime.roles.flow_pool import Flow, FlowPool
from gwtf.node.runtime.roles.relay_roster import RelayRoster
from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.data_node import DataNodeWorker

log = logging.getLogger(__name__)

#: Attempts of one microbatch before the data node gives up on the swarm (a stage is empty).
MAX_ATTEMPTS = 5
#: A microbatch is late, and traced, after this many times the recent median microbatch time
#: (acknowledged first hop to returned gradient), and never sooner than ``MIN_LATE_S``.
LATE_FACTOR = 4.0
MIN_LATE_S = 1.0
#: Decision rounds a data node joining a training run waits for a flow of its own.
JOINER_FLOW_ROUNDS = 5
#: How often a data node waiting for its first relay says so.
WAITING_SAID_EVERY_S = 10.0


@dataclass(frozen=True)
class Redone:
    """What saving an iteration's lost gradients found: the iteration, its first microbatch,
    the microbatches' final backward paths, and the report (redone again if an end misses a
    holder)."""

    iteration: int
    first: int
    paths: dict[int, tuple[str, ...]]
    report: RedoReport


@dataclass
class Microbatch:
    """What the data node keeps of one microbatch of its share, from its first try's start to
    its iteration's end (or to the iteration going on without this node): one record, so
    nothing of a microbatch outlives it or disagrees with the rest."""

    #: Tries and repairs handed an attempt block so far (``DataRole._take_attempt``).
    attempts: int = 0
    #: The first hop of its latest try (header and embedding output), while the try is in
    #: flight and, once done, for the rest of the iteration (a redo of stage 1 starts from it);
    #: None before the first send and between a try given up and the next one's send.
    sent: tuple[HopHeader, bytes] | None = None
    #: Its gradient came back to the embedding.
    finished: bool = False
    #: Set when the latest try's gradient comes back (what the try waits on).
    arrived: trio.Event | None = None
    #: The node that took the latest try's first hop (a resume moves it).
    first_hop: str | None = None
    #: Its loss, once a try's forward reached it: in the worker's accumulated gradient, with
    #: the head's gradient, once, however many tries reach the loss.
    loss: float | None = None
    #: The start of the try in flight once its forward reached the loss (-1 before): only the
    #: gradient of that try closes the microbatch.
    loss_try: int = -1
    #: The loss gradient sent back by a try given up after it reached the loss, with the digest
    #: of its input: a later try's forward from that input is answered with it, not counted
    #: again (``DataRole._loss_gradient``).
    given_up_gradient: PassedBack | None = None
    #: A forward of the try in flight is computing its loss (a copy of it is declined).
    loss_computing: bool = False
    #: The path of its final backward: who computed each stage's gradient.
    path: tuple[str, ...] = ()

    @property
    def in_flight(self) -> tuple[HopHeader, bytes] | None:
        """The first hop of the try in flight, if one is."""
        return None if self.finished else self.sent

    @property
    def at_loss(self) -> bool:
        """The try in flight's forward reached the loss: its gradient is what comes next."""
        in_flight = self.in_flight
        return in_flight is not None and self.loss_try == in_flight[0].try_start


@dataclass
class IterationResult:
    iteration: int
    loss: float
    microbatches: int
    restarts: int
    duration_s: float
    relays_stepped: int
    end_s: float = 0.0  # of duration_s: probing, the relays' averaging and steps, own step
    #: Stages none of whose replicas stepped this iteration: their part learned nothing.
    stages_not_stepped: tuple[int, ...] = ()
    epoch: int = 0  # the run's epoch the iteration's hops are receipted in
    #: (microbatch, stage) gradients a dead replica held, redone on a live one / lost anyway.
    gradients_redone: int = 0
    gradients_lost: int = 0
    microbatches_redone: int = 0
    #: The swarm's model's loss on the data set's validation windows after this iteration's
    #: step (every ``training.validation_every`` iterations; ``roles/validation.py``).
    validation_loss: float | None = None
    #: Two relays of every stage served the weights it was measured on; False: one relay's
    #: word (``roles/validation.py``).
    validation_verified: bool = False


@dataclass
class DataRole:
    worker: DataNodeWorker
    plane: DataPlane
    flow: FlowService
    limits: CodecLimits
    nursery: trio.Nursery
    batch: int
    stall_timeout_s: float
    stats: HopStats = field(default_factory=HopStats)
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(1))
    #: (iteration, microbatch) -> the record of each microbatch of the iteration under way.
    microbatches: dict[tuple[int, int], Microbatch] = field(default_factory=dict)
    results: list[IterationResult] = field(default_factory=list)
    training: bool = False  # flows exist and iterations have started
    finished: bool = False  # all its iterations are trained
    #: Recent microbatch times (acknowledged first hop to returned gradient): what "late" means.
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=64))

    wiring: SwarmWiring | None = None
    #: This data node's shard of each iteration's microbatches, of ``shards``; with several,
    #: the other data nodes and the averaging of the embedding and head among them.
    shard: int = 0
    shards: int = 1
    peers: DataPeers | None = None
    averager: GradientAverager | None = None
    #: The run's epoch now (chain time); each iteration's hops carry the epoch it started in.
    epoch_now: EpochNow = lambda: 0
    epoch: int = 0
    #: An iteration (of ``epoch``) is under way: its epoch's certificate waits for it.
    iterating: bool = False
    #: The iteration being ended, and what saving its lost gradients found.
    ending: Redone | None = None
    #: Other data nodes' requests to redo lost gradients of the iteration being ended: cut
    #: off when it ends, since its microbatches' records (and attempt numbers) go with it.
    redoing: set[trio.CancelScope] = field(default_factory=set)
    #: The iteration whose embedding and head this data node could not average (``RoundCutOff``).
    cut_off_at: int | None = None
    #: (iteration, tries) -> the attempt block of a microbatch's try: its tries, unless
    #: earlier processes of this node may have used those (``resume_points.AttemptJournal``).
    attempt_block: AttemptBlock = lambda iteration, tries: tries

    def __post_init__(self) -> None:
        self.sender = HopSender(self.plane, self.flow, self.stats, self.wiring)
        self.pool = FlowPool(self.flow)
        self.flow.observer = self.pool.heard
        self.plane.compute = self.compute
        self.roster = RelayRoster(self.plane, self.flow)
        self.repairer = StallRepair(
            self.plane,
            self.flow,
            self.sender,
            self.stats,
            self.trace,
            self.handle_resend,
            self._take_attempt,
            self.roster.probe_deadline_s,
            self.roster.replicas_of,
        )
        self.redo = GradientRedo(
            self.plane,
            self.roster.reachable,
            self.roster.gone,
            self.roster.learn,
            self.roster.probe_deadline_s,
            self._take_attempt,
            self.handle_resend,
            lambda request: self.sender.redo_backward(self.node_id, request),
        )

    @property
    def node_id(self) -> str:
        return self.plane.node_id

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await in_worker_thread(self.limiter, fn, *args)

    # ---- receiving --------------------------------------------------------------------------

    async def compute(self, header: HopHeader, frame: bytes) -> None:
        tensor = codec.decode(bytearray(frame), self.limits).tensor
        key = (header.iteration, header.microbatch_id)
        record = self.microbatches.get(key)
        in_flight = None if record is None else record.in_flight
        if header.direction == FORWARD and header.stage == self.plane.stages + 1:
            if header.origin != self.node_id or record is None or in_flight is None:
                # Another data node's microbatch (its origin computes its loss), or a late copy
                # of one that is done (or restarted): its loss would add a gradient to another
                # iteration's.
                raise Decline(f"microbatch {header.microbatch_id} is not in flight here")
            started = in_flight[0].try_start
            if header.try_start != started:
                # A late copy of a try given up (or one made up with its token, seen on its
                # path): only the try in flight reaches the loss.
                raise Decline(
                    f"microbatch {header.microbatch_id}'s forward of the try started at "
                    f"{header.try_start}; its try in flight started at {started}"
                )
            if record.loss_try == started or record.loss_computing:
                # A copy re-sent past a slow (not dead) relay: one loss per try, or its
                # gradient would go back twice.
                raise Decline(f"microbatch {header.microbatch_id} already reached its loss")
            back = header.onward(
                direction=BACKWARD,
                stage=self.plane.stages,
                flags=0,
                path=(*header.path, self.node_id),
            )
            record.loss_computing = True
            try:
                gradient = await self._loss_gradient(record, back, frame, tensor)
            finally:
                record.loss_computing = False
            if record.in_flight is None or record.in_flight[0].try_start != started:
                # Given up while its loss was computed: the next try may take this gradient.
                record.given_up_gradient = gradient
                raise Decline(f"microbatch {header.microbatch_id}'s try was given up meanwhile")
            record.loss_try = started
            passed = self.sender.pass_back(back, gradient.frame, gradient.input_digest)
            # Sent (or being sent) by a try given up: the same work, counted once.
            passed.recorded = gradient.recorded or gradient.sending
            record.given_up_gradient = None  # kept in ``sender.passed`` from here on
            self.nursery.start_soon(self.sender.send_backward_or_log, passed)
        elif header.direction == BACKWARD and header.stage == 0 and header.origin == self.node_id:
            if record is None or in_flight is None:
                raise Decline(f"gradient for microbatch {header.microbatch_id}, not in flight")
            if not record.at_loss or header.try_start != record.loss_try:
                # A late gradient of a try given up: only the gradient of the try in flight,
                # whose forward reached the loss, closes the microbatch.
                raise Decline(
                    f"gradient of microbatch {header.microbatch_id}'s try started at "
                    f"{header.try_start}; no loss of that try is kept"
                )
            # Once the embedding took the gradient the microbatch is closed, even if its try
            # was being given up meanwhile (the give-up's drop then finds nothing left).
            await self._run(self.worker.backward_embedding, header.microbatch_id, tensor)
            record.finished, record.path = True, header.path
            if record.arrived is not None:
                record.arrived.set()
        else:
            raise ProtocolError(f"a data node does not compute {header.direction}/{header.stage}")

    async def _loss_gradient(
        self, record: Microbatch, back: HopHeader, frame: bytes, tensor: torch.Tensor
    ) -> PassedBack:
        """The loss gradient of a microbatch's forward ``frame`` (``back``: the backward that
        carries it; not yet sent or kept). A forward from the input of a try given up after it
        reached the loss gets that try's gradient again, already in the step; one from another
        input (a restart on other hardware upstream) replaces it in the worker's step
        (``DataNodeWorker.loss_and_backward``): the loss counts once either way."""
        digest = frame_digest(frame)
        kept = record.given_up_gradient
        if kept is not None and kept.input_digest == digest:
            return kept
        loss, grad = await self._run(self.worker.loss_and_backward, back.microbatch_id, tensor)
        record.loss, record.given_up_gradient = loss, None
        return PassedBack(back, codec.encode(back.microbatch_id, grad, self.limits), digest)

    async def handle_resend(self, request: control.Resend, asker: str = "") -> bytes:
        """Re-send a microbatch's first hop, asked by this node's own repairs (no ``asker``)
        or by the stage-2 node after a dead stage-1 hop (``resend_refusal``)."""
        record = self.microbatches.get((request.iteration, request.microbatch))
        if record is None or record.sent is None:
            return control.encode_reply(False, why="microbatch not in flight here")
        header, frame = record.sent
        refusal = resend_refusal(
            asker or self.node_id, request, header, 0, self.plane.stages, self.sender.stage_of
        )
        if refusal is not None:
            log.warning("re-send of microbatch %s refused: %s", request.microbatch, refusal)
            return control.encode_reply(False, why=refusal)
        resume = isinstance(request, control.Resume)
        repair = header.onward(
            attempt=request.attempt, flags=FLAG_RESUME if resume else FLAG_REPAIR
        )
        reply = await self.sender.serve_resend(request.to, repair, frame, b"")
        if resume and control.decode_reply(reply)["ok"]:
            record.first_hop = request.to
        return reply

    def current_try(self, request: control.CurrentTry) -> bytes:
        """The first attempt of a microbatch's latest try (in progress or done), and the first
        this node has not handed out (no hop of the microbatch carries one as high): a relay
        that holds a forward of it from another input lets a forward of this try replace one of
        an earlier try, or one under a number nobody handed out, only (``held_forward.py``)."""
        record = self.microbatches.get((request.iteration, request.microbatch))
        if record is None or record.sent is None:
            return control.encode_reply(False, why="microbatch not in flight here")
        block = self.attempt_block(request.iteration, record.attempts)
        issued = min(block * ATTEMPT_BLOCK, 1 << 16)
        return control.encode_reply(True, attempt=record.sent[0].attempt, issued=issued)

    def trace(self, request: control.Trace) -> bytes:
        """What this node, as a sink, knows of a microbatch's forward."""
        if self.plane.receiving(request.iteration, request.microbatch, FORWARD):
            return control.encode_trace("queued")
        record = self.microbatches.get((request.iteration, request.microbatch))
        if record is not None and record.at_loss:
            return control.encode_trace("held")
        return control.encode_trace("absent")

    # ---- driving iterations ----------------------------------------------------------------

    async def wait_for_flows(
        self, patience_s: float, timeout_s: float, joining: bool = False
    ) -> None:
        """Wait for a flow of this node's own; then start, or after ``timeout_s`` with a live
        stage-1 relay start anyway on it. With none, wait on for up to ``patience_s`` (inf:
        until cancelled), saying so now and then: relays may start after their data node. A
        data node joining a run that trains (``joining``) waits only a few decision rounds:
        the other data nodes may hold all of stage 1's slots, so it starts on the flows they
        lend it and on any stage-1 relay, and its own come as slots free."""
        if self.peers is not None:
            await self.peers.wait_for_all(timeout_s)
        node = self.flow.node
        own_flows_s = min(timeout_s, JOINER_FLOW_ROUNDS * node.period_s) if joining else timeout_s
        waited = said = trio.current_time()
        relay_seen: float | None = None  # when a stage-1 relay was first alive
        with trio.move_on_after(max(patience_s, timeout_s)):
            while not node.source_routes():
                now = trio.current_time()
                if node.alive_peers(1):
                    # Flows take a few decision rounds to form once relays are there: the
                    # patience for them starts when the first one is, not when this node did.
                    relay_seen = now if relay_seen is None else relay_seen
                    if now - relay_seen >= own_flows_s:
                        break
                elif now - said >= WAITING_SAID_EVERY_S:
                    said = now
                    log.warning(
                        "waiting for relays: no stage-1 relay has joined yet (%.0f s); start "
                        "relays with --bootstrap and the address this node serves on",
                        now - waited,
                    )
                await trio.sleep(0.05)
        if not node.source_routes():
            if not node.alive_peers(1):
                raise TrainingError(
                    f"no stage-1 relay found within {max(patience_s, timeout_s):g} s; start "
                    "relays, or check p2p.bootstrap_peers"
                )
            log.warning(
                "no flow of its own yet (the stage-1 relays are full): starting on lent flows "
                "and any stage-1 relay"
            )
        self.training = True

    async def run_iteration(self, iteration: int) -> IterationResult:
        """Train ``iteration``'s share of this data node; ``LeftOut`` if the other data nodes
        went on without it (then it must ask back in). Its microbatches' records live exactly
        as long as this call."""
        ids = shard_microbatches(iteration, self.shard, self.shards, self.batch)
        first, pending = ids.start, list(ids)
        keys = [(iteration, m) for m in pending]
        self.microbatches.update((key, Microbatch()) for key in keys)
        try:
            return await self._train_share(iteration, first, pending)
        finally:
            # Done, left out or failed: its epoch's certificate waits for it no longer.
            self.iterating = False
            records = [self.microbatches.pop(key) for key in keys]
            for key in keys:  # the loss gradients it sent back, kept for repairs and redos
                self.sender.passed.pop(key, None)
            # Left out (or failed) with microbatches in flight: their embedding outputs would
            # stay in the worker, counted against ``max_in_flight``, for good.
            abandoned = [m for m, r in zip(pending, records, strict=True) if not r.finished]
            if abandoned:
                with trio.CancelScope(shield=True):
                    await self._run(self._drop_all, abandoned)

    def _drop_all(self, microbatch_ids: list[int]) -> None:
        for microbatch_id in microbatch_ids:
            self.worker.drop(microbatch_id)

    async def _train_share(self, iteration: int, first: int, pending: list[int]) -> IterationResult:
        started = trio.current_time()
        self.epoch, self.iterating = self.epoch_now(), True
        if self.peers is not None:
            self.peers.iteration = iteration
        restarts = launched = 0
        left_out: list[LeftOut] = []

        async def run_one(microbatch_id: int, flow: Flow) -> None:
            try:
                await run_on(microbatch_id, flow)
            finally:
                self.pool.release(flow, len(pending) - launched)

        async def run_on(microbatch_id: int, flow: Flow) -> None:
            nonlocal restarts
            key = (iteration, microbatch_id)
            failed = 0
            while not await self._run_microbatch(
                iteration, microbatch_id, flow, self._take_attempt(key)
            ):
                restarts += 1
                failed += 1
                if self.peers is not None:
                    # Relays refuse the hops of an iteration they ended: was it ended without
                    # this data node?
                    try:
                        await self.peers.check_in(iteration)
                    except LeftOut as exc:
                        left_out.append(exc)
                        nursery.cancel_scope.cancel()
                        return
                if failed > MAX_ATTEMPTS:
                    raise TrainingError(
                        f"microbatch {microbatch_id} failed {failed} times; the swarm has no "
                        "working path through every stage — start more relays"
                    )

        # Every source slot of this data node (one per unit of its capacity), routed or not (a
        # slot whose flow is being rebuilt starts its microbatch on any live stage-1 replica),
        # and slots other data nodes lend it while its microbatches wait.
        self.pool.open(self.peers.others() if self.peers is not None else None)
        async with trio.open_nursery() as nursery:
            for microbatch_id in pending:
                flow = await self.pool.take(len(pending) - launched)
                launched += 1
                if flow.lender:
                    self.stats.microbatches_on_loans += 1
                nursery.start_soon(run_one, microbatch_id, flow)
            self.pool.all_started()
        if left_out:
            raise left_out[0]
        ending = trio.current_time()
        records = [self.microbatches[(iteration, m)] for m in pending]
        paths = {m: record.path for m, record in zip(pending, records, strict=True)}
        redo = await self.redo.save_lost(iteration, first, paths)
        # Until the iteration ends, the data node in charge may have it redo more (RedoLost).
        self.ending = redone = Redone(iteration, first, paths, redo)
        data_nodes = [self.node_id]
        try:
            if self.peers is not None:
                data_nodes = await self.peers.agree_done(iteration, tuple(sorted(redo.holders)))
            async with trio.open_nursery() as nursery:
                # The data node's own step needs nothing from the relays: take it meanwhile.
                nursery.start_soon(self._step_own_part, iteration, data_nodes)
                stepped_by_stage, relays_stepped = await self._relays_end(
                    iteration, data_nodes, redone
                )
        except BaseExceptionGroup as group:
            left_out_now = group.subgroup(LeftOut)
            if left_out_now is not None:
                raise left_out_now.exceptions[0] from None
            raise
        finally:
            self.ending = None
            for scope in self.redoing:
                scope.cancel()
        if self.cut_off_at == iteration:
            # Only now, so that the relays' end this data node may be in charge of is not cut
            # short: it did not step, so it asks to be taken back in and loads the others'
            # embedding and head.
            raise LeftOut(iteration)
        end_s = trio.current_time() - ending
        self.stats.gradients_redone += redo.redone
        self.stats.gradients_lost += redo.lost
        self.stats.gradients_duplicated += redo.duplicated
        self.stats.gradient_sums_dropped += redo.sums_dropped
        self.stats.microbatches_redone += redo.microbatches_redone
        idle = tuple(
            s
            for s in range(1, self.plane.stages + 1)
            if stepped_by_stage is not None and not stepped_by_stage.get(s)
        )
        if idle:
            self.stats.stages_not_stepped += len(idle)
            log.warning(
                "iteration %s: no replica of stage(s) %s stepped; their part learned nothing "
                "this iteration (relays busy or gone: check their logs, or start more relays)",
                iteration,
                ", ".join(map(str, idle)),
            )
        loss = sum(_loss_of(record) for record in records) / len(records)
        result = IterationResult(
            iteration,
            loss,
            len(records),
            restarts,
            trio.current_time() - started,
            relays_stepped,
            end_s,
            idle,
            self.epoch,
            redo.redone,
            redo.lost,
            redo.microbatches_redone,
        )
        self.results.append(result)
        return result

    async def _step_own_part(self, iteration: int, data_nodes: list[str]) -> None:
        """Step the embedding and head: alone, or with the average over ``data_nodes``."""
        if len(data_nodes) == 1 or self.averager is None:
            await self._run(self.worker.step)
            return
        share = await self._run(self.worker.gradient_share)
        try:
            result = await self.averager.average(0, iteration, share, data_nodes)
        except RoundCutOff as exc:
            # The others may have stepped without this data node: never step alone.
            log.error("embedding and head not stepped: %s", exc)
            await self._run(self.worker.discard_gradients)
            self.cut_off_at = iteration
            return
        if result.combined.microbatch_count > 0:
            await self._run(self.worker.average_gradients, [result.combined])
            await self._run(self.worker.step)
        else:
            await self._run(self.worker.discard_gradients)
            self.worker.step_count += 1  # keep the step count in lockstep with the others

    async def _relays_end(
        self, iteration: int, data_nodes: list[str], redone: Redone
    ) -> tuple[dict[int, int] | None, int]:
        """Have the relays end ``iteration`` once: this data node asks them (returning how many
        replicas of each stage stepped) unless another data node is in charge (then None, with
        how many relays it says stepped)."""
        if self.peers is not None:
            stepped = await self.peers.ended_by_other(iteration, data_nodes)
            if stepped is not None:
                return None, stepped
        by_stage = await self._end_all_stages(iteration, redone, data_nodes)
        if self.peers is not None:
            await self.peers.announce_ended(iteration, sum(by_stage.values()), data_nodes)
        return by_stage, sum(by_stage.values())

    async def _end_all_stages(
        self, iteration: int, redone: Redone, data_nodes: list[str]
    ) -> dict[int, int]:
        """End the iteration at every stage; a stage whose round missed a replica holding
        gradients (it died while averaging) has them redone on live replicas, by every data
        node for its share, and is ended again, up to ``control.MAX_END_ATTEMPTS`` times.
        Returns how many replicas of each stage stepped."""
        stepped: dict[int, int] = {}
        report, stages = redone.report, None
        others = self.peers.holders_of_others(iteration, data_nodes) if self.peers else set()
        for attempt in range(control.MAX_END_ATTEMPTS):
            holders = self._stages_of(others)
            holders.update({relay: stage for relay, (stage, _) in report.holders.items()})
            unplaced = others - set(holders)  # in no round of this attempt
            outcome = await self.roster.end_iteration(
                iteration, 4 * self.stall_timeout_s, holders, attempt, stages
            )
            stepped.update(outcome.stepped)
            for relay in sorted({r for relays in outcome.missing.values() for r in relays}):
                self.roster.gone(relay)  # it held gradients and did not answer
            if outcome.left_out:
                # How many of another data node's gradients its holder held is not told here:
                # at least one.
                lost = sum(report.holders.get(r, (0, 1))[1] for r in outcome.left_out)
                redone.report.left_out += lost
                log.warning(
                    "iteration %s: %s gradient(s) of replica(s) %s are lost: gone before or "
                    "while their stage averaged, which stepped without them (last attempt)",
                    iteration,
                    lost,
                    ", ".join(sorted(outcome.left_out)),
                )
            if not outcome.unstepped:
                break
            stages = set(outcome.unstepped)
            log.warning(
                "iteration %s: stage(s) %s did not step: a replica holding gradients was "
                "missing from the average; redoing what no live replica holds",
                iteration,
                ", ".join(map(str, sorted(stages))),
            )
            report = await self.redo.save_lost(iteration, redone.first, redone.paths, stages)
            redone.report.add(report)
            if self.peers is not None:
                others = await self.peers.redo_lost(
                    iteration, frozenset(stages), data_nodes, 4 * self.stall_timeout_s
                )
        if unplaced:
            # Another data node's holders whose stage this node does not know were in no
            # round of the last attempt: at least one gradient each is in no step.
            redone.report.left_out += len(unplaced)
            log.warning(
                "iteration %s: holder(s) %s of other data nodes' gradients were in no stage's "
                "average (their stage is not known here): at least %s gradient(s) lost",
                iteration,
                ", ".join(sorted(unplaced)),
                len(unplaced),
            )
        return stepped

    def _stages_of(self, relays: set[str]) -> dict[str, int]:
        """Relay -> stage, for the relays this node knows the stage of (every relay answered
        its ``Holds``)."""
        known = self.roster.told | self.roster.believed()
        return {relay: known[relay] for relay in relays if relay in known}

    async def redo_lost(self, peer: str, request: control.RedoLost) -> bytes:
        """The data node ending the iteration asks this one to redo its share's lost gradients
        at the stages whose round missed a holder."""
        if self.peers is None or peer not in self.peers.members:
            raise ProtocolError(f"{peer} is not a data node of this run")
        redone = self.ending
        if redone is None or redone.iteration != request.iteration:
            return control.encode_reply(False, why="not ending that iteration", holders=[])
        stages = request.stage_set(self.plane.stages)
        with trio.CancelScope() as scope:
            self.redoing.add(scope)
            try:
                report = await self.redo.save_lost(
                    redone.iteration, redone.first, redone.paths, stages
                )
            finally:
                self.redoing.discard(scope)
        if scope.cancelled_caught:
            return control.encode_reply(False, why="the iteration ended meanwhile", holders=[])
        redone.report.add(report)
        return control.encode_reply(True, holders=sorted(report.holders))

    def _take_attempt(self, key: tuple[int, int]) -> int:
        """The next attempt number of a microbatch: restarts and repaired hops each take a new
        block of them (``hop.origin_attempt``), so no two tries of a hop carry the same one."""
        record = self.microbatches[key]
        tries, record.attempts = record.attempts, record.attempts + 1
        return origin_attempt(self.attempt_block(key[0], tries))

    async def _first_hop(self, flow: Flow) -> str | None:
        """The flow's routed first hop, else any live stage-1 replica; waits while none is
        known."""
        with trio.move_on_after(self.stall_timeout_s):
            while True:
                first_hop = self.sender.next_hop(1, self._flow_route(flow))
                if first_hop is not None:
                    return first_hop
                await trio.sleep(self.flow.tick_s)
        return None

    def _flow_route(self, flow: Flow) -> tuple[str, int] | None:
        """The flow's first hop and slot as the core (or the lender's loan) holds them now."""
        if flow.lender:
            first_hop = self.pool.first_hop(flow)
        else:
            routed = self.flow.node.source_routes().get(flow.slot)
            first_hop = routed[1] if routed else None
        return None if first_hop is None else (first_hop, flow.slot)

    async def _run_microbatch(
        self, iteration: int, microbatch_id: int, flow: Flow, attempt: int
    ) -> bool:
        """One attempt of one microbatch; False when it stalled and must start again."""
        key = (iteration, microbatch_id)
        first_hop = await self._first_hop(flow)
        if first_hop is None:
            return False
        activation = await self._run(self.worker.embed, microbatch_id)
        # Decided again once embedded, right before the send: the detours this node sent while
        # it embedded count (``HopSender.detours``), so concurrent microbatches off a flow spread.
        first_hop = self.sender.next_hop(1, self._flow_route(flow)) or first_hop
        frame = codec.encode(microbatch_id, activation, self.limits)
        header = HopHeader(
            self.plane.run_id,
            iteration,
            microbatch_id,
            attempt,
            FORWARD,
            1,
            flow.slot,
            0,
            self.node_id,
            (self.node_id,),
            # A loan's first hop names its lender, unless the hop went elsewhere (loan ended).
            flow.lender if flow.lender and self.pool.first_hop(flow) == first_hop else "",
            self.epoch,
        )
        # every forward of this try carries it
        header = sign_try(header, self.plane.node_key, self.plane.try_domain)
        record = self.microbatches[key]
        record.sent = (header, frame)
        event = record.arrived = trio.Event()
        try:
            record.first_hop = await self.sender.send_forward(
                header, frame, first_hop, b"", lambda: self._flow_route(flow)
            )
        except PeerUnavailable as exc:
            log.warning("microbatch %s could not start: %s", microbatch_id, exc)
            record.sent = None
            return False
        if await self._wait_or_repair(key, event) or await self._give_up(key, event):
            record.arrived = None
            return True
        record.arrived = None
        log.warning("microbatch %s stalled; starting it again", microbatch_id)
        return False

    async def _give_up(self, key: tuple[int, int], event: trio.Event) -> bool:
        """Give a stalled try up: no hop of it is taken from here on, its embedding output is
        dropped and the loss gradient it sent back, if any, kept for the next try. True when
        its gradient reached the embedding before the drop: the microbatch is done after all."""
        record = self.microbatches[key]
        sent, record.sent = record.sent, None
        if not await self._run(self.worker.drop, key[1]):
            # The embedding took the gradient (``compute`` closes the microbatch as soon as
            # its worker thread returns).
            with trio.move_on_after(self.plane.ack_deadline_s):
                await event.wait()
            if event.is_set():
                record.sent = sent
                return True
        record.loss_try = -1
        passed = self.sender.passed.pop(key, None)
        if passed is not None:
            record.given_up_gradient = passed
        return False

    # ---- repairing a late microbatch ---------------------------------------------------------

    async def _wait_or_repair(self, key: tuple[int, int], event: trio.Event) -> bool:
        """Wait for the microbatch's gradient. Whenever it runs late, trace it and repair the
        hop where it was lost: a relay can acknowledge a hop and die before sending it on, and
        no sender would notice. False when it stalled past its deadline and nothing could be
        repaired: restart it."""
        sent_at = trio.current_time()
        deadline = sent_at + self.stall_timeout_s
        deadlines = 0
        while True:
            with trio.move_on_after(max(min(self._late_s(), deadline - trio.current_time()), 0)):
                await event.wait()
            outcome = None if event.is_set() else await self._repair(key)
            if event.is_set():  # back before it was traced, or while it was
                self.recent_s.append(trio.current_time() - sent_at)
                return True
            if outcome is not None:
                level = logging.WARNING if outcome.repaired else logging.INFO
                log.log(level, "microbatch %s is late; %s", key[1], outcome.what)
            if trio.current_time() < deadline:
                continue
            deadlines += 1
            if not keep_waiting(deadlines, outcome is not None):
                return False
            deadline = trio.current_time() + self.stall_timeout_s

    def _late_s(self) -> float:
        """How long a microbatch may go on before it is traced."""
        if not self.recent_s:
            return min(self.stall_timeout_s, 2 * self.plane.ack_deadline_s)
        typical = LATE_FACTOR * statistics.median(self.recent_s)
        return min(self.stall_timeout_s, max(typical, MIN_LATE_S))

    async def _repair(self, key: tuple[int, int]) -> Outcome | None:
        record = self.microbatches[key]
        if record.at_loss:  # the try's forward reached the loss: its gradient is what is late
            return await self.repairer.repair_backward(key)
        return await self.repairer.repair_forward(key, record.first_hop)


def _loss_of(record: Microbatch) -> float:
    """A finished microbatch's loss: its gradient came back, so its forward reached the loss."""
    if record.loss is None:
        raise TrainingError("a microbatch finished without a loss; this is a bug in the data role")
    return record.loss
