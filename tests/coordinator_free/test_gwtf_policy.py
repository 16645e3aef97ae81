"""GWTF in the simulator: the pure core driven by the engine's ticks, messages and deadlines."""

from __future__ import annotations

from gwtf.coordinator_free.protocol.state import SlotState
from gwtf.coordinator_free.sim.engine import Engine, run_scenario
from gwtf.coordinator_free.sim.generator import GridCell, GridSize, build_scenario
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.sim.policy import Hold, MicrobatchView, Replace, Restart
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from gwtf.coordinator_free.sim.scenario import parse_scenario
from tests.coordinator_free.sim_helpers import scenario_document, small_scenario


def test_a_quiet_swarm_trains_every_microbatch_with_no_waste_and_no_repair() -> None:
    scenario = small_scenario(relays_per_stage=3, stages=2, data_nodes=2, iterations=20)
    metrics = run_scenario(scenario, GwtfPolicy())
    assert metrics.stopped_reason == "finished"
    assert metrics.iterations_completed == 20
    assert metrics.microbatches_completed == metrics.microbatches_injected == 160
    assert metrics.wasted_gpu_s == 0.0
    assert metrics.restarts == metrics.replacements == metrics.forward_timeouts == 0
    assert metrics.control_messages > 0


def test_the_same_scenario_gives_the_same_run() -> None:
    def run() -> tuple[float, int, int]:
        scenario = small_scenario(relays_per_stage=3, stages=2, data_nodes=2, iterations=10)
        metrics = run_scenario(scenario, GwtfPolicy())
        return metrics.sim_time_s, metrics.control_messages, metrics.control_bytes

    assert run() == run()


def test_with_slow_relays_in_three_regions_it_beats_cost_blind_round_robin() -> None:
    speeds = [1.0, 0.35, 1.0, 0.35, 1.0, 0.35]

    def scenario():  # type: ignore[no-untyped-def]
        return small_scenario(
            relays_per_stage=3, stages=2, data_nodes=2, iterations=40, speeds=speeds, regions=3
        )

    gwtf = run_scenario(scenario(), GwtfPolicy())
    blind = run_scenario(scenario(), RoundRobinPolicy())
    assert gwtf.iterations_completed == blind.iterations_completed == 40
    assert gwtf.sim_time_s < blind.sim_time_s


def test_a_crashed_relay_is_routed_around_and_no_flow_points_at_it() -> None:
    crash = [{"t": 40.0, "node": "r1_0", "event": "crash"}]
    scenario = small_scenario(
        relays_per_stage=3, stages=2, data_nodes=2, iterations=60, events=crash
    )
    policy = GwtfPolicy()
    engine = Engine(scenario, policy)
    metrics = engine.run()
    assert metrics.stopped_reason == "finished"
    assert metrics.crashes == 1
    assert metrics.microbatches_completed == metrics.microbatches_injected
    for node_id, node in policy.flow_nodes.items():
        if node_id == "r1_0" or not engine.world.nodes[node_id].alive:
            continue
        for out in node.out_slots.values():
            assert not (out.next_hop == "r1_0" and out.state is not SlotState.UNMATCHED)


def test_a_joining_relay_without_a_stage_goes_to_the_bottleneck() -> None:
    document = scenario_document(relays_per_stage=2, stages=3, data_nodes=1, iterations=15)
    for node in document["nodes"]:
        if node["id"] == "r3_1":
            node["capacity"] = 1  # stage 3 holds the least
    joiner = dict(document["nodes"][-1], id="joiner", stage=None)
    document["nodes"].append(joiner)
    document["churn"]["events"] = [{"t": 20.0, "node": "joiner", "event": "join"}]
    engine = Engine(parse_scenario(document), GwtfPolicy())
    metrics = engine.run()
    assert metrics.joins == 1
    assert engine.world.stage_of("joiner") == 3
    assert metrics.stopped_reason == "finished"


def test_heavy_churn_with_relays_returning_at_other_stages_finishes() -> None:
    # 100 %/h: relays crash and come back, often at another stage. In this run a hop sent to a
    # crashed relay once landed in its next life, at stage 4, which then passed a stage-3 output
    # to a data node (a policy contract error): a new life now has a new incarnation number,
    # and a repair whose replacement died or moved during the probe is lost, not computed.
    scenario = build_scenario(GridCell(True, True, 1.0), 2, GridSize(iterations=30))
    metrics = run_scenario(scenario, GwtfPolicy())
    assert metrics.stopped_reason == "finished"
    assert metrics.crashes >= 5 and metrics.joins >= 3
    assert metrics.iterations_completed == 30


def test_a_link_s_bandwidth_is_known_only_once_an_activation_went_over_it() -> None:
    """The oracle-free adapter measures latency on first contact and bandwidth on the first
    activation sent; the ``gwtf-oracles`` ablation knows both at first contact."""

    def links(oracles: bool) -> tuple[int, int]:
        scenario = small_scenario(
            relays_per_stage=3, stages=2, data_nodes=2, iterations=5, regions=3
        )
        policy = GwtfPolicy(oracles=oracles)
        engine = Engine(scenario, policy)
        assert engine.run().stopped_reason == "finished"
        measured = unmeasured = 0
        for node_id, node in policy.flow_nodes.items():
            for peer_id, peer in node.peers.items():
                if peer.latency_ms is None:
                    continue
                assert peer.latency_ms == engine.world.latency_ms(node_id, peer_id)
                if peer.bandwidth_gbps is None:
                    unmeasured += 1
                else:
                    assert peer.bandwidth_gbps == engine.world.bandwidth_gbps(node_id, peer_id)
                    measured += 1
        return measured, unmeasured

    measured, unmeasured = links(oracles=False)
    assert measured > 0 and unmeasured > 0, "only the links that carried an activation"
    assert links(oracles=True)[1] == 0


def test_a_joiner_asks_a_sample_of_the_members_and_only_the_live_answer() -> None:
    document = scenario_document(relays_per_stage=2, stages=3, data_nodes=1, iterations=30)
    for node in document["nodes"]:
        if node["id"] == "r3_1":
            node["capacity"] = 1  # stage 3 holds the least, were r2_0 alive
    joiner = dict(document["nodes"][-1], id="joiner", stage=None)
    document["nodes"].append(joiner)
    # r2_0 stops ticking longer ago than a live node's quietest spell when the joiner asks.
    document["churn"]["events"] = [
        {"t": 5.0, "node": "r2_0", "event": "crash"},
        {"t": 40.0, "node": "joiner", "event": "join"},
    ]
    for oracles in (False, True):
        engine = Engine(parse_scenario(document), GwtfPolicy(oracles=oracles))
        metrics = engine.run()
        assert metrics.joins == 1 and metrics.stopped_reason == "finished"
        # r2_0 is still a member (its announcement has not expired) but does not answer.
        assert "r2_0" in engine.world.nodes_in_stage(2)
        assert engine.world.stage_of("joiner") == 2, oracles


def test_trainers_under_heavy_churn_route_around_dead_and_moved_relays_without_stalling() -> None:
    # 32 trainers of batch 1 at 300 %/h (the sweep's cell). A trainer with no flow waits 10
    # periods and then sends off-flow; such a hop to a relay that died unseen was cut by the
    # watchdog, counted from the wait, before its own deadline could tell the trainer, which then
    # picked the same dead relay again and again (25 stalls here). A trainer whose only known
    # stage-1 relay came back at stage 4 held its microbatch for ~700 s, never looking up
    # another (1,050 s here).
    size = GridSize(iterations=8, trainers_per_data_node=8)
    scenario = build_scenario(GridCell(True, True, 3.0), 12, size)
    metrics = run_scenario(scenario, GwtfPolicy())
    assert metrics.stopped_reason == "finished"
    assert metrics.stalls <= 5
    assert metrics.sim_time_s < 450.0


def test_the_watchdog_waits_on_a_hop_a_recovery_sent_within_its_deadline_three_times() -> None:
    policy = GwtfPolicy()
    world = Engine(small_scenario(), policy).world
    mb = MicrobatchView(1, "d0", 0, 0, 1, "forward", ("r1_0", None), None)
    assert isinstance(policy.on_stall(world, mb, 40.0), Restart), "no recovery: start over"
    policy._recovered(1, 100.0)  # a re-sent forward, or a repair after its probe
    assert isinstance(policy.on_stall(world, mb, 125.0), Restart), "its deadline has passed"
    policy._recovered(1, 200.0)
    assert [type(policy.on_stall(world, mb, 210.0)) for _ in range(4)] == [Hold] * 3 + [Restart]


def test_the_last_stage_sends_each_microbatch_to_its_origin_as_the_live_relay_does() -> None:
    """Only the origin holds the embedding a microbatch's gradient ends in (``HopView.origin``):
    the flow's own sink, the cheapest data node, is not followed past the last stage."""
    sinks: list[tuple[str, str]] = []

    class Watched(GwtfPolicy):
        def choose_next_hop(self, world, node_id, mb, now):  # type: ignore[no-untyped-def]
            decision = super().choose_next_hop(world, node_id, mb, now)
            if world.stage_of(node_id) == world.stages and hasattr(decision, "to"):
                sinks.append((mb.origin, decision.to))
            return decision

    scenario = small_scenario(relays_per_stage=3, stages=2, data_nodes=3, iterations=6)
    assert run_scenario(scenario, Watched()).stopped_reason == "finished"
    assert len(sinks) >= 6 * 8 and all(origin == to for origin, to in sinks)


def test_a_microbatch_started_over_keeps_its_flow_as_the_live_data_node_retries_on_it() -> None:
    """The flow stays busy while the microbatch starts over and it starts on that flow again."""
    restarted: list[tuple[tuple[str, int], tuple[str, int] | None, bool]] = []
    kept: dict[int, tuple[str, int]] = {}

    class Watched(GwtfPolicy):
        def _forget(self, mb_id: int, keep_flow: bool = False) -> None:
            held = self._source_slot.get(mb_id)
            super()._forget(mb_id, keep_flow)
            if keep_flow and held is not None:
                kept[mb_id] = held
                restarted.append((held, None, self._busy.get(held) == mb_id))

        def _inject_on_flow(self, world, node, mb, now):  # type: ignore[no-untyped-def]
            decision = super()._inject_on_flow(world, node, mb, now)
            if mb.mb_id in kept and not isinstance(decision, Hold):
                restarted.append((kept.pop(mb.mb_id), self._source_slot.get(mb.mb_id), True))
            return decision

    size = GridSize(iterations=8, trainers_per_data_node=8)
    metrics = run_scenario(build_scenario(GridCell(True, True, 3.0), 13, size), Watched())
    assert metrics.restarts > 0 and len(restarted) >= 2
    assert all(busy for _, _, busy in restarted), "the flow was freed while it started over"
    assert all(after in (None, held) for held, after, _ in restarted)
    assert any(after == held for held, after, _ in restarted)


def test_a_dead_backward_hop_is_repaired_after_the_stalled_node_s_own_ask_as_live() -> None:
    """``HopSender._around``: the node that could not send the gradient asks the hop before the
    dead one itself; no probe by the data node comes first."""
    repairs: list[tuple[float, float]] = []

    class Watched(GwtfPolicy):
        def on_backward_timeout(self, world, node_id, mb, suspect, now):  # type: ignore[no-untyped-def]
            decision = super().on_backward_timeout(world, node_id, mb, suspect, now)
            if isinstance(decision, Replace):
                path = (mb.origin, *mb.path)
                upstream = path[decision.stage - 1]
                repairs.append((decision.delay_s, world.latency_ms(node_id, upstream) / 1000.0))
            return decision

    scenario = build_scenario(GridCell(True, True, 3.0), 15, GridSize(iterations=12))
    assert run_scenario(scenario, Watched()).stopped_reason == "finished"
    assert repairs and all(delay == ask for delay, ask in repairs)
    assert all(delay < 1.0 for delay, _ in repairs)
