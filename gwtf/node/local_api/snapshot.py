"""The node's status as an immutable snapshot, taken on the trio loop and read by the API.

``take_snapshot`` reads a ``LiveNode`` once (no awaits: the loop is not left in between, so the
snapshot is consistent) into frozen API schemas. ``SnapshotBox`` hands the latest to the API's
threads: replacing one reference is atomic, and nothing in a snapshot is ever mutated.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from gwtf.api.schemas import (
    DiskUse,
    FlowView,
    Health,
    HistoryPoint,
    NodeView,
    PeerView,
    RunView,
    Slashed,
    StageMemory,
    Status,
)
from gwtf.api.services import NotReady
from gwtf.coordinator_free.protocol.config import DATA
from gwtf.coordinator_free.protocol.state import Peer
from gwtf.node.local_api.earnings import ChainView

if TYPE_CHECKING:  # what a snapshot reads; the box and its parts are plain data, read by the
    # command line too, which loads none of the node's runtime
    from gwtf.node.runtime.live_node import LiveNode
    from gwtf.node.runtime.roles.data import IterationResult

#: A throughput sample every snapshot; the rate is over the last minute of them.
RATE_WINDOW_S = 60.0
HISTORY_POINTS = 720


@dataclass(frozen=True)
class ChainParts:
    """What the chain watcher last read: epochs, runs, slashes (``gwtf.node.local_api.watcher``)."""

    view: ChainView
    runs: tuple[RunView, ...]
    slashes: tuple[Slashed, ...]
    claimed_wei: int
    claimable_wei: int
    next_claim_at: int | None = None  # chain time (``gwtf.node.local_api.earnings.next_claim_at``)
    node: NodeView | None = None  # None: not registered
    read_at: float = field(default_factory=time.time)  # unix time of the reading


@dataclass(frozen=True)
class NodeSnapshot:
    status: Status
    peers: tuple[PeerView, ...]
    flows: tuple[FlowView, ...]
    counters: dict[str, float]
    history: tuple[HistoryPoint, ...]
    chain: ChainParts | None


@dataclass
class SnapshotBox:
    """The latest snapshot, and the chain watcher's latest reading, for the API's threads."""

    snapshot: NodeSnapshot | None = None
    chain: ChainParts | None = None
    disk: DiskUse | None = None  # measured apart, every ``gwtf.node.local_api.disk.DISK_PERIOD_S``
    stopping: bool = False

    def get(self) -> NodeSnapshot:
        snapshot = self.snapshot
        if snapshot is None:
            raise NotReady("the node is starting: its host and worker are not up yet")
        return snapshot


@dataclass
class Meter:
    """Hops computed over time: the throughput figure and the dashboard's history."""

    started_at: float = field(default_factory=time.time)
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=4096))
    history: deque[HistoryPoint] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))

    def rate(self, now: float, computed: int) -> float:
        self.samples.append((now, computed))
        while self.samples and self.samples[0][0] < now - RATE_WINDOW_S:
            self.samples.popleft()
        first_t, first_n = self.samples[0]
        return (computed - first_n) / (now - first_t) if now > first_t else 0.0

    def hops_in_window(self) -> int:
        """Hops computed over the samples kept: the last ``RATE_WINDOW_S``."""
        return self.samples[-1][1] - self.samples[0][1] if self.samples else 0


def take_snapshot(node: LiveNode, box: SnapshotBox, meter: Meter) -> NodeSnapshot:
    from gwtf.node.receipts.book import address_of_peer
    from gwtf.node.runtime.roles.data import DataRole

    now = time.time()
    config, flow, plane, role = node.config, node.flow.node, node.plane, node.role
    timings = plane.timings
    throughput = meter.rate(now, timings.computed)
    loss = role.results[-1].loss if isinstance(role, DataRole) and role.results else None
    validated = _last_validation(role.results) if isinstance(role, DataRole) else None
    meter.history.append(
        HistoryPoint(
            t=now,
            throughput_hops_per_s=throughput,
            loss=loss,
            validation_loss=validated.validation_loss if validated else None,
        )
    )
    peers = tuple(_peer(node, p) for p in flow.peers.values())
    flows = _flows(node)
    receipts = node.receipts
    epoch = receipts.clock.epoch_now() if receipts is not None else None
    reach = node.reachability
    status = Status(
        name=config.name,
        node_address=address_of_peer(plane.node_id),
        peer_id=plane.node_id,
        listen=node.address,
        role=config.role,  # type: ignore[arg-type]
        stage=config.stage,
        stages=config.stages,
        run_id=config.run_id,
        region=config.region,
        health=_health(node, box, peers, meter),
        iteration=role.worker.step_count,
        epoch=epoch,
        peers_alive=sum(p.alive for p in peers),
        flows_in=sum(f.direction == "in" for f in flows),
        flows_out=sum(f.direction == "out" and f.peer_id is not None for f in flows),
        hops_computed=timings.computed,
        hops_recomputed=plane.hops.recomputed,
        throughput_hops_per_s=round(throughput, 3),
        loss=loss,
        validation_loss=validated.validation_loss if validated else None,
        validation_iteration=validated.iteration if validated else None,
        validation_verified=validated.validation_verified if validated else None,
        started_at=meter.started_at,
        updated_at=now,
        **next_claim(box.chain, now),
        disk=box.disk,
        reachable=reach.reachable if reach is not None else None,
        reachability=node.describe_reachability(),
        reachability_checked_at=reach.checked_ms / 1000 if reach is not None else None,
        memory=_memory(node),
    )
    chain = box.chain
    counters: dict[str, float] = {
        "hops_computed": timings.computed,
        "hops_recomputed": plane.hops.recomputed,
        "hops_sent": timings.sent,
        "bytes_sent": timings.bytes_sent,
        "bytes_received": timings.bytes_received,
        "queue_depth": timings.queue_depth,
        "sends_in_flight": timings.in_flight,
        "throughput_hops_per_second": throughput,
        "iteration": status.iteration,
        "peers_alive": status.peers_alive,
        "flows_in": status.flows_in,
        "flows_out": status.flows_out,
    }
    if loss is not None:
        counters["loss"] = loss
    if status.validation_loss is not None:
        counters["validation_loss"] = status.validation_loss
        counters["validation_verified"] = float(bool(status.validation_verified))
    if epoch is not None:
        counters["epoch"] = epoch
    if receipts is not None:
        counts = receipts.book.counts
        counters |= {
            "receipts_signed": counts.signed,
            "receipts_countersigned": counts.countersigned,
            "receipts_refused": counts.refused,
        }
    if chain is not None:
        counters["rewards_claimed_eth"] = chain.claimed_wei / 10**18
        counters["rewards_claimable_eth"] = chain.claimable_wei / 10**18
    history = tuple(meter.history)
    return NodeSnapshot(status, peers, flows, counters, history, chain)


def _memory(node: LiveNode) -> StageMemory | None:
    fit = node.memory
    if fit is None:
        return None
    part = fit.memory
    return StageMemory(
        weights_bytes=part.weights,
        gradients_bytes=part.gradients,
        optimizer_bytes=part.optimizer,
        activations_bytes=part.activations,
        activations_per_microbatch_bytes=part.activations_per_microbatch,
        in_flight=part.in_flight,
        total_bytes=part.total,
        budget_bytes=fit.budget,
        budget_source=fit.source,
    )


def _last_validation(results: Sequence[IterationResult]) -> IterationResult | None:
    """The latest iteration with a validation loss (results are in iteration order)."""
    return next((r for r in reversed(results) if r.validation_loss is not None), None)


def next_claim(chain: ChainParts | None, now: float) -> dict[str, int | None]:
    """``next_claim_at`` and how far off it is, on the chain's clock as last read moved on by
    the wall time since (a devnet's chain time may be far from the wall's)."""
    if chain is None or chain.next_claim_at is None:
        return {"next_claim_at": None, "next_claim_in_s": None}
    chain_now = chain.view.now + (now - chain.read_at)
    return {
        "next_claim_at": chain.next_claim_at,
        "next_claim_in_s": max(0, round(chain.next_claim_at - chain_now)),
    }


def _health(node: LiveNode, box: SnapshotBox, peers: tuple[PeerView, ...], meter: Meter) -> Health:
    from gwtf.node.runtime.roles.data import DataRole

    if box.stopping:
        return Health(status="stopping", detail="handing back its flows and closing")
    if not any(p.alive for p in peers):
        return Health(status="degraded", detail="no live peer: check bootstrap and reachability")
    role = node.role
    if isinstance(role, DataRole):
        why = data_node_idle(role.training, role.finished)
    else:
        why = relay_idle(meter.hops_in_window())
    return Health(status="idle", detail=why) if why is not None else Health(status="ok")


def data_node_idle(training: bool, finished: bool) -> str | None:
    """Why a data node trains nothing now (None: an iteration is under way or next). It
    knows: its iterations start once flows reach every stage and stop after the last."""
    if finished:
        return "its iterations are done; it serves its receipts and certificates"
    if not training:
        return "waiting for flows through every stage before its first iteration"
    return None


def relay_idle(recent_hops: int) -> str | None:
    """Why a relay trains nothing now (None: it computes hops). A relay only sees hops
    arrive, so it is idle after a minute without one: an iteration's hops reach every stage
    well within that, and a shorter window would flicker between iterations."""
    if recent_hops == 0:
        return "no hop computed in the last minute: no data node trains through it"
    return None


def _peer(node: LiveNode, peer: Peer) -> PeerView:
    from gwtf.node.receipts.book import address_of_peer

    own, stages = node.config.stage, node.config.stages
    stage = peer.stage
    place = "other"
    if stage == own:
        place = "same stage"
    elif stage == (own + 1) % (stages + 1):
        place = "downstream"
    elif stage == (own - 1) % (stages + 1):
        place = "upstream"
    record = node.book.peers.get(peer.peer_id)
    return PeerView(
        peer_id=peer.peer_id,
        node_address=address_of_peer(peer.peer_id),
        role="data" if peer.role == DATA else "relay",
        stage=stage,
        region=record.region if record is not None else "",
        alive=peer.alive,
        capacity=peer.capacity,
        spare=peer.spare,
        compute_ms=peer.compute_ms,
        latency_ms=peer.latency_ms,
        place=place,  # type: ignore[arg-type]
    )


def _flows(node: LiveNode) -> tuple[FlowView, ...]:
    flow = node.flow.node
    now = trio.current_time()  # the flow core's clock
    inbound = [
        FlowView(
            direction="in",
            flow_id=slot.flow_id,
            peer_id=slot.upstream,
            state="carrying",
            since_s=max(0.0, now - slot.since_s),
        )
        for slot in flow.in_slots.values()
    ]
    outbound = [
        FlowView(
            direction="out",
            flow_id=slot.flow_id,
            peer_id=slot.next_hop,
            state=slot.state.name.lower(),
            since_s=max(0.0, now - slot.since_s),
        )
        for slot in flow.out_slots.values()
    ]
    return tuple(inbound + outbound)
