"""The live data plane and the simulator's GWTF policy decide a forward's next hop (the last
stage's sink, the microbatch's origin, included), its re-send after a missed ack (a relay's, and
a data node's, which keeps the microbatch's flow), a data node's first hop, a dead hop's
stand-in and a data node's flow for its next microbatch alike:
at every such decision of a simulated run with crashes, the live node's ``HopSender`` or
``FlowPool`` over the same flow core (same view, same event, the same state of its random
generator) gives the decision the simulator's adapter gives. The flows the live pool chooses
among are the simulator's free ones (in reverse order: the pool's order must not matter); which
flows count as free is each side's own bookkeeping.

Relays do not rejoin here: a relay that came back at another stage is a peer the simulator's
view leaves out (the live receiver refuses the hop and the sender drops it from its view), a
difference of what each side knows, not of the rule.

Each node's live sender lives through the run and counts its detours in flight as it does
live (``HopSender.detour`` around each send, ended by the ack, the missed ack or the
microbatch given up), fed the simulator's sends: a side that did not count them would rank
peers differently, and the trace shows decisions that the counts changed.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest

from gwtf.coordinator_free.decisions import Onward, hop_view, next_hop
from gwtf.coordinator_free.protocol import FlowNode
from gwtf.coordinator_free.sim import gwtf_policy
from gwtf.coordinator_free.sim.engine import run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.sim.policy import (
    Forward,
    HopDecision,
    HopReport,
    MicrobatchView,
    RepairDecision,
    WorldView,
)
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.runtime.roles.flow_pool import Flow, FlowPool


def live_sender(node: FlowNode, stages: int) -> HopSender:
    """The live node's hop sender over ``node``'s flow core; nothing is ever sent."""
    unused: Any = None
    plane = DataPlane(unused, node.node_id, 1, stages, 20.0, 1 << 20)
    return HopSender(plane, FlowService(unused, node, tick_s=2.0), HopStats(), None)


@dataclass(frozen=True)
class Decision:
    # "forward" (on or off a flow), "sink" (past the last stage), "resend" (a relay's),
    # "first" and "data-resend" (a data node's first send and re-send), "stand-in", "flow"
    # (on_flow: a loan)
    event: str
    node: str
    on_flow: bool
    live: str | None
    sim: str | None


class ReplayingPolicy(GwtfPolicy):
    """GWTF in the simulator that, at each decision, asks the live adapter too."""

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[Decision] = []
        self._route: tuple[str, int] | None = None  # the route of the last forward decided
        self._repairing: tuple[FlowNode, int, int] | None = None  # node, stages, dead stage
        self._live: dict[str, HopSender] = {}  # each relay's live sender, kept through the run
        self._sending: dict[tuple[str, int], tuple[str, ExitStack]] = {}  # (node, mb) -> to
        self.counted = 0  # decisions the live detour counts changed

    def live(self, node: FlowNode, stages: int) -> HopSender:
        sender = self._live.get(node.node_id)
        if sender is None or sender.flow.node is not node:
            sender = self._live[node.node_id] = live_sender(node, stages)
        return sender

    def _live_send(
        self, node: FlowNode, stages: int, mb_id: int, to: str, route: tuple[str, int] | None
    ) -> None:
        """The live sender sends ``mb_id``'s forward to ``to`` (it ends an earlier one)."""
        self._live_ended(node.node_id, mb_id)
        stack = ExitStack()
        stack.enter_context(self.live(node, stages).detour(node.next_stage, to, route))
        self._sending[(node.node_id, mb_id)] = (to, stack)

    def _live_ended(self, node_id: str, mb_id: int, to: str | None = None) -> None:
        sending = self._sending.get((node_id, mb_id))
        if sending is not None and (to is None or sending[0] == to):
            del self._sending[(node_id, mb_id)]
            sending[1].close()

    def _onward(
        self,
        world: WorldView,
        node: FlowNode,
        mb: MicrobatchView,
        route: tuple[str, int] | None,
        exclude: tuple[str, ...] = (),
    ) -> Onward | None:
        """Every forward's next hop the simulator routes by ``next_hop`` (a relay's first send,
        any node's re-send, the last stage's sink), beside the live sender's."""
        sender = self.live(node, world.stages)
        stage = node.spec.stage + 1  # the hop's stage (S + 1: the sink), as the live header's
        if exclude:
            resent = sender.resend_to(stage, route, set(exclude), mb.origin)
            live = None if resent is None else resent.to
            event = "data-resend" if node.is_data else "resend"
        else:
            live = sender.next_hop(stage, route, mb.origin)
            event = "sink" if node.next_stage == 0 else "forward"
        uncounted = next_hop(hop_view(node, route, origin=mb.origin), exclude)
        self.counted += live != (None if uncounted is None else uncounted.to)
        onward = super()._onward(world, node, mb, route, exclude)
        sim = None if onward is None else onward.to
        self.trace.append(Decision(event, node.node_id, route is not None, live, sim))
        self._route = route
        return onward

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        self._route = None
        decision = super().choose_next_hop(world, node_id, mb, now)
        node = self._nodes[node_id]
        if isinstance(decision, Forward):
            if node.is_data:  # its flow's first hop, or off any flow after waiting for one
                self._route = self._source_route(node, self._hop_slot[mb.mb_id])
                live = self.live(node, world.stages).next_hop(1, self._route)
                on_flow = self._route is not None
                self.trace.append(Decision("first", node_id, on_flow, live, decision.to))
            self._live_send(node, world.stages, mb.mb_id, decision.to, self._route)
        return decision

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Any]:
        if report.direction == "forward":
            self._live_ended(report.sender, report.mb_id, report.receiver)
        return super().on_hop_acked(world, report, now)

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._live_ended(node_id, mb.mb_id, suspect)  # the live send failed
        self._route = None
        decision = super().on_forward_timeout(world, node_id, mb, suspect, now)
        if isinstance(decision, Forward):
            self._live_send(self._nodes[node_id], world.stages, mb.mb_id, decision.to, self._route)
        return decision

    def _forget(self, mb_id: int, keep_flow: bool = False) -> None:
        for node_id, sent_mb in list(self._sending):
            if sent_mb == mb_id:
                self._live_ended(node_id, mb_id)
        super()._forget(mb_id, keep_flow)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._repairing = (self._nodes[node_id], world.stages, mb.stage - 1)
        try:
            return super().on_backward_timeout(world, node_id, mb, suspect, now)
        finally:
            self._repairing = None

    def _free_flow(
        self, node: FlowNode, flows: dict[tuple[str, int], str | None], waited_periods: float
    ) -> tuple[str, int] | None:
        pool = FlowPool(FlowService(cast(Any, None), node, tick_s=2.0))
        free = [key for key in flows if key not in self._busy]
        pool._free = [Flow(slot, "" if owner == node.node_id else owner) for owner, slot in free]
        pool._free.reverse()
        picked = pool._pop_free(waited_periods)
        live = None if picked is None else f"{picked.lender or node.node_id}/{picked.slot}"
        chosen = super()._free_flow(node, flows, waited_periods)
        sim = None if chosen is None else f"{chosen[0]}/{chosen[1]}"
        lent = chosen is not None and chosen[0] != node.node_id
        self.trace.append(Decision("flow", node.node_id, lent, live, sim))
        return chosen

    def stand_in(
        self, candidates: Sequence[str], exclude: Collection[str], rng: random.Random
    ) -> str | None:
        """The simulator adapter's stand-in, beside the live one from the same generator state."""
        assert self._repairing is not None
        node, stages, stage = self._repairing
        state = rng.getstate()
        live = self.live(node, stages).stand_in(stage, set(exclude))
        rng.setstate(state)
        sim = _core_stand_in(candidates, exclude, rng)
        self.trace.append(Decision("stand-in", node.node_id, False, live, sim))
        return sim


_core_stand_in = gwtf_policy.stand_in


def test_live_and_simulated_adapters_decide_every_hop_of_a_churned_run_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenario = build_scenario(GridCell(True, True, 3.0), 15, GridSize(iterations=12))
    scenario = replace(scenario, churn=replace(scenario.churn, rejoin=False))
    policy = ReplayingPolicy()
    monkeypatch.setattr(gwtf_policy, "stand_in", policy.stand_in)
    metrics = run_scenario(scenario, policy)
    assert metrics.crashes > 0 and metrics.iterations_completed == 12

    differing = [d for d in policy.trace if d.live != d.sim]
    assert differing == []
    kinds = Counter((d.event, d.on_flow) for d in policy.trace)
    # The trace covers every rule: on a flow, off one, the sink, re-sends at relays and data
    # nodes (on the microbatch's flow and off it) and stand-ins.
    assert kinds[("forward", True)] > 100
    assert kinds[("forward", False)] > 0
    assert kinds[("resend", False)] + kinds[("resend", True)] > 0
    assert kinds[("data-resend", False)] + kinds[("data-resend", True)] > 0
    assert kinds[("data-resend", False)] > 0 and kinds[("data-resend", True)] > 0
    assert kinds[("first", True)] > 100 and kinds[("sink", True)] + kinds[("sink", False)] > 100
    assert kinds[("stand-in", False)] > 0
    assert kinds[("flow", False)] > 10 and kinds[("flow", True)] > 0
    # Detours in flight changed where some forwards went: both sides counted them alike.
    assert policy.counted > 0
