"""A relay started without a stage takes the run's bottleneck, loads its state, and trains in it.

Stage 1 has three replicas and stage 2 one, and the data node needs four flows, which stage 2
can hold only half of: a relay with ``stage = -1`` asks the data node for the run's loads, picks
stage 2, downloads its weights, and takes hops; after the next step it is bit for bit the stage's
other replica, and training still reproduces the whole-model reference. (Placement weighs
capacity by each replica's speed, which in one process is noise: the relays here do not report
measured compute times.) A relay still reports as its load only the flows it passes on.
"""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from libp2p.peer.id import ID

from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.wire import FlowRequest, Hello
from gwtf.errors import ProtocolError
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import Handler, RequestResponse, RpcLimits
from gwtf.node.runtime import live_node
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.discovery.address_book import PeerRecord
from gwtf.node.runtime.discovery.join_placement import RESERVED_S, Reservations, choose_join_stage
from gwtf.node.runtime.live_node import _loads
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.settings import AUTO_STAGE
from gwtf.node.training.checkpoint import state_digest
from tests.runtime.swarm_harness import Swarm, node_config, reference_losses, run_relay, run_swarm

ITERATIONS = 24
BATCH = 4
LOAD_LIMITS = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 10.0)


async def no_compute_reports(*_args: object) -> None:
    """Compute times measured in one process (six nodes, one interpreter, two busy cores) varied
    threefold between equal relays, and placement weighs speed: the test keeps the settings'
    compute time so that flows and capacity decide (speed weighing is tested in the core)."""


@pytest.mark.slow  # ~10 s of live swarm
def test_a_relay_without_a_stage_joins_the_bottleneck_and_matches_its_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_node, "report_compute", no_compute_reports)
    swarm = Swarm()
    seen: dict[str, Any] = {}

    async def join_without_a_stage(swarm: Swarm) -> None:
        # Iteration 0 is over and stage 2 carries its whole capacity: the flows are in place
        # (on a loaded machine they can still be settling after the first iteration).
        while (
            "data" not in swarm.nodes
            or not swarm.nodes["data"].role.results
            or swarm.nodes["b1"].flow.node.spare > 0
        ):
            await trio.sleep(0.01)
        config = node_config(
            tmp_path,
            "joiner",
            "relay",
            AUTO_STAGE,
            join=True,
            bootstrap=(swarm.nodes["data"].address,),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_relay, config, swarm)
            await swarm.training_done.wait()
            joiner, replica = swarm.nodes["joiner"].role, swarm.nodes["b1"].role
            assert isinstance(joiner, RelayRole) and isinstance(replica, RelayRole)
            with trio.fail_after(30):  # a joiner that sat a round out loads the replicas' state
                while joiner.worker.step_count < replica.worker.step_count:
                    await trio.sleep(0.05)
            seen["stage"] = swarm.nodes["joiner"].config.stage
            seen["steps"] = (joiner.worker.step_count, replica.worker.step_count)
            seen["digests"] = {state_digest(joiner.worker), state_digest(replica.worker)}
            seen["hops"] = len(swarm.hops.get("joiner", []))
            nursery.cancel_scope.cancel()

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(150):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "a2": 1, "a3": 1, "b1": 2},
                join_without_a_stage,
                swarm,
                data_capacity=4,
            )

    results = trio.run(main)
    assert seen["stage"] == 2, "the joiner took the bottleneck stage"
    assert seen["steps"] == (ITERATIONS, ITERATIONS)
    assert len(seen["digests"]) == 1, "the joiner is bit for bit its stage's other replica"
    assert seen["hops"] > 0, "the joiner took traffic"
    assert [r.loss for r in results] == pytest.approx(reference_losses(ITERATIONS, BATCH), rel=1e-4)


def test_a_relay_reports_as_load_only_the_flows_it_passes_on() -> None:
    """A relay offering fewer slots than it has (slower than a same-stage peer) carries no flow
    in the ones it holds back, nor in one it cannot forward: a joiner reading its loads must
    not count them as carried."""
    node = FlowNode(
        NodeSpec("me", "relay", 1, 4, 1714.0),
        FlowConfig(stages=2, activation_bytes=1.0),
        random.Random(1),
    )
    node.handle("fast", Hello("relay", 1, 2, 4, 4, 0, 600.0, 0, True), 0.0)
    assert node.offered_slots() == 2
    flow = SimpleNamespace(node=node)
    book = SimpleNamespace(own=PeerRecord("me", "/ip4/127.0.0.1/tcp/1", "oregon"), peers={})
    own = next(e for e in _loads(flow, book) if e.peer_id == "me")  # type: ignore[arg-type]
    assert (own.capacity, own.spare) == (4, 4)
    # A flow it holds but cannot forward (no next hop yet) is not counted either.
    node.handle("upstream", Hello("data", 0, 2, 4, 4, 0, 100.0, 0, True), 0.0)
    node.handle("upstream", FlowRequest(1, "flow-1", ("upstream",), 50.0), 0.0)
    assert len(node.in_slots) == 1
    own = next(e for e in _loads(flow, book) if e.peer_id == "me")  # type: ignore[arg-type]
    assert (own.capacity, own.spare) == (4, 4)


def test_loads_replies_are_bounded_and_checked() -> None:
    entries = [
        control.LoadEntry(f"peer-{stage}-{i}", f"/ip4/127.0.0.1/tcp/{i}", stage, 2, 1, 50.0)
        for stage in range(3)
        for i in range(20)
    ]
    decoded = control.decode_loads(control.encode_loads(entries))
    assert len(decoded) == control.MAX_LOADS
    # Taken stage by stage in turn: every stage is seen however many replicas one has.
    assert {e.stage for e in decoded} == {0, 1, 2}
    assert control.decode_request(control.encode_request(control.Loads())) == control.Loads()
    for bad in (
        control.encode_reply(True),
        control.encode_reply(True, loads=[["peer", "/ip4/x", 1, 2, 0]]),
        control.encode_reply(True, loads=[["peer", "/ip4/x", -1, 2, 0, 5.0]]),
        control.encode_reply(True, loads=[["peer", "", 1, 2, 0, 5.0]]),
        control.encode_reply(True, loads=[["peer", "/ip4/x", 1, True, 0, 5.0]]),
        control.encode_reply(True, loads=[["peer", "/ip4/x", 1, 2, 0, 0.0]]),
        control.encode_reply(True, loads=[["peer", "/ip4/x", 1, 2, 0, "fast"]]),
        control.encode_reply(True, loads=[["peer", "/ip4/x", 1, 2, 0, 1e300]]),
        control.encode_reply(True, loads=[["p", "/a", 1, 1, 0, 5.0]] * (control.MAX_LOADS + 1)),
    ):
        with pytest.raises(ProtocolError):
            control.decode_loads(bad)


def test_what_a_peer_says_of_other_nodes_only_names_whom_to_ask(tmp_path: Path) -> None:
    """Real hosts on 127.0.0.1: a data node, one replica each of stages 1 and 2 (stage 2 the
    smaller), and a rogue that says it knows four more stage-2 replicas of large capacity, and
    names the real stage-2 replica at a dead address. The rogue's made-up replicas cannot be
    reached, the real one is found at the address another node names, so the joiner places
    itself by what the nodes it reached said of themselves, and takes stage 2."""

    def loads_of(*rows: control.LoadEntry) -> Handler:
        async def answer(_peer: str, _request: bytes) -> bytes:
            return control.encode_loads(list(rows))

        return answer

    async def main() -> str:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(new_identity()))
                for name in ("data", "a", "b", "rogue", "joiner")
            }
            ids = {name: str(host.get_id()) for name, host in hosts.items()}
            addr = {name: full_address(host) for name, host in hosts.items()}
            entry = {
                "data": control.LoadEntry(ids["data"], addr["data"], 0, 4, 4, 10.0),
                "a": control.LoadEntry(ids["a"], addr["a"], 1, 2, 1, 10.0),
                "b": control.LoadEntry(ids["b"], addr["b"], 2, 1, 0, 10.0),
            }
            fakes = []
            for _ in range(4):
                key = new_identity()
                fake = str(ID.from_pubkey(key.public_key))
                address = f"/ip4/127.0.0.1/tcp/9/p2p/{fake}"  # nothing listens there
                fakes.append(control.LoadEntry(fake, address, 2, 8, 8, 1.0))
            # And one that names a real node at another node's address, and one that names
            # the only stage-2 replica where nothing listens (heard before the honest address,
            # which only "a" names, a round later): neither may hide it.
            fakes.append(control.LoadEntry(ids["b"], addr["a"], 1, 4, -4, 1.0))
            fakes.append(
                control.LoadEntry(ids["b"], f"/ip4/127.0.0.1/tcp/9/p2p/{ids['b']}", 2, 2, 2, 1.0)
            )
            answers = {
                "data": loads_of(entry["data"], entry["a"]),
                "a": loads_of(entry["a"], entry["data"], entry["b"]),
                "b": loads_of(entry["b"], entry["a"]),
                "rogue": loads_of(*fakes, entry["a"]),
            }
            for name, answer in answers.items():
                RequestResponse(hosts[name]).serve(control.PROTOCOL_ID, answer, LOAD_LIMITS)
            joiner = RequestResponse(hosts["joiner"])
            with trio.fail_after(60):
                placement = await choose_join_stage(
                    joiner, (addr["rogue"], addr["data"]), stages=2, timeout_s=2.0
                )
            assert {e.peer_id for e in placement.replicas} == {ids["b"]}
            return placement.decision.reason

    reason = trio.run(main)
    assert reason.startswith(
        "stage 2 is the bottleneck: 1 live replica of capacity 1 for the 4 flows the run needs"
    ), reason


def load(peer: str, stage: int, capacity: int = 2) -> control.LoadEntry:
    return control.LoadEntry(peer, f"/ip4/127.0.0.1/tcp/1/p2p/{peer}", stage, capacity, 1, 100.0)


def test_relays_told_the_loads_together_are_told_of_each_other() -> None:
    """A data node notes the stage each relay it told the loads to will take, until it serves:
    two relays that start together take the two empty stages, not both the first."""
    reservations = Reservations(stages=2)
    run = [load("data", 0, capacity=4)]
    first = reservations.answer("relay-a", run, now=0.0)
    assert first == run  # nothing reserved yet; relay-a is given stage 1
    second = reservations.answer("relay-b", run, now=0.5)
    (joining,) = [e for e in second if e.address == control.JOINING_ADDRESS]
    assert (joining.peer_id, joining.stage, joining.capacity) == ("relay-a", 1, 1)
    # relay-b, counting relay-a as stage 1's, takes stage 2; a third asker hears of both.
    third = reservations.answer("relay-c", run, now=1.0)
    assert sorted(e.stage for e in third if e.address == control.JOINING_ADDRESS) == [1, 2]
    # A relay that serves is counted as itself, and a reservation lapses after RESERVED_S.
    serving = [*run, load("relay-a", 1)]
    again = reservations.answer("relay-d", serving, now=2.0)
    assert [e.peer_id for e in again if e.address == control.JOINING_ADDRESS] == [
        "relay-b",
        "relay-c",
    ]
    late = reservations.answer("relay-e", serving, now=3.0 + RESERVED_S)
    assert not [e for e in late if e.address == control.JOINING_ADDRESS]
