"""Which receipts an honest data node certifies (``gwtf/node/receipts/certify.py``): the hops
chained to its own sends, once per computation, and reports that check out."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_utils.crypto import keccak

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    HopReceipt,
    ledger_domain,
    scheduled_units,
    sign_receipt,
)
from gwtf.errors import ProtocolError
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.certify import MAX_PER_HOP, Anchor, certifiable, check_report

DOMAIN = ledger_domain(1, "0x" + "cd" * 20)
TERMS = ReceiptTerms(run_id=3, domain=DOMAIN, stages=2, units_per_hop=10)
NAMES = ("data", "a", "b", "x", "y", "p", "q", "r")
KEYS = {name: keccak(text=f"certify test {name}") for name in NAMES}
ADDRESS = {name: Account.from_key(key).address for name, key in KEYS.items()}


def digest(label: str) -> bytes:
    return keccak(text=label)


def hop(
    worker: str,
    counterparty: str,
    stage: int,
    direction: int,
    inp: str,
    out: str,
    *,
    microbatch: int = 0,
    attempt: int = 0,
) -> PreparedHop:
    receipt = HopReceipt(
        3, 0, ADDRESS["data"], 0, microbatch, stage, direction, attempt, ADDRESS[worker],
        ADDRESS[counterparty], digest(inp), digest(out), scheduled_units(direction, 10),
    )  # fmt: skip
    signed = SignedReceipt(
        receipt,
        sign_receipt(receipt, DOMAIN, KEYS[worker]),
        sign_receipt(receipt, DOMAIN, KEYS[counterparty]),
    )
    return PreparedHop.of(signed, DOMAIN)


def anchors(microbatch: int = 0) -> list[Anchor]:
    return [
        Anchor(0, microbatch, FORWARD, digest(f"embed {microbatch}")),
        Anchor(0, microbatch, BACKWARD, digest(f"loss grad {microbatch}")),
    ]


def pipeline(microbatch: int = 0) -> list[PreparedHop]:
    """Microbatch ``microbatch`` through a (stage 1) and b (stage 2), every digest chained."""
    m = microbatch
    return [
        hop("a", "b", 1, FORWARD, f"embed {m}", f"act1 {m}", microbatch=m),
        hop("b", "data", 2, FORWARD, f"act1 {m}", f"act2 {m}", microbatch=m),
        hop("b", "a", 2, BACKWARD, f"loss grad {m}", f"grad2 {m}", microbatch=m),
        hop("a", "data", 1, BACKWARD, f"grad2 {m}", f"grad1 {m}", microbatch=m),
    ]


def keys_of(entries: list[PreparedHop]) -> set[tuple[str, int, int, int]]:
    receipts = [p.entry.receipt for p in entries]
    return {(r.worker, r.stage, r.direction, r.attempt) for r in receipts}


def test_every_hop_of_a_microbatch_chained_to_the_data_nodes_sends_is_certified() -> None:
    entries = pipeline(0) + pipeline(1)
    assert len(certifiable(entries, anchors(0) + anchors(1), stages=2)) == 8


def test_hops_chained_to_nothing_the_data_node_sent_are_not_certified() -> None:
    made_up = [
        # An accomplice pair's hop of a microbatch from an input nobody sent.
        hop("x", "y", 1, FORWARD, "invented", "act1 0"),
        # A backward from a gradient the data node never sent.
        hop("x", "y", 2, BACKWARD, "invented grad", "grad2 0"),
    ]
    chosen = certifiable(pipeline(0) + made_up, anchors(0), stages=2)
    assert keys_of(chosen) == keys_of(pipeline(0))
    assert certifiable(pipeline(0), [], stages=2) == [], "without anchors nothing is chained"
    # A hop after a broken link is not chained either, even if its own input matches: without
    # stage 1's forward, stage 2's is not; the backwards start from the data node's gradient.
    no_stage_1 = pipeline(0)[1:]
    chosen = certifiable(no_stage_1, anchors(0), stages=2)
    assert keys_of(chosen) == {(ADDRESS["b"], 2, BACKWARD, 0), (ADDRESS["a"], 1, BACKWARD, 0)}


def test_the_acknowledged_hop_of_an_attempt_lost_to_a_crash_is_certified() -> None:
    # a's forward reached x, which acknowledged it and died; b then computed it from a's
    # output sent again (attempt 1). Both of a's receivers' work is real; x's onward hop never
    # happened, so x has nothing here, but a's first acknowledged forward is paid.
    lost = hop("a", "x", 1, FORWARD, "embed 0", "act1 0", attempt=0)
    again = hop("a", "b", 1, FORWARD, "embed 0", "act1 0", attempt=1)
    entries = [lost, again, *pipeline(0)[1:]]
    chosen = certifiable(entries, anchors(0), stages=2)
    # One computation of a from one input: paid once, under the receipt on the path the data
    # node received (b countersigned it), whose output b's hop goes on from.
    assert (ADDRESS["a"], 1, FORWARD, 1) in keys_of(chosen)
    assert (ADDRESS["a"], 1, FORWARD, 0) not in keys_of(chosen)
    assert len(chosen) == 4
    # Off the path, it is paid under its lowest attempt.
    chosen = certifiable([lost, again, *pipeline(0)[2:]], anchors(0), stages=2)
    assert (ADDRESS["a"], 1, FORWARD, 0) in keys_of(chosen)
    assert (ADDRESS["a"], 1, FORWARD, 1) not in keys_of(chosen)


def test_a_stand_ins_kept_forward_and_its_gradient_are_certified_and_a_fake_repair_is_not() -> None:
    # b acknowledged the gradient and died; a re-sent its forward output to the stand-in x
    # (attempt 1, receipted by a again) and x kept what it computed: x signed that receipt in
    # its ack and a countersigned it (x's counterparty is the node its input came from). Then
    # the gradient went to x, which sent its own on to a.
    m = pipeline(0)
    resent = hop("a", "x", 1, FORWARD, "embed 0", "act1 0", attempt=1)
    kept = hop("x", "a", 2, FORWARD, "act1 0", "act2 0", attempt=1)
    stand_in = hop("x", "a", 2, BACKWARD, "loss grad 0", "grad2 0", attempt=1)
    again = hop("a", "data", 1, BACKWARD, "grad2 0", "grad1 0", attempt=1)
    chosen = certifiable([*m[:3], resent, kept, stand_in, again], anchors(0), stages=2)
    assert (ADDRESS["x"], 2, FORWARD, 1) in keys_of(chosen), "the stand-in's forward is paid"
    assert (ADDRESS["x"], 2, BACKWARD, 1) in keys_of(chosen), "and its gradient"
    # a's forward and a's backward (from one gradient) are one computation each: paid once.
    assert (ADDRESS["a"], 1, FORWARD, 1) not in keys_of(chosen)
    assert len(chosen) == 6
    # b "repairing" its own forward again is the same computation: nothing more. A "repair"
    # from a frame no chained hop output is chained to nothing.
    twice = hop("b", "a", 2, FORWARD, "act1 0", "act2 0", attempt=2)
    fake = hop("y", "a", 2, FORWARD, "act1 forged", "act2 0", attempt=3)
    assert keys_of(certifiable([*m, twice, fake], anchors(0), stages=2)) == keys_of(m)


def test_a_chain_forked_to_accomplices_is_bounded_per_hop() -> None:
    # x received a's output and "sent" its own to many receivers: only one per (worker,
    # input) counts, and at most MAX_PER_HOP receipts per (microbatch, stage, direction).
    workers = ["a", "x", "b", "p", "q", "r", "a", "x"]
    forks = [
        hop(w, "y", 1, FORWARD, "embed 0", f"act fork {i}", attempt=i)
        for i, w in enumerate(workers)
    ]
    chosen = certifiable(forks, anchors(0), stages=2)
    assert len(chosen) == MAX_PER_HOP < len(set(workers))
    assert [p.entry.receipt.attempt for p in chosen] == list(range(MAX_PER_HOP)), "lowest first"


def test_kept_receipts_never_push_the_paths_own_hop_out_at_the_cap() -> None:
    # b carried the microbatch on (its first receiver died: a re-sent to it, attempt 1); off-
    # path relays each got a "repair" re-sent to them at attempt 0 and kept what they computed.
    # At the cap the path's own hop comes first, whatever its attempt.
    m = pipeline(0)
    own = hop("b", "data", 2, FORWARD, "act1 0", "act2 0", attempt=1)
    sybils = [hop(w, "a", 2, FORWARD, "act1 0", f"act2 {w}") for w in ("p", "q", "r", "x", "y")]
    chosen = certifiable([m[0], own, *sybils, *m[2:]], anchors(0), stages=2)
    at_stage_2 = [p.entry.receipt for p in chosen if p.entry.receipt.stage == 2]
    forwards = [r.worker for r in at_stage_2 if r.direction == FORWARD]
    assert len(forwards) == MAX_PER_HOP and forwards[0] == ADDRESS["b"]
    # The redone gradient at the last stage (its counterparty the data node) ranks after b's.
    redo = [hop(w, "data", 2, BACKWARD, "loss grad 0", f"g {w}") for w in ("p", "q", "r", "x")]
    chosen = certifiable([*m[:2], *redo, m[2], m[3]], anchors(0), stages=2)
    backwards = [p.entry.receipt.worker for p in chosen if p.entry.receipt.stage == 2]
    assert ADDRESS["b"] in backwards


def test_a_report_must_be_the_reporters_own_receipt_for_this_data_node_and_run() -> None:
    prepared = pipeline(0)[0]
    good = prepared.entry
    assert check_report(good, TERMS, ADDRESS["data"], ADDRESS["a"]) == prepared
    receiver = good.receipt.counterparty  # the receiver keeps it too, and may report it
    assert check_report(good, TERMS, ADDRESS["data"], receiver) == prepared
    with pytest.raises(ProtocolError, match="reported by"):
        check_report(good, TERMS, ADDRESS["data"], ADDRESS["x"])
    with pytest.raises(ProtocolError, match="not this one"):
        check_report(good, TERMS, ADDRESS["x"], ADDRESS["a"])
    with pytest.raises(ProtocolError, match="not this one"):
        check_report(good, ReceiptTerms(4, DOMAIN, 2, 10), ADDRESS["data"], ADDRESS["a"])
    with pytest.raises(ProtocolError, match="schedule"):
        check_report(good, ReceiptTerms(3, DOMAIN, 2, 11), ADDRESS["data"], ADDRESS["a"])
    with pytest.raises(ProtocolError, match="relay stage"):
        check_report(good, ReceiptTerms(3, DOMAIN, 0, 10), ADDRESS["data"], ADDRESS["a"])
    forged = SignedReceipt(good.receipt, good.worker_signature, good.worker_signature)
    with pytest.raises(ProtocolError, match="countersignature"):
        check_report(forged, TERMS, ADDRESS["data"], ADDRESS["a"])


def test_colluders_chain_at_attempt_0_never_pushes_out_the_carrier_the_data_node_received() -> None:
    # a's first send went to x, which acknowledged it and "died"; a re-sent to b (attempt 1),
    # which carried the microbatch to the data node. x and its accomplices p, q, r compute
    # stage 2 honestly from a's chained output and countersign each other's attempt-0
    # receipts: hops sent on, at the lowest attempt. The data node countersigned b's forward
    # itself, so b's hop ranks first, and so does a's, which b countersigned.
    m = pipeline(0)
    lost = hop("a", "x", 1, FORWARD, "embed 0", "act1 0")
    again = hop("a", "b", 1, FORWARD, "embed 0", "act1 0", attempt=1)
    carried = hop("b", "data", 2, FORWARD, "act1 0", "act2 0", attempt=1)
    ring = ("x", "p", "q", "r")
    forks = [hop(w, ring[(i + 1) % 4], 2, FORWARD, "act1 0", "act2 0") for i, w in enumerate(ring)]
    chosen = certifiable([lost, again, carried, *forks, *m[2:]], anchors(0), stages=2)
    forwards = [p.entry.receipt for p in chosen if p.entry.receipt.direction == FORWARD]
    at_stage_2 = [r.worker for r in forwards if r.stage == 2]
    assert len(at_stage_2) == MAX_PER_HOP and at_stage_2[0] == ADDRESS["b"]
    # a's one computation is certified under the receipt on the data node's path.
    assert [(r.worker, r.attempt) for r in forwards if r.stage == 1] == [(ADDRESS["a"], 1)]


def test_the_path_the_data_node_saw_ranks_first_at_every_stage_and_both_directions() -> None:
    # Three relay stages, each carrier's hop after a repair (attempt 2 on); accomplices fork
    # every hop from its chained input at attempt 0, countersigning each other.
    names = {1: "a", 2: "b", 3: "y"}
    ring = ("p", "q", "r", "x")
    forward = {1: "embed 0", 2: "f1", 3: "f2", 4: "f3"}  # the input of stage k, and its output
    backward = {3: "loss grad 0", 2: "g3", 1: "g2", 0: "g1"}
    entries = []
    for k in (1, 2, 3):
        receiver = names.get(k + 1, "data")
        entries.append(hop(names[k], receiver, k, FORWARD, forward[k], forward[k + 1], attempt=2))
        back_to = names.get(k - 1, "data")
        entries.append(hop(names[k], back_to, k, BACKWARD, backward[k], backward[k - 1], attempt=3))
        for i, w in enumerate(ring):
            other = ring[(i + 1) % 4]
            entries.append(hop(w, other, k, FORWARD, forward[k], forward[k + 1]))
            entries.append(hop(w, other, k, BACKWARD, backward[k], backward[k - 1]))
    chosen = certifiable(entries, anchors(0), stages=3)
    for k in (1, 2, 3):
        for direction in (FORWARD, BACKWARD):
            at = [
                p.entry.receipt.worker
                for p in chosen
                if (p.entry.receipt.stage, p.entry.receipt.direction) == (k, direction)
            ]
            assert len(at) == MAX_PER_HOP and at[0] == ADDRESS[names[k]], (k, direction)


def test_a_backward_stand_ins_kept_forward_ranks_before_accomplices_forks() -> None:
    # b carried the forward and died holding the gradient; a re-sent its output to the stand-in
    # x (a repair, attempt 2), which kept its forward and then carried the backward the data
    # node received through a. Accomplices fork stage 2's forward at attempt 0: b's forward (on
    # the path the data node received) and x's kept one (which x's backward went through)
    # both rank before them.
    m = pipeline(0)
    kept = hop("x", "a", 2, FORWARD, "act1 0", "act2 0", attempt=2)
    stand_in = hop("x", "a", 2, BACKWARD, "loss grad 0", "grad2 0", attempt=2)
    forks = [hop(w, "y", 2, FORWARD, "act1 0", "act2 0") for w in ("p", "q", "r")]
    chosen = certifiable([*m[:2], kept, stand_in, *forks, m[3]], anchors(0), stages=2)
    at_stage_2 = [
        (p.entry.receipt.worker, p.entry.receipt.direction)
        for p in chosen
        if p.entry.receipt.stage == 2
    ]
    assert at_stage_2[:2] == [(ADDRESS["b"], FORWARD), (ADDRESS["x"], FORWARD)]
    assert (ADDRESS["x"], BACKWARD) in at_stage_2


def test_with_one_relay_stage_the_hop_the_data_node_received_ranks_first() -> None:
    carried = hop("a", "data", 1, FORWARD, "embed 0", "out 0", attempt=1)
    ring = ("p", "q", "r", "x")
    forks = [hop(w, ring[(i + 1) % 4], 1, FORWARD, "embed 0", "out 0") for i, w in enumerate(ring)]
    chosen = certifiable([*forks, carried], anchors(0), stages=1)
    assert len(chosen) == MAX_PER_HOP and chosen[0].entry.receipt.worker == ADDRESS["a"]
