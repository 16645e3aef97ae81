"""Control messages in the simulator: one ``Send`` carries many, each arrives on its own, and the
wake time a GWTF node keeps across messages is never later than a fresh one."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gwtf.coordinator_free.sim.engine import Engine
from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy
from gwtf.coordinator_free.sim.policy import Action, PolicyContractError, Send, WorldView
from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy
from tests.coordinator_free.sim_helpers import small_scenario


class _Broadcaster(RoundRobinPolicy):
    """At the start of the first iteration, d0 sends one Send with three messages."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        super().__init__()
        self.targets = targets
        self.delivered: list[tuple[str, str, object, float]] = []
        self.sent_at_s: float | None = None

    def on_iteration_start(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        if iteration != 0:
            return ()
        self.sent_at_s = now
        messages = [(target, f"hello {target}", 1_000) for target in self.targets]
        return (Send("d0", messages),)

    def on_message(
        self, world: WorldView, src: str, dst: str, payload: object, now: float
    ) -> Sequence[Action]:
        self.delivered.append((src, dst, payload, now))
        return ()


def test_one_send_delivers_each_of_its_messages_after_latency_and_transfer() -> None:
    scenario = small_scenario(relays_per_stage=2, stages=2, iterations=1, regions=2)
    policy = _Broadcaster(("r1_0", "r1_1", "r2_0"))
    engine = Engine(scenario, policy)
    metrics = engine.run()
    assert policy.sent_at_s is not None
    assert sorted(dst for _, dst, _, _ in policy.delivered) == ["r1_0", "r1_1", "r2_0"]
    for src, dst, payload, arrived_s in policy.delivered:
        assert src == "d0" and payload == f"hello {dst}"
        world = engine.world
        expected_s = world.latency_ms(src, dst) / 1000.0 + world.transfer_s(src, dst, 1_000)
        assert arrived_s - policy.sent_at_s == pytest.approx(expected_s, rel=1e-12)
    assert metrics.control_messages == 3
    assert metrics.control_bytes == 3_000


def test_a_message_to_an_unknown_node_is_a_contract_violation() -> None:
    scenario = small_scenario(relays_per_stage=2, stages=2, iterations=1)
    with pytest.raises(PolicyContractError, match="nobody"):
        Engine(scenario, _Broadcaster(("r1_0", "nobody"))).run()


class _KeptWakeChecked(GwtfPolicy):
    """GWTF that, after every message, compares the wake time the node kept with a fresh one."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0
        self.kept_early = 0

    def on_message(
        self, world: WorldView, src: str, dst: str, payload: object, now: float
    ) -> Sequence[Action]:
        actions = super().on_message(world, src, dst, payload, now)
        node = self.flow_nodes.get(dst)
        if node is not None and not node.left:
            kept_s = node.next_tick_s(now)
            fresh_s = node._compute_next_tick_s(now)  # reads state only (and fills cost caches)
            assert kept_s <= fresh_s + 1e-9, f"{dst} kept {kept_s}, fresh {fresh_s}"
            self.checked += 1
            self.kept_early += kept_s < fresh_s
        return actions


def test_the_wake_time_kept_across_messages_is_never_late() -> None:
    events = [{"t": 40.0, "node": "r2_1", "event": "crash"}]
    scenario = small_scenario(
        relays_per_stage=3, stages=2, data_nodes=2, iterations=20, regions=3, events=events
    )
    policy = _KeptWakeChecked()
    Engine(scenario, policy).run()
    assert policy.checked > 300
    assert policy.kept_early > 0  # the rules that keep it did apply
