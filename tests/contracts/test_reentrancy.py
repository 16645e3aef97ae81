"""The four payments to an account (withdrawStake, claimReward, withdrawRefund and
Disputes.withdrawCredit) against a contract wallet that attacks them
(``gwtf/contracts/test/ReentrantWallet.sol``): re-entering from the payment's receive hook is
refused and nothing is paid twice; a wallet that rejects ETH makes the payment revert with
TransferFailed, loses nothing and is paid in full once it accepts again."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from eth_tester.exceptions import TransactionFailed

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert, all_errors_abi, decode_revert, deploy_contract
from gwtf.contracts.encoding import sign_binding
from tests.contracts.world import ETH, HOP_PRICE, World, default_capacity

UNBONDING, WITHDRAWN = 2, 3
BOUNTY_BPS = 500


def decode(data: bytes) -> tuple[str, tuple[Any, ...]]:
    revert = decode_revert(TransactionFailed(bytes(data)), all_errors_abi())
    return revert.name, revert.args


@dataclass(frozen=True)
class Attacker:
    """A ReentrantWallet owned (and driven) by the world's attacker account."""

    w: World
    wallet: Any

    @classmethod
    def deploy(cls, w: World) -> Attacker:
        return cls(w, deploy_contract(w.w3, "ReentrantWallet", w.attacker))

    @property
    def address(self) -> str:
        return str(self.wallet.address)

    def execute(self, target: Any, function: str, *args: Any, value: int = 0) -> None:
        data = target.encode_abi(function, args=list(args))
        self.w.tx(self.wallet.functions.execute(target.address, data), self.w.attacker, value)

    def forward_fails(self, target: Any, function: str, *args: Any) -> tuple[str, tuple[Any, ...]]:
        """The target's own revert of a forwarded call (the wallet wraps it in ForwardFailed)."""
        with pytest.raises(ContractRevert) as excinfo:
            self.execute(target, function, *args)
        assert excinfo.value.name == "ForwardFailed"
        return decode(excinfo.value.args[0])

    def arm(self, target: Any, function: str, *args: Any) -> None:
        data = target.encode_abi(function, args=list(args))
        self.w.tx(self.wallet.functions.arm(target.address, data), self.w.attacker)

    def reject(self, rejecting: bool) -> None:
        self.w.tx(self.wallet.functions.setRejecting(rejecting), self.w.attacker)

    def counters(self) -> tuple[int, int, int]:
        """(payments received, re-entries attempted, re-entries that succeeded)."""
        f = self.wallet.functions
        return (
            f.paymentsReceived().call(),
            f.reentryAttempts().call(),
            f.reentrySuccesses().call(),
        )

    def last_reentry_revert(self) -> tuple[str, tuple[Any, ...]]:
        return decode(self.wallet.functions.lastReentryRevert().call())


# ---------------------------------------------------------------- the four payments


@dataclass(frozen=True)
class Setup:
    """An attacker owed ``amount`` by ``payer`` through ``function(*args)``."""

    attacker: Attacker
    payer: Any
    function: str
    args: tuple[Any, ...]
    amount: int
    records: Callable[[], tuple[Any, ...]]  # the payer's records of what it owes
    again: tuple[str, tuple[Any, ...]]  # the payer's answer to a second withdrawal


def owed_stake(w: World) -> Setup:
    """The attacker's node unbonded; its 2 ETH stake has unlocked."""
    attacker = Attacker.deploy(w)
    key = w.key("evil")
    signature = sign_binding(attacker.address, key.private_key, w.registry_domain)
    attacker.execute(
        w.registry, "registerNode", key.public_key, default_capacity(), signature, value=2 * ETH
    )
    attacker.execute(w.registry, "requestUnstake", key.address)
    w.travel_to(w.call(w.registry.functions.unlockAt(key.address)))
    registry = w.registry.functions

    def records() -> tuple[Any, ...]:
        return (
            tuple(w.call(registry.bondOf(key.address))),
            w.call(registry.totalStakedWei()),
            w.balance(w.registry.address),
        )

    again = ("NodeNotUnbonding", (key.address, WITHDRAWN))
    return Setup(attacker, w.registry, "withdrawStake", (key.address,), 2 * ETH, records, again)


def owed_reward(w: World) -> Setup:
    """The attacker's node worked stage 1 of a settled epoch, half of its units."""
    attacker = Attacker.deploy(w)
    key = w.key("evil")
    signature = sign_binding(attacker.address, key.private_key, w.registry_domain)
    attacker.execute(
        w.registry, "registerNode", key.public_key, default_capacity(), signature, value=2 * ETH
    )
    data = w.register("data", w.sponsor)
    peer = w.register("peer", w.wallet(0))
    run = w.open_run()
    w.add_data_node(run, data)
    attacker.execute(w.ledger, "joinRun", run, key.address)
    w.join(run, peer, w.wallet(0))
    tree = w.certificate_tree(w.pipeline_hops(run, 0, data, [key, peer], range(2)))
    cert = w.certify(tree, run, 0, data)
    w.to_settled(run, 0)
    span = tree.worker_range(key.address)
    assert span is not None and 2 * span.units == tree.units
    ledger = w.ledger.functions

    def records() -> tuple[Any, ...]:
        return (
            w.call(ledger.isClaimed(run, 0, data.address, key.address)),
            tuple(w.call(ledger.epochBook(run, 0))),
            w.call(ledger.getRun(run))[5],
            w.balance(w.ledger.address),
        )

    again = ("AlreadyClaimed", (run, 0, data.address, key.address))
    args = span.claim_args(cert)
    # 2 forwards and 2 backwards at the run's price.
    return Setup(attacker, w.ledger, "claimReward", args, 6 * HOP_PRICE, records, again)


def owed_refund(w: World) -> Setup:
    """The attacker sponsored a run of 5 ETH, closed it and may take the funds back."""
    attacker = Attacker.deploy(w)
    attacker.execute(w.ledger, "openRun", w.run_config(), value=5 * ETH)
    run = w.call(w.ledger.functions.runCount())
    attacker.execute(w.ledger, "closeRun", run)
    w.travel_to(w.call(w.ledger.functions.refundableAt(run)))

    def records() -> tuple[Any, ...]:
        return w.call(w.ledger.functions.getRun(run))[5], w.balance(w.ledger.address)

    again = ("NothingToWithdraw", (attacker.address,))
    return Setup(attacker, w.ledger, "withdrawRefund", (run,), 5 * ETH, records, again)


def owed_bounty(w: World) -> Setup:
    """The attacker proved that node c (2 ETH) equivocated: its bounty is 5 % of the stake."""
    attacker = Attacker.deploy(w)
    c, peer, data = w.register("c", w.wallet(2)), w.key("peer"), w.key("data")
    run = w.open_run()
    first = w.receipt(run, 0, data, c, peer, 0)
    second = w.receipt(run, 0, data, c, peer, 0, inputDigest=b"\x02" * 32)
    proof = fraud_proofs.equivocation(
        c.address,
        first,
        w.signed(first, c, peer).worker_signature,
        second,
        w.signed(second, c, peer).worker_signature,
    )
    salt = os.urandom(32)
    commitment = fraud_proofs.commitment_of(attacker.address, salt, proof.proof_hash)
    attacker.execute(w.disputes, "commit", commitment)
    w.mine()
    attacker.execute(w.disputes, proof.function, *proof.args, salt)
    w.award(c.address)
    bounty = 2 * ETH * BOUNTY_BPS // 10_000
    assert w.call(w.disputes.functions.creditWei(attacker.address)) == bounty

    def records() -> tuple[Any, ...]:
        return (
            w.call(w.disputes.functions.creditWei(attacker.address)),
            w.call(w.disputes.functions.burnedWei()),
            w.balance(w.disputes.address),
        )

    again = ("NothingToWithdraw", (attacker.address,))
    return Setup(attacker, w.disputes, "withdrawCredit", (), bounty, records, again)


PAYMENTS: dict[str, Callable[[World], Setup]] = {
    "withdrawStake": owed_stake,
    "claimReward": owed_reward,
    "withdrawRefund": owed_refund,
    "withdrawCredit": owed_bounty,
}


@pytest.fixture(params=list(PAYMENTS))
def owed(request: pytest.FixtureRequest, world: World) -> Setup:
    build = PAYMENTS[request.param]
    setup: Setup = world.scenario(f"reentrancy:{request.param}", lambda: build(world))
    return setup


def test_reentering_the_payment_is_refused_and_pays_once(world: World, owed: Setup) -> None:
    w, attacker = world, owed.attacker
    payer_before = w.balance(owed.payer.address)
    attacker.arm(owed.payer, owed.function, *owed.args)
    attacker.execute(owed.payer, owed.function, *owed.args)
    assert attacker.counters() == (1, 1, 0)
    assert attacker.last_reentry_revert() == ("ReentrancyGuardReentrantCall", ())
    assert w.balance(attacker.address) == owed.amount
    assert w.balance(owed.payer.address) == payer_before - owed.amount
    # And after it, the debt is settled: a second withdrawal finds nothing.
    assert attacker.forward_fails(owed.payer, owed.function, *owed.args) == owed.again
    assert w.balance(attacker.address) == owed.amount


def test_a_wallet_that_rejects_ether_loses_nothing_and_can_retry(world: World, owed: Setup) -> None:
    w, attacker = world, owed.attacker
    records = owed.records()
    attacker.reject(True)
    refused = attacker.forward_fails(owed.payer, owed.function, *owed.args)
    assert refused == ("TransferFailed", (attacker.address, owed.amount))
    assert owed.records() == records
    assert w.balance(attacker.address) == 0
    attacker.reject(False)
    attacker.execute(owed.payer, owed.function, *owed.args)
    assert w.balance(attacker.address) == owed.amount
    assert attacker.counters() == (1, 0, 0)
    assert owed.records() != records


def test_the_stake_is_marked_withdrawn_before_it_is_sent(world: World) -> None:
    """Checks-effects-interactions, seen from the receive hook: re-entering an unguarded
    function of the registry (addStake) finds the node already withdrawn."""
    w = world
    owed = w.scenario("reentrancy:withdrawStake", lambda: owed_stake(w))
    attacker, node = owed.attacker, owed.args[0]
    attacker.arm(w.registry, "addStake", node)
    attacker.execute(w.registry, "withdrawStake", node)
    assert attacker.counters() == (1, 1, 0)
    assert attacker.last_reentry_revert() == ("NodeNotActive", (node, WITHDRAWN))
    assert w.balance(attacker.address) == 2 * ETH
    assert w.call(w.registry.functions.totalStakedWei()) == w.balance(w.registry.address)


def test_a_claim_reentered_into_another_guarded_ledger_function_is_refused(world: World) -> None:
    """The ledger's guard spans its functions: from the reward's payment, the refund of a run
    the attacker sponsors is refused too."""
    w = world
    owed = w.scenario("reentrancy:claimReward", lambda: owed_reward(w))
    attacker = owed.attacker
    attacker.execute(w.ledger, "openRun", w.run_config(), value=ETH)
    run = w.call(w.ledger.functions.runCount())
    attacker.execute(w.ledger, "closeRun", run)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(run)), w.now() + 1))
    attacker.arm(w.ledger, "withdrawRefund", run)
    attacker.execute(w.ledger, owed.function, *owed.args)
    assert attacker.counters() == (1, 1, 0)
    assert attacker.last_reentry_revert() == ("ReentrancyGuardReentrantCall", ())
    assert w.balance(attacker.address) == owed.amount
    # Outside the payment the refund goes through.
    attacker.execute(w.ledger, "withdrawRefund", run)
    assert w.balance(attacker.address) == owed.amount + ETH
