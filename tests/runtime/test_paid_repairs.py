"""Every hop a live relay trains is paid, the hops the swarm repairs and redoes included.

Each node of an in-process swarm keeps real receipts (``tests/runtime/receipt_tap.py``); relays
die holding hops, the swarm repairs or redoes what they held, and every hop a surviving relay
computed has a receipt its data node certifies: signed by its worker, countersigned by the node
it came from or went to, chained from the data node's own sends. Nothing is paid twice: one
certified receipt per computation (worker, microbatch, stage, direction, input).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import trio

from node.runtime.dataplane.hop import BACKWARD, FORWARD
from node.runtime.roles.relay import RelayRole
from tests.runtime.receipt_tap import ReceiptTap, _computation
from tests.runtime.swarm_harness import Swarm, identity_for
from tests.runtime.test_gradient_redo import data_role, run_with_kill
from tests.runtime.test_stall_repair import BACKWARD_CRASHES, FORWARD_CRASHES, run_with_crashes


def tapped(tmp_path: Path, stages: int = 2) -> tuple[Swarm, ReceiptTap]:
    tap = ReceiptTap(tmp_path, stages, lambda name: identity_for(tmp_path, name))
    return Swarm(tap), tap


def assert_every_hop_paid_once(swarm: Swarm, tap: ReceiptTap) -> Counter[tuple[int, int]]:
    """Every hop a live relay computed is certified, each computation once; the certified
    hops by (stage, direction) of attempts past the first (the repaired and redone ones)."""
    dead = {swarm.nodes[name].plane.node_id for name in swarm.crashed}
    assert tap.computed and tap.unpaid(dead) == set()
    certified = tap.certified()
    assert len({_computation(p) for p in certified}) == len(certified), "each paid once"
    return Counter(
        (p.entry.receipt.stage, p.entry.receipt.direction)
        for p in certified
        if p.entry.receipt.attempt > 0
    )


def test_a_gradient_sent_around_a_dead_relay_pays_the_stand_ins_forward_and_backward(
    tmp_path: Path,
) -> None:
    # The stand-in recomputes the dead relay's forward (its output stays with it) and then
    # the gradient: both are paid.
    swarm, tap = tapped(tmp_path)
    run_with_crashes(tmp_path, BACKWARD_CRASHES, swarm=swarm)
    repaired = assert_every_hop_paid_once(swarm, tap)
    assert repaired[(1, FORWARD)] + repaired[(2, FORWARD)] >= 2, repaired


def test_a_forward_resumed_past_a_dead_relay_is_paid_along_its_new_path(tmp_path: Path) -> None:
    swarm, tap = tapped(tmp_path)
    run_with_crashes(tmp_path, FORWARD_CRASHES, swarm=swarm)
    assert_every_hop_paid_once(swarm, tap)


def test_a_gradient_redone_on_a_live_replica_is_paid(tmp_path: Path) -> None:
    """A stage-2 relay dies once a gradient it computed in iteration 1 is delivered; what it
    held is redone on the other replica at the end (forward and backward), and paid."""
    relays = {"a1": 1, "a2": 1, "b1": 2, "b2": 2}
    swarm, tap = tapped(tmp_path)
    died: list[str] = []

    async def kill(swarm: Swarm) -> None:
        await data_role(swarm, relays)
        while not died:
            for name in ("b1", "b2"):
                role = swarm.nodes[name].role
                assert isinstance(role, RelayRole)
                delivered = [r for (i, _), r in role.sender.passed.items() if i == 1 and r.sent_to]
                if delivered:
                    died.append(name)
                    swarm.crash(name)
                    break
            await trio.sleep(0.002)

    results = run_with_kill(tmp_path, 2, relays, kill, swarm)
    assert results[1].gradients_redone >= 1
    redone = assert_every_hop_paid_once(swarm, tap)
    assert redone[(2, FORWARD)] >= 1 and redone[(2, BACKWARD)] >= 1, redone
