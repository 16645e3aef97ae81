"""The data node on the live network: starts microbatches, computes their loss, ends iterations.

Origin: each iteration injects its batch of microbatches (ids ``iteration * batch + j``) on the
flows the flow protocol built, at most one per flow slot at a time, keeps each embedding output
until the microbatch's gradient comes back, and re-starts a microbatch that stalls past its
deadline (a new attempt; the summary counts it). Sink: computes the loss of a microbatch that
finished its forward and sends the gradient back along the recorded path (repairing the last
hop if that relay died). When every microbatch of the iteration is done it asks every relay to
average and step, steps its own part, and starts the next iteration.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError, TrainingError
from node.p2p.rpc import PeerUnavailable, RpcLimits
from node.runtime import control
from node.runtime.compute import T, in_worker_thread
from node.runtime.dataplane import DataPlane
from node.runtime.flow_service import FlowService
from node.runtime.hop import BACKWARD, FLAG_REPAIR, FORWARD, HopHeader, frame_digest
from node.runtime.relay import HopSender, HopStats
from node.runtime.routing import SwarmWiring
from node.training import codec
from node.training.codec import CodecLimits
from node.training.data_node import DataNodeWorker

log = logging.getLogger(__name__)

#: Attempts of one microbatch before the data node gives up on the swarm (a stage is empty).
MAX_ATTEMPTS = 5


@dataclass
class IterationResult:
    iteration: int
    loss: float
    microbatches: int
    restarts: int
    duration_s: float
    relays_stepped: int


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
    embedded: dict[tuple[int, int], tuple[HopHeader, bytes]] = field(default_factory=dict)
    losses: dict[tuple[int, int], float] = field(default_factory=dict)
    done: dict[tuple[int, int], trio.Event] = field(default_factory=dict)
    results: list[IterationResult] = field(default_factory=list)
    training: bool = False  # flows exist and iterations have started

    wiring: SwarmWiring | None = None

    def __post_init__(self) -> None:
        self.sender = HopSender(self.plane, self.flow, self.stats, self.wiring)
        self.plane.compute = self.compute

    @property
    def node_id(self) -> str:
        return self.plane.node_id

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await in_worker_thread(self.limiter, fn, *args)

    # ---- receiving --------------------------------------------------------------------------

    async def compute(self, header: HopHeader, frame: bytes) -> None:
        tensor = codec.decode(bytearray(frame), self.limits).tensor
        key = (header.iteration, header.microbatch_id)
        if header.direction == FORWARD and header.stage == self.plane.stages + 1:
            if key in self.losses:
                # A copy re-sent past a slow (not dead) relay: one loss per microbatch, or its
                # gradient would count twice. A restart clears the entry first.
                raise ProtocolError(f"microbatch {header.microbatch_id} already reached its loss")
            loss, grad = await self._run(
                self.worker.loss_and_backward, header.microbatch_id, tensor
            )
            self.losses[key] = loss
            grad_frame = codec.encode(header.microbatch_id, grad, self.limits)
            back = header.onward(
                direction=BACKWARD,
                stage=self.plane.stages,
                flags=0,
                path=(*header.path, self.node_id),
            )
            self.nursery.start_soon(
                self.sender.backward_or_log, back, grad_frame, frame_digest(frame)
            )
        elif header.direction == BACKWARD and header.stage == 0 and header.origin == self.node_id:
            if key not in self.embedded:
                raise ProtocolError(
                    f"gradient for microbatch {header.microbatch_id}, not in flight"
                )
            await self._run(self.worker.backward_embedding, header.microbatch_id, tensor)
            del self.embedded[key]
            event = self.done.get(key)
            if event is not None:
                event.set()
        else:
            raise ProtocolError(f"a data node does not compute {header.direction}/{header.stage}")

    async def handle_resend(self, request: control.Resend) -> bytes:
        entry = self.embedded.get((request.iteration, request.microbatch))
        if entry is None:
            return control.encode_reply(False, why="microbatch not in flight here")
        header, frame = entry
        repair = header.onward(attempt=request.attempt, flags=FLAG_REPAIR)
        return await self.sender.serve_resend(request.to, repair, frame)

    # ---- driving iterations ----------------------------------------------------------------

    async def wait_for_flows(self, timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while not self.flow.node.source_routes():
                await trio.sleep(0.05)
        self.training = True

    async def run_iteration(self, iteration: int) -> IterationResult:
        started = trio.current_time()
        restarts = 0
        pending = [iteration * self.batch + j for j in range(self.batch)]
        slots, free_slots = trio.open_memory_channel[int](math.inf)  # holds every flow slot

        async def run_one(microbatch_id: int, slot: int) -> None:
            nonlocal restarts
            attempt = 0
            while not await self._run_microbatch(iteration, microbatch_id, slot, attempt):
                restarts += 1
                attempt += 1
                if attempt > MAX_ATTEMPTS:
                    raise TrainingError(
                        f"microbatch {microbatch_id} failed {attempt} times; the swarm has no "
                        "working path through every stage — start more relays"
                    )
            await slots.send(slot)

        # Every source slot of this data node (one per unit of its capacity), routed or not:
        # a slot whose flow is being rebuilt starts its microbatch on any live stage-1 replica.
        for slot in sorted(self.flow.node.out_slots):
            slots.send_nowait(slot)
        async with trio.open_nursery() as nursery:
            for microbatch_id in pending:
                slot = await free_slots.receive()
                nursery.start_soon(run_one, microbatch_id, slot)
        relays_stepped = await self._end_iteration(iteration)
        await self._run(self.worker.step)
        keys = [(iteration, m) for m in pending]
        loss = sum(self.losses.pop(k) for k in keys) / len(keys)
        result = IterationResult(
            iteration, loss, len(keys), restarts, trio.current_time() - started, relays_stepped
        )
        self.results.append(result)
        return result

    async def _first_hop(self, slot: int) -> str | None:
        """The slot's routed first hop, else any live stage-1 replica; waits while none is known."""
        with trio.move_on_after(self.stall_timeout_s):
            while True:
                routed = self.flow.node.source_routes().get(slot)
                first_hop = self.sender.next_hop(1, routed[1] if routed else None)
                if first_hop is not None:
                    return first_hop
                await trio.sleep(self.flow.tick_s)
        return None

    async def _run_microbatch(
        self, iteration: int, microbatch_id: int, slot: int, attempt: int
    ) -> bool:
        """One attempt of one microbatch; False when it stalled and must start again."""
        key = (iteration, microbatch_id)
        first_hop = await self._first_hop(slot)
        if first_hop is None:
            return False
        activation = await self._run(self.worker.embed, microbatch_id)
        frame = codec.encode(microbatch_id, activation, self.limits)
        header = HopHeader(
            self.plane.run_id,
            iteration,
            microbatch_id,
            attempt,
            FORWARD,
            1,
            slot,
            0,
            self.node_id,
            (self.node_id,),
        )
        self.embedded[key] = (header, frame)
        event = self.done[key] = trio.Event()
        try:
            await self.sender.forward(header, frame, first_hop, b"")
        except PeerUnavailable as exc:
            log.warning("microbatch %s could not start: %s", microbatch_id, exc)
            self.embedded.pop(key, None)
            return False
        with trio.move_on_after(self.stall_timeout_s):
            await event.wait()
        del self.done[key]
        if event.is_set():
            return True
        log.warning("microbatch %s stalled; starting it again", microbatch_id)
        self.embedded.pop(key, None)
        self.losses.pop(key, None)
        await self._run(self.worker.drop, microbatch_id)
        return False

    async def _end_iteration(self, iteration: int) -> int:
        """Ask every live relay to average with its stage's live replicas and step.

        Relays that answer a quick liveness probe are the replica sets, announced to all of them,
        so every replica of a stage averages over the same list and none waits for a dead one.
        """
        believed = sorted(
            p.peer_id for p in self.flow.node.peers.values() if p.alive and p.stage >= 1
        )
        alive = await self._probe(believed)
        by_stage: dict[int, list[str]] = {}
        for relay in alive:
            by_stage.setdefault(self.flow.node.peers[relay].stage, []).append(relay)
        stepped = 0
        limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 4 * self.stall_timeout_s)

        async def ask(relay: str) -> None:
            nonlocal stepped
            replicas = tuple(by_stage[self.flow.node.peers[relay].stage])
            request = control.encode_request(control.EndIteration(iteration, replicas))
            try:
                reply = control.decode_reply(
                    await self.plane.rpc.request(
                        ID.from_base58(relay), control.PROTOCOL_ID, request, limits
                    )
                )
            except (PeerUnavailable, ProtocolError) as exc:
                log.warning("relay %s did not end iteration %s: %s", relay, iteration, exc)
                return
            stepped += bool(reply["ok"])

        async with trio.open_nursery() as nursery:
            for relay in alive:
                nursery.start_soon(ask, relay)
        return stepped

    async def _probe(self, relays: list[str]) -> list[str]:
        """The relays among ``relays`` that answer within a short deadline."""
        answered: list[str] = []
        request = control.encode_request(control.Alive())
        limits = RpcLimits(
            control.MAX_BYTES, control.MAX_BYTES, self.flow.node.config.keepalive_timeout_s
        )

        async def probe(relay: str) -> None:
            try:
                await self.plane.rpc.request(
                    ID.from_base58(relay), control.PROTOCOL_ID, request, limits
                )
            except PeerUnavailable:
                self.flow.dispatch(self.flow.node.peer_dead(relay, trio.current_time()))
                return
            answered.append(relay)

        async with trio.open_nursery() as nursery:
            for relay in relays:
                nursery.start_soon(probe, relay)
        return sorted(answered)
