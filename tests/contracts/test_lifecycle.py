"""The whole story of one run on chain: register, open, name the data node, join, certify an
epoch's hops, settle, claim, unstake, withdraw, close and refund; every wei accounted for."""

from __future__ import annotations

from tests.contracts.conftest import Certified
from tests.contracts.world import ETH, HOP_PRICE, UNITS_PER_HOP, reverts

# What the tree's 2,400 units reserve at the run's price: 8 forwards and 8 backwards.
RESERVED = (8 + 2 * 8) * HOP_PRICE


def test_an_epoch_is_certified_settled_and_paid_to_the_wei(certified: Certified) -> None:
    w, run, tree, cert = certified.w, certified.run, certified.tree, certified.cert
    # 4 microbatches x 2 stages x (forward + backward): a and b each did 8 hops of 3 units.
    assert tree.count == 16
    assert tree.units == 16 * 3 * UNITS_PER_HOP // 2
    assert w.call(w.ledger.functions.certificateCommitment(run, 0, certified.data.address)) == (
        cert.commitment()
    )
    book = w.call(w.ledger.functions.epochBook(run, 0))
    assert book[0] == RESERVED and book[1] == tree.units and book[2] is True
    w.to_settled(run, 0)
    paid = {}
    for key, wallet in ((certified.a, w.wallet(0)), (certified.b, w.wallet(1))):
        before = w.balance(wallet)
        receipt = w.claim(cert, tree, key, wallet)
        gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
        paid[key.address] = w.balance(wallet) - before + gas
    # Each hop earns the run's price: 4 forwards and 4 backwards each; together exactly what
    # the certificate reserved, nothing left.
    assert paid[certified.a.address] == paid[certified.b.address] == 12 * HOP_PRICE
    book = w.call(w.ledger.functions.epochBook(run, 0))
    assert book[3] == tree.units and book[4] == RESERVED
    assert w.call(w.ledger.functions.getRun(run))[5] == 10 * ETH - RESERVED


def test_a_worker_without_hops_in_the_tree_has_nothing_to_claim(certified: Certified) -> None:
    assert certified.tree.worker_range(certified.c.address) is None


def test_stake_unlocks_after_the_delay_and_a_closed_run_refunds_the_rest(
    certified: Certified,
) -> None:
    w, run, a = certified.w, certified.run, certified.a
    w.tx(w.registry.functions.requestUnstake(a.address), w.wallet(0))
    unlock_at = w.call(w.registry.functions.unlockAt(a.address))
    reverts(
        w, w.registry.functions.withdrawStake(a.address), w.wallet(0), "StakeStillLocked",
        a.address, unlock_at, w.now() + 1,
    )  # fmt: skip
    w.travel_to(unlock_at)
    before = w.balance(w.wallet(0))
    receipt = w.tx(w.registry.functions.withdrawStake(a.address), w.wallet(0))
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(w.wallet(0)) - before + gas == 2 * ETH
    # The sponsor closes the run and takes back what no epoch reserved.
    w.tx(w.ledger.functions.closeRun(run), w.sponsor)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(run)), w.now() + 1))
    before = w.balance(w.sponsor)
    receipt = w.tx(w.ledger.functions.withdrawRefund(run), w.sponsor)
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(w.sponsor) - before + gas == 10 * ETH - RESERVED


def test_the_contracts_hold_exactly_the_stakes_funds_and_reserved_budgets(
    certified: Certified,
) -> None:
    w = certified.w
    staked = w.call(w.registry.functions.totalStakedWei())
    assert w.balance(w.registry.address) == staked == (2 + 2 + 4 + 2) * ETH
    assert w.balance(w.ledger.address) == 10 * ETH  # available + reserved
    assert w.balance(w.disputes.address) == 0
