"""The batch leaf hasher agrees byte for byte with the reference encoding and the contract tree."""

from __future__ import annotations

from eth_account import Account
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.encoding import HopReceipt, ledger_domain, receipt_leaf, scheduled_units
from contracts.epoch_tree import SignedReceipt, build_epoch_tree
from contracts.merkle import build_tree
from node.receipt_leaves import honest_prefix_sums, receipt_leaves

WORKER = Account.create()
COUNTERPARTY = Account.create()

receipts = st.builds(
    HopReceipt,
    runId=st.integers(0, 2**256 - 1),
    epoch=st.integers(0, 2**64 - 1),
    iteration=st.integers(0, 2**64 - 1),
    microbatchId=st.integers(0, 2**64 - 1),
    stage=st.integers(0, 2**16 - 1),
    direction=st.sampled_from([0, 1]),
    attempt=st.integers(0, 2**16 - 1),
    worker=st.sampled_from([WORKER.address, COUNTERPARTY.address.lower()]),
    counterparty=st.sampled_from([COUNTERPARTY.address, "0x" + "00" * 20]),
    inputDigest=st.binary(min_size=32, max_size=32),
    outputDigest=st.binary(min_size=32, max_size=32),
    units=st.integers(0, 2**40),
)


@settings(max_examples=40, deadline=None)
@given(
    entries=st.lists(
        st.tuples(receipts, st.binary(min_size=65, max_size=65)), min_size=1, max_size=6
    ),
    chain_id=st.integers(1, 2**64),
)
def test_batch_leaves_equal_the_reference(
    entries: list[tuple[HopReceipt, bytes]], chain_id: int
) -> None:
    domain = ledger_domain(chain_id, "0x" + "ab" * 20)
    signed = [SignedReceipt(receipt, signature) for receipt, signature in entries]
    before = honest_prefix_sums(signed)
    expected = [
        receipt_leaf(s.receipt, domain, i, b, s.counterparty_signature)
        for i, (s, b) in enumerate(zip(signed, before, strict=True))
    ]
    assert receipt_leaves(signed, domain, before) == expected


def test_batch_root_equals_the_epoch_tree_root() -> None:
    domain = ledger_domain(1, "0x" + "cd" * 20)
    signed = [
        SignedReceipt(
            HopReceipt(7, 0, i // 4, i, i % 2, i % 2, 0, WORKER.address, COUNTERPARTY.address,
                       bytes([i]) * 32, bytes([i + 1]) * 32, scheduled_units(i % 2, 10)),
            bytes([i]) * 65,
        )
        for i in range(9)
    ]  # fmt: skip
    leaves = receipt_leaves(signed, domain, honest_prefix_sums(signed))
    assert build_tree(leaves).root == build_epoch_tree(signed, domain).root
    assert honest_prefix_sums(signed)[-1] + signed[-1].receipt.units == (
        build_epoch_tree(signed, domain).units
    )
