"""A receiver that withholds its countersignature in a live in-process swarm: relay ``b1``
(stage 2) acknowledges every hop and refuses every batch its workers close. The stage-1 relay
stops sending it forwards for the rest of the iteration (its other replica ``b2`` takes them),
scores it down, and the training goes on to the reference losses; what it sent ``b1`` is
unpaid and signed only in batches ``b1`` never countersigned, so nothing of it is certified or
slashable, and no hop is in two batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.node.receipts.batching import BatchSettings
from gwtf.node.receipts.book import address_of_peer
from gwtf.node.store.batches import WORKER, BatchRefused
from tests.runtime.receipt_tap import ReceiptTap
from tests.runtime.swarm_harness import Swarm, identity_for, reference_losses, run_swarm

ITERATIONS = 2
BATCH = 4
RELAYS = {"a1": 1, "b1": 2, "b2": 2}


@pytest.mark.slow  # ~15 s of live swarm
def test_a_receiver_withholding_its_countersignature_is_stopped_and_training_goes_on(
    tmp_path: Path,
) -> None:
    # A batch closes after every hop: a1 learns within the iteration that b1 withholds.
    settings = BatchSettings(max_hops=1, max_age_s=0.2, close_timeout_s=5.0)
    tap = ReceiptTap(tmp_path, 2, lambda name: identity_for(tmp_path, name), settings=settings)
    swarm = Swarm(tap)
    sent_to_b1_after_refusal: list[int] = []

    async def withhold(swarm: Swarm) -> None:
        while "b1" not in tap.books or "a1" not in swarm.nodes:
            await trio.sleep(0.01)

        def refuse(*_: object) -> bytes:
            raise BatchRefused("withheld on purpose")

        tap.books["b1"].batches.countersign = refuse  # type: ignore[method-assign]
        a1 = tap.books["a1"]
        b1 = swarm.nodes["b1"].plane.node_id
        sender = swarm.nodes["a1"].role.sender  # type: ignore[union-attr]
        next_hop = sender.next_hop

        def noting(*args: object, **kwargs: object) -> str | None:
            to = next_hop(*args, **kwargs)  # type: ignore[arg-type]
            if to == b1 and not a1.withholders.may_send(b1):
                sent_to_b1_after_refusal.append(1)
            return to

        sender.next_hop = noting  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(150):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, withhold, swarm)

    results = trio.run(main)
    assert [r.loss for r in results] == pytest.approx(
        reference_losses(ITERATIONS, BATCH), rel=1e-4
    ), "the training goes on"
    b1 = swarm.nodes["b1"].plane.node_id
    assert b1 in {peer for peer, _ in tap.charged}, "scored down"
    assert sent_to_b1_after_refusal == [], "no forward to it for the rest of the iteration"
    b1_address = address_of_peer(b1)
    certified = tap.certified()
    assert certified and all(p.entry.receipt.counterparty != b1_address for p in certified)
    # Nothing of a1's is signed twice: each hop key in one batch at most.
    a1 = tap.books["a1"]
    keys = [k for b in a1.store.batches(1, 0, WORKER, complete=False) for k in b.hop_keys]
    assert len(keys) == len(set(keys))
    assert not [b for b in a1.store.batches(1, 0, WORKER) if b.batch.counterparty == b1_address]
