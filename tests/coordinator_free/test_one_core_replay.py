"""The live data plane and the simulator's GWTF policy decide a forward's next hop, its re-send
after a missed ack, a dead hop's stand-in and a data node's flow for its next microbatch alike:
at every such decision of a simulated run with crashes, the live node's ``HopSender`` or
``FlowPool`` over the same flow core (same view, same event, the same state of its random
generator) gives the decision the simulator's adapter gives. The flows the live pool chooses
among are the simulator's free ones (in reverse order: the pool's order must not matter); which
flows count as free is each side's own bookkeeping.

Relays do not rejoin here: a relay that came back at another stage is a peer the simulator's
view leaves out (the live receiver refuses the hop and the sender drops it from its view), a
difference of what each side knows, not of the rule. The last stage is left out: live, its
forward goes to the microbatch's origin, in the simulator along the flow to any data node.

Each relay's live sender lives through the run and counts its detours in flight as it does
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

from gwtf.coordinator_free.decisions import hop_view, next_hop
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
    event: str  # "forward" (on or off a flow), "resend", "stand-in", "flow" (on_flow: a loan)
    node: str
    on_flow: bool
    live: str | None
    sim: str | None


class ReplayingPolicy(GwtfPolicy):
    """GWTF in the simulator that, at each decision, asks the live adapter too."""

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[Decision] = []
        self._suspect: str | None = None
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

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        node = self._nodes[node_id]
        if node.is_data or node.spec.stage == world.stages:
            return super().choose_next_hop(world, node_id, mb, now)
        header = self._hop_slot.get(mb.mb_id)
        route = None if header is None else node.route(*header)
        sender = self.live(node, world.stages)
        exclude = () if self._suspect is None else (self._suspect,)
        if self._suspect is None:
            live = sender.next_hop(node.next_stage, route)
            event = "forward"
        else:
            onward = sender.resend_to(node.next_stage, route, {self._suspect})
            live = None if onward is None else onward.to
            event = "resend"
        uncounted = next_hop(hop_view(node, route), exclude)
        self.counted += live != (None if uncounted is None else uncounted.to)
        decision = super().choose_next_hop(world, node_id, mb, now)
        sim = decision.to if isinstance(decision, Forward) else None
        self.trace.append(Decision(event, node_id, route is not None, live, sim))
        if isinstance(decision, Forward):
            self._live_send(node, world.stages, mb.mb_id, decision.to, route)
        return decision

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Any]:
        if report.direction == "forward":
            self._live_ended(report.sender, report.mb_id, report.receiver)
        return super().on_hop_acked(world, report, now)

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        self._live_ended(node_id, mb.mb_id, suspect)  # the live send failed
        self._suspect = suspect
        try:
            decision = super().on_forward_timeout(world, node_id, mb, suspect, now)
        finally:
            self._suspect = None
        node, sending = self._nodes[node_id], self._sending.get((node_id, mb.mb_id))
        to = decision.to if isinstance(decision, Forward) and not node.is_data else None
        if to is not None and (sending is None or sending[0] != to):  # past choose_next_hop
            self._live_send(node, world.stages, mb.mb_id, to, None)
        return decision

    def _forget(self, mb_id: int) -> None:
        for node_id, sent_mb in list(self._sending):
            if sent_mb == mb_id:
                self._live_ended(node_id, mb_id)
        super()._forget(mb_id)

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        self._repairing = (self._nodes[node_id], world.stages, mb.stage - 1)
        try:
            return super().on_backward_timeout(world, node_id, mb, suspect, now)
        finally:
            self._repairing = None

    def _free_flow(
        self,
        node: FlowNode,
        source: dict[int, tuple[str, str]],
        routes: dict[tuple[str, int], str],
        loans: dict[tuple[str, int], str],
    ) -> tuple[str, int] | None:
        free = [key for key in [*routes, *loans] if key not in self._busy]
        pool = FlowPool(FlowService(cast(Any, None), node, tick_s=2.0))
        pool._free = [Flow(slot, "" if owner == node.node_id else owner) for owner, slot in free]
        pool._free.reverse()
        picked = pool._pop_free()
        live = None if picked is None else f"{picked.lender or node.node_id}/{picked.slot}"
        chosen = super()._free_flow(node, source, routes, loans)
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
    scenario = build_scenario(GridCell(True, True, 3.0), 11, GridSize(iterations=12))
    scenario = replace(scenario, churn=replace(scenario.churn, rejoin=False))
    policy = ReplayingPolicy()
    monkeypatch.setattr(gwtf_policy, "stand_in", policy.stand_in)
    metrics = run_scenario(scenario, policy)
    assert metrics.crashes > 0 and metrics.iterations_completed == 12

    differing = [d for d in policy.trace if d.live != d.sim]
    assert differing == []
    kinds = Counter((d.event, d.on_flow) for d in policy.trace)
    # The trace covers every rule: on a flow, off one, re-sends and stand-ins.
    assert kinds[("forward", True)] > 100
    assert kinds[("forward", False)] > 0
    assert kinds[("resend", False)] + kinds[("resend", True)] > 0
    assert kinds[("stand-in", False)] > 0
    assert kinds[("flow", False)] > 10 and kinds[("flow", True)] > 0
    # Detours in flight changed where some forwards went: both sides counted them alike.
    assert policy.counted > 0
