"""The spans a certificate commits with its root, held against the ledger on a real EVM: the range
tree the ledger computes on submission is the one the node builds its proofs from (for 1 to 9
workers), every worker of an honest tree is paid its span exactly once, spans out of worker order
are refused, and what a data node can still do with spans that disagree with a valid tree."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from eth_utils.crypto import keccak
from web3.logs import DISCARD

from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import CertificateTree, ranges_tree, tree_of_hops
from gwtf.contracts.encoding import CertifiedHop, CertRef, WorkerSpan
from gwtf.contracts.rewards import pay_wei
from tests.contracts.conftest import Staffed
from tests.contracts.world import HOP_PRICE, UNITS_PER_HOP, NodeKey, World, reverts

MAX_WORKERS = 9


def _hops(workers: list[NodeKey]) -> list[CertifiedHop]:
    """A tree laid out as an honest data node lays it out: workers by address, worker k with
    1 + k % 3 leaves alternating forward (100 units) and backward (200 units)."""
    hops: list[CertifiedHop] = []
    running = 0
    for k, worker in enumerate(sorted(workers, key=lambda key: int(key.address, 16))):
        for j in range(1 + k % 3):
            units = UNITS_PER_HOP * (1 + (j + k) % 2)
            hops.append(
                CertifiedHop(
                    len(hops), running, worker.address, units, os.urandom(32), os.urandom(32),
                    os.urandom(32),
                )
            )  # fmt: skip
            running += units
    return hops


def _claim(w: World, cert: CertRef, tree: CertificateTree, worker: NodeKey, wallet: str) -> int:
    receipt = w.claim(cert, tree, worker, wallet)
    (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
    return int(event["args"]["amountWei"])


def test_the_ledgers_range_tree_is_the_nodes_for_1_to_9_workers(world: World) -> None:
    """Nine data nodes certify epoch 0, the n-th for n workers: each ranges root the ledger
    computes is ``ranges_tree``'s, each worker claims its span with the node's own proofs and is
    paid its units, and the epoch's reservation is paid out to the wei."""
    w = world
    workers = [w.register(f"span worker {k}", w.wallet(k % 4)) for k in range(MAX_WORKERS)]
    datas = [w.register(f"span data {n}", w.sponsor) for n in range(1, MAX_WORKERS + 1)]
    run = w.open_run()
    for data in datas:
        w.add_data_node(run, data)
    for k, worker in enumerate(workers):
        w.join(run, worker, w.wallet(k % 4))
    w.to_submission(run, 0)
    certified = []
    for n, data in enumerate(datas, start=1):
        tree = w.dishonest_tree(_hops(workers[:n]))  # laid out honestly, receipts made up
        assert tree.spans is not None and len(tree.spans) == n
        cert = tree.cert_ref(run, 0, data.address)
        receipt = w.submit(cert, spans=tree.spans)
        (event,) = w.ledger.events.CertificatesSubmitted().process_receipt(receipt, errors=DISCARD)
        assert bytes(event["args"]["rangesRoot"]) == ranges_tree(tree.spans).root
        certified.append((cert, tree, n))
    reserved = int(w.call(w.ledger.functions.epochBook(run, 0))[0])
    w.to_settled(run, 0)
    paid = 0
    for cert, tree, n in certified:
        for k, worker in enumerate(workers[:n]):
            span = tree.worker_range(worker.address)
            assert span is not None
            amount = _claim(w, cert, tree, worker, w.wallet(k % 4))
            assert amount == pay_wei(span.units, HOP_PRICE, UNITS_PER_HOP)
            paid += amount
            if paid == reserved:  # the last claim closes the epoch
                break
            reverts(
                w, w.claim_fn(cert, tree, worker), w.wallet(k % 4),
                "AlreadyClaimed", run, 0, cert.dataNode, worker.address,
            )  # fmt: skip
    assert paid == reserved
    assert w.call(w.ledger.functions.epochBook(run, 0))[-1]  # closed by the last claim
    assert w.call(w.ledger.functions.burnedWei()) == 0


def test_spans_out_of_worker_order_are_refused(staffed: Staffed) -> None:
    """Spans must name strictly increasing workers: the same partition in another order, or one
    worker twice, is refused where it breaks the order."""
    s = staffed
    w = s.w
    tree = w.dishonest_tree(_hops([s.a, s.b, s.c]))
    assert tree.spans is not None and len(tree.spans) == 3
    cert = tree.cert_ref(s.run, 0, s.data.address)
    w.to_submission(s.run, 0)
    swapped = list(tree.spans)
    swapped[1] = replace(swapped[1], worker=tree.spans[2].worker)
    swapped[2] = replace(swapped[2], worker=tree.spans[1].worker)
    reverts(w, w.submit_fn(cert, swapped), w.sponsor, "BadSpans", 2)
    twice = [*tree.spans[:2], replace(tree.spans[2], worker=tree.spans[1].worker)]
    reverts(w, w.submit_fn(cert, twice), w.sponsor, "BadSpans", 2)
    zero = [WorkerSpan("0x" + "00" * 20, tree.spans[0].lastIndex, tree.spans[0].unitsEnd)]
    reverts(w, w.submit_fn(cert, [*zero, *tree.spans[1:]]), w.sponsor, "BadSpans", 0)


@pytest.mark.xfail(
    strict=True,
    raises=ContractRevert,  # NotWorkersRange: b's span starts at a's leaf
    reason="spans that disagree with a valid tree are not provable: Disputes has no span fraud",
)
def test_spans_shifted_off_a_valid_tree_cannot_cost_an_honest_worker_its_pay(
    staffed: Staffed,
) -> None:
    """The data node publishes a valid tree of a's and b's hops but commits spans that move the
    boundary one leaf into a's range: every leaf is valid, so no fraud proof lands and auditors
    find nothing, yet b's span starts at a's leaf and b can never claim. An honest worker in a
    valid tree must be paid (or the data node be convicted of the spans before settlement)."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    honest = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2)))
    assert honest.spans is not None and len(honest.spans) == 2
    first, second = honest.spans
    moved = first.lastIndex - 1  # a's last leaf goes to b's span
    shifted = (
        replace(first, lastIndex=moved, unitsEnd=honest.hops[moved].unitsBefore
                + honest.hops[moved].units),
        second,
    )  # fmt: skip
    tree = tree_of_hops(honest.hops, shifted)
    assert tree.root == honest.root  # the same valid tree
    cert = tree.cert_ref(run, 0, data.address)
    w.to_submission(run, 0)
    w.submit(cert, spans=shifted)
    w.to_settled(run, 0)
    assert _claim(w, cert, tree, a, w.wallet(0)) > 0  # a is paid for all but one leaf
    expected = pay_wei(honest.worker_range(b.address).units, HOP_PRICE, UNITS_PER_HOP)  # type: ignore[union-attr]
    assert _claim(w, cert, tree, b, w.wallet(1)) == expected


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,  # x is paid a's and b's units
    reason="the data node writes the spans too: a colluder's span over a withheld tree takes all",
)
def test_a_colluders_span_over_a_withheld_tree_cannot_take_the_honest_relays_units(
    staffed: Staffed,
) -> None:
    """Attack 23 with the spans the attacker would commit: the data node certifies a's and b's
    two microbatches and one hop of its colluder x, but its withheld tree puts x's leaves at
    both ends and its one span gives x every leaf and unit. The spans partition the
    certificate, so the ledger takes them; the tree is published only once the epoch settled
    (no proof can land), and x's claim takes the whole reservation back for the sponsor while
    a and b, whose hops the certificate's count and units include, are paid nothing."""
    s = staffed
    w, run, data, a, b = s.w, s.run, s.data, s.a, s.b
    x = w.register("colluder x", w.accomplice)
    w.join(run, x, w.accomplice)
    entries = w.pipeline_hops(run, 0, data, [a, b], range(2))
    entries.append(w.signed(w.receipt(run, 0, data, x, data, 100), x, data))
    honest = w.certificate_tree(entries)
    xs = [hop for hop in honest.hops if hop.worker == x.address]
    others = [hop for hop in honest.hops if hop.worker != x.address]
    layout = [xs[0], *others[1:], replace(xs[0], hopKey=keccak(text="x again"))]
    hops, running = [], 0
    for index, hop in enumerate(layout):
        hops.append(replace(hop, index=index, unitsBefore=running))
        running += hop.units
    # Same count as the honest tree; units differ only by the leaf swapped for x's copy.
    grab = (WorkerSpan(x.address, len(hops) - 1, running),)
    tree = tree_of_hops(hops, grab)
    cert = tree.cert_ref(run, 0, data.address)
    assert cert.count == honest.count
    w.to_submission(run, 0)
    w.submit(cert, spans=grab)
    w.to_settled(run, 0)  # the tree is published only now
    taken = _claim(w, cert, tree, x, w.accomplice)
    assert taken <= HOP_PRICE, f"x took {taken} wei for its one forward hop"
